"""Linear decoding of a past signal from untrained networks (Orhan & Pitkow 2020 §2.2, Fig. 2, Appendix A, Figs. 7–8).

    h_t = f(W h_{t−1} + v s_t + z_t),   h_0 = 0,   s_t ~ N(0, 1) i.i.d.,   z_it ~ N(0, σ²) i.i.d.   (eq. 1, 5)

Appendix A: W at overall scale 1.01, v = e₁ (chain) or v_i ~ N(0, 1/√N) (orthogonal), 250 trials, and
"linearly regressing s_1 on h_100 (using the 250 simulated samples) and report the R² value": the paper's R²
is in-sample, on the very trials the decoder was fitted to. With N = 100 units and an intercept that is 101
coefficients for 250 samples, so in-sample R² is inflated (a decoder of pure noise scores ≈ 101/249 ≈ 0.4);
`r2_heldout` applies the same decoder to as many fresh trials of the same network, an unbiased estimate.
Fig. 2b / Fig. 7 are "linear + noise" (f = identity, σ ∈ {0.01, 0.1, 1}); Fig. 2c / Fig. 8 are
"non-linear + no noise" (f ∈ {elu, tanh, relu}, σ = 0). The noise enters the pre-activation, which in the
linear case is eq. 1 exactly (the paper never combines noise with a non-linearity).

In the linear case the best linear decoder's population R² is known in closed form (`r2_optimal`):
with h_T = Σ_{k<T} Wᵏ v s_{T−k} + Σ_{k<T} Wᵏ z_{T−k} and u = W^{T−1} v (the direction s_1 enters),
    Σ_h = Σ_{k<T} Wᵏ v vᵀ (Wᵏ)ᵀ + σ² Σ_{k<T} Wᵏ (Wᵏ)ᵀ,   R²_opt = uᵀ Σ_h⁺ u   (Var s_1 = 1).
It is what the sampled R² estimates without the 250-trial regression's bias; at σ = 1 it is ≈ 0.02 for
both chain and orthogonal networks (N = 100, scale 1.01), so Fig. 7b's comparison is within sampling noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainers.analysis.networks import activation
from trainers.seeding import generator

TRIALS = 250  # Appendix A
STEPS = 100  # decode s_1 from h_100 (Appendix A)


@dataclass(frozen=True)
class Decoding:
    r2: float  # in-sample R² on the `trials` fitted trials (the paper's number)
    r2_heldout: float  # the fitted decoder on `trials` fresh trials
    r2_optimal: float | None  # population R² of the best linear decoder (linear networks; None otherwise)
    trials: int
    steps: int
    sigma: float
    nonlinearity: str
    target: torch.Tensor  # s_1 of the fitted trials [trials]
    prediction: torch.Tensor  # the decoder's in-sample estimate of s_1 [trials]

    def to_dict(self) -> dict[str, object]:
        return {
            "r2": self.r2,
            "r2_heldout": self.r2_heldout,
            "r2_optimal": self.r2_optimal,
            "trials": self.trials,
            "steps": self.steps,
            "sigma": self.sigma,
            "nonlinearity": self.nonlinearity,
        }


def simulate(
    w: torch.Tensor,
    v: torch.Tensor,
    steps: int,
    trials: int,
    nonlinearity: str,
    sigma: float,
    gen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run eq. 5 (plus noise) for `steps` steps from h_0 = 0; returns (h_steps [trials, N], s [trials, steps])."""
    f = activation(nonlinearity)
    w64, v64 = w.to(torch.float64), v.to(torch.float64).reshape(1, -1)  # [N, N], [1, N]
    n = w64.shape[0]
    s = torch.randn(trials, steps, generator=gen, dtype=torch.float64)  # s_t ~ N(0, 1)
    h = torch.zeros(trials, n, dtype=torch.float64)  # h_0 = 0   [trials, N]
    for t in range(steps):
        pre = h @ w64.T + s[:, t : t + 1] * v64  # W h_{t−1} + v s_t   [trials, N]
        if sigma > 0:
            pre = pre + sigma * torch.randn(trials, n, generator=gen, dtype=torch.float64)  # z_t
        h = f(pre)
    return h, s


def with_intercept(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype)], dim=1)  # [M, N + 1]


def fit_linear(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Least-squares coefficients [N + 1] (last: the intercept) of y [M] on x [M, N]; minimum-norm if rank-deficient."""
    sol: torch.Tensor = torch.linalg.lstsq(with_intercept(x), y.reshape(-1, 1), driver="gelsd").solution
    return sol[:, 0]


def r_squared(y: torch.Tensor, prediction: torch.Tensor) -> float:
    """R² = 1 − Σ(y − ŷ)² / Σ(y − ȳ)² (negative when the decoder is worse than the mean)."""
    residual = (y - prediction).pow(2).sum()
    total = (y - y.mean()).pow(2).sum()
    return float((1.0 - residual / total).item())


def optimal_r2(w: torch.Tensor, v: torch.Tensor, sigma: float, steps: int = STEPS) -> float:
    """R²_opt = uᵀ Σ_h⁺ u of the best linear decoder of s_1 from h_steps in the linear network (docstring)."""
    w64, v64 = w.to(torch.float64), v.to(torch.float64).reshape(-1)
    n = w64.shape[0]
    power = torch.eye(n, dtype=torch.float64)  # Wᵏ, k = 0
    signal = torch.zeros(n, n, dtype=torch.float64)  # Σ_k Wᵏ v vᵀ (Wᵏ)ᵀ
    noise = torch.zeros(n, n, dtype=torch.float64)  # Σ_k Wᵏ (Wᵏ)ᵀ
    u = v64
    for _ in range(steps):
        u = power @ v64  # ends as W^{steps−1} v
        signal += torch.outer(u, u)
        noise += power @ power.T
        power = w64 @ power
    cov = signal + sigma**2 * noise  # Σ_h [N, N]
    return float((u @ torch.linalg.pinv(cov, hermitian=True) @ u).item())


def decode_first_signal(
    w: torch.Tensor,
    v: torch.Tensor,
    nonlinearity: str = "linear",
    sigma: float = 0.0,
    trials: int = TRIALS,
    steps: int = STEPS,
    seed: int = 1,
) -> Decoding:
    """Decode s_1 from h_steps by linear regression with intercept; R² in-sample (paper) and held out."""
    if trials < 2 or steps < 1 or sigma < 0:
        raise ValueError(f"need trials ≥ 2, steps ≥ 1, sigma ≥ 0; got {trials}, {steps}, {sigma}")
    gen = generator(seed, "decoding")
    h, s = simulate(w, v, steps, trials, nonlinearity, sigma, gen)  # fitted trials
    coef = fit_linear(h, s[:, 0])  # [N + 1]
    prediction = with_intercept(h) @ coef  # [trials]
    h_new, s_new = simulate(w, v, steps, trials, nonlinearity, sigma, gen)  # fresh trials, same network
    return Decoding(
        r2=r_squared(s[:, 0], prediction),
        r2_heldout=r_squared(s_new[:, 0], with_intercept(h_new) @ coef),
        r2_optimal=optimal_r2(w, v, sigma, steps) if nonlinearity == "linear" else None,
        trials=trials,
        steps=steps,
        sigma=sigma,
        nonlinearity=nonlinearity,
        target=s[:, 0],
        prediction=prediction,
    )
