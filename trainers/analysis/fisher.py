"""Fisher memory of a linear network with noise (Orhan & Pitkow 2020 §2.1 eq. 1–4, Fig. 1b–c; Ganguli et al. 2008).

    h_t = W h_{t−1} + v s_t + z_t,   z_t ~ N(0, I)                           (eq. 1)
    C   = Σ_{k≥0} Wᵏ (Wᵏ)ᵀ                  noise covariance of h_t
    J(k) = vᵀ (Wᵏ)ᵀ C⁻¹ Wᵏ v                 Fisher memory of s_{t−k}   (eq. 3)
    J_tot = Σ_{k≥0} J(k) = tr(C⁻¹ S),  S = Σ_{k≥0} Wᵏ v vᵀ (Wᵏ)ᵀ         (eq. 4)
    ‖Wᵏ v‖²                                  transient amplification    (Fig. 1c)

Both series Σ_k Wᵏ M (Wᵏ)ᵀ are summed by doubling (Smith's method): with A_j = W^(2^j),
    X_{j+1} = X_j + A_j X_j A_jᵀ,   A_{j+1} = A_j²,   X_j = Σ_{k < 2^j} Wᵏ M (Wᵏ)ᵀ.
The sum is exact once A_j = 0 (a nilpotent W: the chain, whose sums are finite, Wᴺ = 0), and otherwise
stops when ‖A_j‖_F² ≤ tol, which bounds the neglected tail A_j X_∞ A_jᵀ by tol·‖X_∞‖ (operator norm).
The series diverge exactly when ρ(W) ≥ 1 (a left eigenvector u of λ gives uᴴ C u = Σ_k |λ|^{2k} ‖u‖²);
then `DivergentSeriesError` says so.

The curve J(k) runs over k = 0..K−1, K the first k with Wᵏv = 0 (exact, e.g. K = N for the chain) or
with the remaining mass J_tot − Σ_{k<K} J(k) ≤ curve_tol·J_tot, capped at `max_horizon`; `tail` reports
that remainder. Expected values: a pure chain (W_ij = α δ_{j,i−1}, v = e₁) has C = diag(c_0..c_{N−1}),
c_i = Σ_{m≤i} α^{2m}, so J(k) = α^{2k} / c_k for k < N and 0 beyond; at α = 1 that is J(k) = 1/(k+1),
J_tot = H_N = Σ_{k=1}^{N} 1/k (the issue's 1/(k+1) holds for k < N only: the chain forgets after N steps).
Every normal W with ρ(W) < 1 and ‖v‖ = 1 has J_tot = 1 (Ganguli et al. 2008).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from trainers.analysis.henrici import spectral_radius

TOL = 1e-14  # ‖W^(2^j)‖_F² below which the series' tail is dropped (relative error ≤ TOL)
CURVE_TOL = 1e-9  # the J(k) curve stops once the rest of J_tot is below CURVE_TOL·J_tot
MAX_DOUBLINGS = 50  # 2^50 terms: a series not converged by then has ρ(W) ≥ 1 (or within 1e-13 of it)
MAX_HORIZON = 100_000
CHUNK = 512  # curve columns solved at once


class DivergentSeriesError(ValueError):
    """Σ_k Wᵏ M (Wᵏ)ᵀ does not converge (ρ(W) ≥ 1): the Fisher memory of eq. 3–4 is undefined."""


@dataclass(frozen=True)
class FisherMemory:
    j_tot: float  # Σ_{k≥0} J(k) = tr(C⁻¹ S) (eq. 4), the full series
    j: list[float]  # J(k), k = 0..K−1 (eq. 3)
    amplification: list[float]  # ‖Wᵏ v‖², k = 0..K−1 (Fig. 1c)
    tail: float  # J_tot − Σ_{k<K} J(k): the memory beyond the curve
    exact: bool  # W nilpotent: every sum is finite, nothing truncated
    terms: int  # terms of C's series summed (2^doublings; the chain needs N)
    tol: float  # relative truncation error bound of C and S (0 when exact)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def power_series(w: torch.Tensor, m: torch.Tensor, tol: float = TOL) -> tuple[torch.Tensor, int, bool]:
    """Σ_{k≥0} Wᵏ M (Wᵏ)ᵀ by doubling; returns (sum [N, N], terms summed, exact)."""
    a, x = w.to(torch.float64), m.to(torch.float64)  # A_0 = W, X_0 = M
    overflow = False
    for j in range(MAX_DOUBLINGS):
        x = x + a @ x @ a.T  # X_{j+1} = Σ_{k < 2^{j+1}} Wᵏ M (Wᵏ)ᵀ
        a = a @ a  # A_{j+1} = W^(2^{j+1})
        size = float(a.pow(2).sum().item())  # ‖A‖_F²
        if size == 0.0:
            return x, 2 ** (j + 1), True
        if size <= tol:
            return x, 2 ** (j + 1), False
        if not torch.isfinite(x).all() or size > 1e200:
            overflow = True
            break
    rho = spectral_radius(w)  # eigenvalues of a strongly non-normal W are inexact: a hint, not a verdict
    if overflow and rho < 1:
        raise DivergentSeriesError(
            f"Σ_k Wᵏ(Wᵏ)ᵀ overflows float64 (‖Wᵏ‖ grows past 1e100 before it decays, ρ(W) ≈ {rho:.6g}): "
            "use a smaller scale (e.g. a chain's α of a few units at most)"
        )
    raise DivergentSeriesError(
        f"Σ_k Wᵏ(Wᵏ)ᵀ does not converge: spectral radius ρ(W) ≈ {rho:.6g} (needs ρ < 1). The Fisher "
        "memory (eq. 3–4) is defined only for stable W: scale identity/orthogonal below 1 (e.g. λ = 0.99) "
        "and keep fbchain's 2√(αβ) < 1; chains are nilpotent and converge for any α."
    )


def fisher_memory(
    w: torch.Tensor,
    v: torch.Tensor,
    horizon: int | None = None,
    tol: float = TOL,
    curve_tol: float = CURVE_TOL,
    max_horizon: int = MAX_HORIZON,
) -> FisherMemory:
    """Fisher memory curve J(k), J_tot and ‖Wᵏv‖² of h_t = W h_{t−1} + v s_t + z_t (eq. 1, 3, 4).

    w [N, N] (W_ij from unit j to unit i), v [N]. `horizon` fixes the curve's length K; None picks it
    (see the module docstring). Raises DivergentSeriesError when ρ(W) ≥ 1.
    """
    w64, v64 = w.detach().to(torch.float64).cpu(), v.detach().to(torch.float64).cpu().reshape(-1)
    n = w64.shape[0]
    if horizon is not None and horizon < 1:
        raise ValueError(f"horizon = {horizon} must be at least 1 (or None to follow J_tot)")
    if w64.shape != (n, n) or v64.shape != (n,):
        raise ValueError(f"W must be [N, N] and v [N]; got {tuple(w.shape)} and {tuple(v.shape)}")
    c, terms, exact_c = power_series(w64, torch.eye(n, dtype=torch.float64), tol)  # C [N, N]
    s, _, exact_s = power_series(w64, torch.outer(v64, v64), tol)  # S [N, N]
    chol = torch.linalg.cholesky(c)  # C ⪰ I (its k = 0 term), so C is positive definite
    j_tot = float(torch.trace(torch.cholesky_solve(s, chol)).item())  # tr(C⁻¹ S) (eq. 4)

    limit = horizon if horizon is not None else max_horizon
    js: list[float] = []
    amps: list[float] = []
    u = v64  # Wᵏ v, k = 0
    done = 0.0
    while len(js) < limit:
        cols: list[torch.Tensor] = []  # the next chunk of Wᵏ v
        while len(cols) < min(CHUNK, limit - len(js)):
            cols.append(u)
            u = w64 @ u
        block = torch.stack(cols, 1)  # [N, chunk]
        jk = (block * torch.cholesky_solve(block, chol)).sum(0)  # J(k) = uᵀ C⁻¹ u (eq. 3)
        amp = block.pow(2).sum(0)  # ‖Wᵏ v‖²
        for a_k, j_k in zip(amp.tolist(), jk.tolist(), strict=True):
            if horizon is None and a_k == 0.0:  # Wᵏ v = 0: every later term vanishes too
                limit = len(js)
                break
            js.append(j_k)
            amps.append(a_k)
            done += j_k
            if horizon is None and j_tot - done <= curve_tol * j_tot:
                limit = len(js)
                break
    return FisherMemory(
        j_tot=j_tot,
        j=js,
        amplification=amps,
        tail=j_tot - done,
        exact=exact_c and exact_s,
        terms=terms,
        tol=0.0 if exact_c and exact_s else tol,
    )
