"""The NRU recurrence (Chandar et al. 2019; the equations in `trainers.cells.nru`) as one autograd
function for the whole sequence, with a hand-written backward.

One step, 0-based (step i makes h_i, m_i from h_{i−1}, m_{i−1}; h_{−1} = m_{−1} = 0):

    z_i = W_x x_i + b + W_h h_{i−1} + W_m m_{i−1}                                   [B, N]   (eq. 9)
    h_i = ReLU(LN?(z_i))
    o_i = b_H + W_Hh h_i + W_Hm m_{i−1} = [α̃, β̃ | p^w, p^e | q^w, q^e]    [B, 2k + 4s]   (eqs. 11-16)
    V_j = ρ(p^j q^jᵀ) viewed [k, m], j ∈ {w, e}                                  [B, 2k, m]   (eq. 17)
    c_j = ±r ρ(α̃ or β̃)   (+ for writing, − for erasing; r = 1/k for the mean over heads, 1 for the sum)
    m_i = m_{i−1} + Σ_{j,heads} (c / n) V,   n = max(‖V‖₅, ε) per head                 (eq. 10)

The L5 normalisation v̂ = V / n and the weighted sum over heads fold into one batched vector-matrix
product, Σ c v̂ = (c / n)·V, and the norm comes from U = V³|V| (Σ U V = ‖V‖₅⁵; torch's p = 5 norm
is far slower: docs/speed.md). Per step: two addmm (z, o), ReLU, one mul for both outer products, three ops
for U, the norm (vecdot, pow, clamp), two small ops for c / n, one baddbmm for m_i and its copy into
S: 14 ops (+2 with ρ = ReLU). V and U are scratch, made again in the backward (one outer product of
stacked factors): a [T, B, 2k, m] store costs a page fault per fresh 4 KB, more than the arithmetic.

Layouts chosen so that no step concatenates. The states live batch-major in S [B, T+1, N+m] with
S[:, i+1] = [h_i, m_i] (S[:, 0] = [h_{−1}, m_{−1}] = 0), so both inputs the step needs are contiguous
slices of a row: [h_{i−1}, m_{i−1}] = S[:, i], and [m_{i−1}, h_i], which straddles S[:, i] and
S[:, i+1] (the head weights' columns are reordered to [m | h] for it). The head layer's rows are
reordered to [α̃, β̃, p^w, p^e, q^w, q^e] so p and q are each one block.

Backward, with dm = ∂L/∂m_i (which alone reaches o_i) and the forward-only κ = (c/n) / n⁵:
    ⟨dm, V⟩ per direction and head                        one vecdot   [B, 2k]
    ∂V = ρ' ⊙ ((c/n) dm − ⟨dm, V⟩ κ U)                    (the L5 norm's backward: ∂n/∂V = U / n⁴)
    ∂p = ∂V q,  ∂q = ∂Vᵀ p                               two vecdot, straight into ∂o_i
    ∂(α̃, β̃) = ⟨dm, V⟩ (±r / n) ρ'                         one mul
    ∂h_i = g_i + ∂o_i W_Hh + ∂z_{i+1} W_h                one addmm: [∂o_i, ∂z_{i+1}] is contiguous
    ∂z_i = ∂h_i ⊙ [h_i > 0]  (then LayerNorm's backward)  one mul
    ∂m_{i−1} = dm + ∂z_i W_m + ∂o_i W_Hm                 one addmm: [∂z_i, ∂o_i] is contiguous
The per-step gradients live batch-major in D [B, T+1, N + 2k + 4s], D[:, i] = [∂z_i, ∂o_i] and
D[:, T] = 0, so both addmm inputs are slices of a row again, and every weight's gradient is one
product over all B·(T+1) rows of D and S after the loop (the zero rows pair with S's extra ones).

The per-step loops run compiled (`csrc/nru_scan.cpp`, built on first use: `compiled_steps`): the same
ATen calls on the same views as `PythonSteps`, hence the same numbers bit for bit, minus the
interpreter's cost per call and the autograd dispatch keys (~30 small calls a timestep; what that
saves, measured: docs/speed.md). `PythonSteps` is the reference in
the tests and the fallback where no C++ compiler is found.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

from trainers.environ import environ_lock

NORM_EPS = 1e-12  # F.normalize's eps: n = max(‖V‖₅, ε)


def _head_rows(k: int, s: int, device: torch.device) -> torch.Tensor:
    """Row order [α̃, β̃, p^w, p^e, q^w, q^e] of the head layer from the cell's [α̃, β̃, p^w, q^w, p^e, q^e]
    (it swaps two blocks: its own inverse)."""
    blocks = [torch.arange(2 * k)] + [2 * k + s * b + torch.arange(s) for b in (0, 2, 1, 3)]
    return torch.cat(blocks).to(device)


def _rows(buf: torch.Tensor, width: int, offset: int, count: int) -> torch.Tensor:
    """A view [count, B, width] of the batch-major buf [B, R, C]: its i-th [B, width] starts at row i,
    column `offset`, of every batch row and may run on into row i + 1."""
    B, R, C = buf.shape
    return buf.as_strided((count, B, width), (C, R * C, 1), buf.storage_offset() + offset)


def _directions(o: torch.Tensor, k: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """p as [T, B, 2, s, 1] and q as [T, B, 2, 1, s] (write, erase) from o [T, B, 2k + 4s] = [α̃, β̃ |
    p^w, p^e | q^w, q^e]: ready to broadcast into p qᵀ."""
    T, B = o.shape[:2]
    pq = o[..., 2 * k :].view(T, B, 2, 2, s)
    return pq[:, :, 0].unsqueeze(-1), pq[:, :, 1].unsqueeze(-2)


def _state_store(x: torch.Tensor, B: int, T: int, N: int, M: int) -> torch.Tensor:
    """S [B, T+1, N+m] of zeros, in storage N elements longer: the row of [m_{i−1}, h_i] that starts
    in S's last row (paired with a zero gradient row) stays inside it."""
    return x.new_zeros(B * (T + 1) * (N + M) + N)[: B * (T + 1) * (N + M)].view(B, T + 1, N + M)


class PythonSteps:
    """The per-step loops of `NRUScan` in Python. `csrc/nru_scan.cpp` is the same loops, call for
    call, in C++ (`compiled_steps`): the reference in the tests, and the fallback without a compiler.

    Each per-step argument is a view with a leading T dim, unbound once; `fixed` are the buffers and
    weights every step reuses (the orders are `NRUScan`'s)."""

    @staticmethod
    def forward_steps(
        steps: list[torch.Tensor],
        fixed: list[torch.Tensor],
        ln_w: torch.Tensor | None,
        ln_b: torch.Tensor | None,
        use_relu: bool,
        ln_eps: float,
    ) -> list[torch.Tensor]:
        w_z, w_o, b_o, v, u, v4, v_rows, u_rows, m_bufs, sign = fixed
        N = steps[0].shape[2]
        m_rows = m_bufs.squeeze(2).unbind(0)
        means, rstds = [], []
        addmm, baddbmm, mul, vecdot = torch.addmm, torch.baddbmm, torch.mul, torch.linalg.vecdot
        for i, (xp, z, zin, h, oin, o, ab, p, q, n, cn, m) in enumerate(
            zip(*(t.unbind(0) for t in steps), strict=True)
        ):
            addmm(xp, zin, w_z, out=z)  # z_i (eq. 9)
            if ln_w is not None:
                z, mean, rstd = torch.native_layer_norm(z, (N,), ln_w, ln_b, ln_eps)
                means.append(mean)
                rstds.append(rstd)
            torch.clamp_min(z, 0.0, out=h)  # h_i = ReLU(z)
            addmm(b_o, oin, w_o, out=o)  # o_i = b_H + W_H [m_{i−1}, h_i]
            mul(p, q, out=v4)  # V = ρ(p qᵀ), both directions   [B, 2, s, s]
            if use_relu:
                v4.relu_()
            mul(v, v, out=u).mul_(u).copysign_(v)  # U = V³|V|
            vecdot(u_rows, v_rows, out=n).pow_(0.2).clamp_min_(NORM_EPS)  # n = max((Σ|V|⁵)^⅕, ε)
            mul(ab.relu() if use_relu else ab, sign, out=cn).div_(n)  # c / n   [B, 1, 2k]
            baddbmm(m_bufs[i & 1], cn, v, out=m_bufs[~i & 1])  # m_i = m_{i−1} + Σ (c/n) V   [B, 1, m]
            m.copy_(m_rows[~i & 1])
        return [torch.stack(means), torch.stack(rstds)] if ln_w is not None else []

    @staticmethod
    def backward_steps(
        steps: list[torch.Tensor],
        fixed: list[torch.Tensor],
        gm: torch.Tensor | None,
        ln_w: torch.Tensor | None,
        ln_b: torch.Tensor | None,
        use_relu: bool,
    ) -> None:
        vu, v, u, vu5, dV, dV4, dcr, gamma, gamma2, dh, w_dh, w_dm, dm_buf, dm_rows_buf = fixed
        T, N = steps[0].shape[0], steps[0].shape[2]
        g, fp, fq, ps, qs, kappa, coef, gab, hmask, d_p, d_q, d_ab, d_z, doz, dzo, *ln = (
            t.unbind(0) for t in steps
        )
        dz_hat, z, mean, rstd = ln if ln else ((), (), (), ())  # ∂ẑ_i, z_i and the stats: LayerNorm only
        dms, dm_rows = dm_buf.unbind(0), dm_rows_buf.unbind(0)  # [B, m], [B, 1, m]
        j = T & 1  # step i writes ∂m_{i−1} into the other buffer, dms[i & 1]
        dm, dm_row = dms[j], dm_rows[j]
        if gm is not None:
            dm.copy_(gm[T - 1])
        addmm, mul, vecdot = torch.addmm, torch.mul, torch.linalg.vecdot
        for i in range(T - 1, -1, -1):
            mul(fp[i], fq[i], out=vu5)  # V and U again
            if use_relu:
                vu.relu_()
            vecdot(v, dm_row, out=dcr)  # ⟨dm, V⟩
            mul(dcr, kappa[i], out=gamma2)
            mul(dm_row, coef[i], out=dV).addcmul_(gamma, u, value=-1.0)  # ∂V
            if use_relu:
                dV.mul_(v > 0)  # ρ'
            vecdot(dV4, qs[i], out=d_p[i])  # ∂p = ∂V q
            vecdot(dV4, ps[i], dim=-2, out=d_q[i])  # ∂q = ∂Vᵀ p
            mul(dcr, gab[i], out=d_ab[i])  # ∂(α̃, β̃)
            addmm(g[i], doz[i], w_dh, out=dh)  # ∂h_i = g_i + ∂o_i W_Hh + ∂z_{i+1} W_h
            if not ln:
                mul(dh, hmask[i], out=d_z[i])  # ∂z_i
            else:
                mul(dh, hmask[i], out=dz_hat[i])  # ∂ẑ_i, then LayerNorm's backward
                d_z[i].copy_(
                    torch.ops.aten.native_layer_norm_backward(
                        dz_hat[i], z[i], (N,), mean[i], rstd[i], ln_w, ln_b, [True, False, False]
                    )[0]
                )
            if i == 0:
                break  # m_{−1} = 0 is no input
            j = i & 1
            if gm is not None:  # ∂L/∂m_{i−1} from outside
                torch.add(dm, gm[i - 1], out=dms[j]).addmm_(dzo[i], w_dm)
            else:
                addmm(dm, dzo[i], w_dm, out=dms[j])  # ∂m_{i−1}
            dm, dm_row = dms[j], dm_rows[j]


SOURCE = Path(__file__).with_name("csrc") / "nru_scan.cpp"


def build_directory() -> Path:
    """Where the compiled loops live: one folder per source, torch installation and Python version,
    under $TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions); shared by the checkouts that use
    one venv (another venv's torch headers would make another build command: a folder of its own)."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions"
    ident = f"{torch.__version__} {Path(torch.__file__).parent} {sys.version}"
    key = hashlib.sha256(SOURCE.read_bytes() + ident.encode()).hexdigest()
    return Path(root) / f"memsweep_nru_{key[:16]}"


def _build(where: Path) -> None:
    """Build the loops in `where` with torch's C++ extension builder (its file lock makes concurrent
    first builds one build) and load them; then mark the folder built."""
    import ninja  # the build tool torch's builder runs, on PATH for the build, venv activated or not

    quiet = logging.getLogger("torch.utils.cpp_extension")  # its import warns "no CUDA runtime"
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    with environ_lock:  # no process started meanwhile inherits the build's PATH, nor loses its own edit
        path = os.environ.get("PATH", "")
        os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, path])
        try:
            from torch.utils.cpp_extension import load

            where.mkdir(parents=True, exist_ok=True)
            text = SOURCE.read_bytes()
            source = (
                where / SOURCE.name
            )  # a copy at a path of its own: every checkout builds the same command
            if not source.exists() or source.read_bytes() != text:
                part = where / f"{SOURCE.name}.{os.getpid()}"
                part.write_bytes(text)
                part.replace(source)
            load(
                where.name,
                [str(source)],
                build_directory=str(where),
                is_python_module=False,
                extra_cflags=["-O2"],
            )
        finally:
            os.environ["PATH"] = path
            quiet.setLevel(level)
    (where / "built").touch()


@functools.cache
def compiled_steps() -> Any | None:
    """`torch.ops.memsweep_nru`: the loops of `csrc/nru_scan.cpp`, built on first use (once per machine
    and source, in `build_directory`; later processes load the finished library at once), or None where
    they cannot be built (no C++ compiler): `PythonSteps` then runs, the same numbers, slower."""
    where = build_directory()
    try:
        if (where / "built").exists():  # written after a whole build: a library being linked is not loaded
            try:
                torch.ops.load_library(where / f"{where.name}.so")  # type: ignore[no-untyped-call]
                return torch.ops.memsweep_nru
            except Exception:  # a damaged or removed library: built again below
                (where / "built").unlink(missing_ok=True)
        _build(where)
    except Exception as e:  # any build failure: the Python loops run instead
        warnings.warn(
            f"NRU: the compiled step loops ({SOURCE.name}) could not be built ({type(e).__name__}: {str(e)[:300]}…); "
            "the Python loops run instead: the same numbers, about 1.5x slower. Install a C++ compiler "
            "(Debian: apt install g++) to build them.",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    return torch.ops.memsweep_nru


def step_loops() -> Any:
    """The step loops `NRUScan` runs: the compiled ones where they build, else `PythonSteps`;
    MEMSWEEP_NRU_STEPS=python asks for `PythonSteps` (the tests compare the two)."""
    if os.environ.get("MEMSWEEP_NRU_STEPS", "compiled") == "python":
        return PythonSteps
    return compiled_steps() or PythonSteps


class NRUScan(torch.autograd.Function):
    """Inputs: x [T, B, d]; w [N, d + N + m] and b [N] (the cell's hmi2h, columns [x | h | m]); w_heads
    [2k + 4s, N + m] and b_heads (the four head layers stacked, `NRUCell.head_weights`); LayerNorm's
    weight and bias [N] or None; then the constants heads, memory_size, use_relu, scale (r: 1/k for
    the mean over heads, 1 for the sum), ln_eps, keep_memory. Outputs h [T, B, N] (and, with
    keep_memory, m [T, B, m])."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        w: torch.Tensor,
        b: torch.Tensor,
        w_heads: torch.Tensor,
        b_heads: torch.Tensor,
        ln_w: torch.Tensor | None,
        ln_b: torch.Tensor | None,
        k: int,
        M: int,
        use_relu: bool,
        scale: float,
        ln_eps: float,
        keep_memory: bool,
    ) -> tuple[torch.Tensor, ...]:
        T, B, d = x.shape
        N, s = w.shape[0], math.isqrt(M * k)
        H = 2 * k + 4 * s
        rows = _head_rows(k, s, x.device)
        w_z = w[:, d:].t()  # [N+m, N] over [h, m]
        w_o = torch.cat([w_heads[:, N:], w_heads[:, :N]], 1)[rows].t()  # [m+N, H] over [m, h]
        b_o = b_heads[rows]
        xp = torch.addmm(b, x.reshape(T * B, d), w[:, :d].t()).view(T, B, N)  # W_x x_i + b, all i at once
        S = _state_store(x, B, T, N, M)  # S[:, i+1] = [h_i, m_i]
        Ho = x.new_empty(T, B, H)  # o_i
        nrm = x.new_empty(T, B, 1, 2 * k)  # n = max(‖V‖₅, ε)
        coef = x.new_empty(T, B, 1, 2 * k)  # c / n   (rows: the baddbmm's shape)
        Z = x.new_empty(T, B, N) if ln_w is not None else None  # z_i, for LayerNorm's backward
        # V = ρ(p qᵀ) per (direction, head) and U = V³|V| (Σ U V = ‖V‖₅⁵) are scratch, made again in
        # the backward: a [T, B, 2k, m] store costs a page fault per fresh 4 KB, more than the math
        v, u = x.new_empty(B, 2 * k, M), x.new_empty(B, 2 * k, M)
        v4, v_rows, u_rows = v.view(B, 2, s, s), v.view(B, 1, 2 * k, M), u.view(B, 1, 2 * k, M)
        m_bufs = x.new_zeros(2, B, 1, M)  # m_{i−1} and m_i, contiguous: step i reads m_bufs[i & 1]
        sign = torch.full((2 * k,), scale, dtype=x.dtype, device=x.device)
        sign[k:] = -scale  # +r for writing, −r for erasing
        steps = [  # every view the loop touches, each step's as one [T, …] view (unbound once)
            xp,
            Z if Z is not None else x.new_empty(B, N).expand(T, B, N),  # z_i's place
            _rows(S, N + M, 0, T),  # [h_{i−1}, m_{i−1}]
            S[:, 1:, :N].transpose(0, 1),  # h_i's place
            _rows(S, M + N, N, T),  # [m_{i−1}, h_i]
            Ho,
            Ho[..., : 2 * k].unsqueeze(2),  # α̃, β̃   [B, 1, 2k]
            *_directions(Ho, k, s),
            nrm,
            coef,
            S[:, 1:, N:].transpose(0, 1),  # m_i's place
        ]
        fixed = [w_z, w_o, b_o, v, u, v4, v_rows, u_rows, m_bufs, sign]
        ln_stats = step_loops().forward_steps(steps, fixed, ln_w, ln_b, use_relu, ln_eps)
        ctx.dims = (k, M, s, use_relu)
        ctx.rows = rows
        if ln_w is not None:
            means, rstds = ln_stats
            ctx.save_for_backward(x, w, w_z, w_o, S, Ho, nrm, coef, sign, Z, ln_w, ln_b, means, rstds)
        else:
            ctx.save_for_backward(x, w, w_z, w_o, S, Ho, nrm, coef, sign)
        ctx.set_materialize_grads(False)
        hs = S[:, 1:, :N].transpose(0, 1).contiguous()  # [T, B, N]
        if keep_memory:
            return hs, S[:, 1:, N:].transpose(0, 1).contiguous()
        return (hs,)

    @staticmethod
    def backward(
        ctx: Any, grad_hs: torch.Tensor | None, *grad_ms: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        if torch.is_grad_enabled():  # create_graph=True: the compiled loops would give a silent 0
            raise RuntimeError(
                "nru: the NRU kernel's backward is written by hand and builds no graph, so a gradient "
                "of its gradient (create_graph=True, e.g. a gradient penalty) is not supported"
            )
        x, w, w_z, w_o, S, Ho, nrm, coef, sign, *ln = ctx.saved_tensors
        k, M, s, use_relu = ctx.dims
        T, B, d = x.shape
        N, H = w.shape[0], Ho.shape[-1]
        gm = grad_ms[0] if grad_ms else None
        g = grad_hs.contiguous() if grad_hs is not None else x.new_zeros(T, B, N)
        # factors that depend on forward values only, all steps at once ([T, B, 2k]: small)
        nrm = nrm.view(T, B, 2 * k)
        # ∂V = (c/n) dm − ⟨dm, V⟩ κ U with κ = (c/n) / n⁵, and κ = 0 where n = ε (the norm is a
        # constant there): a select, not a product with the mask — ε⁵ underflows in float32, κ = ∞.
        # Known limit: κ still overflows float32 where ε < n and n⁵ < (c/n) / 3.4e38 (a head whose
        # entries are all about 1e-7 or smaller), where autograd through F.normalize stays finite.
        # Forming κU as (c/n)(V/n)⁴/n would fix it, at the cost of every NRU trial's rounding: not done
        kappa = torch.where(nrm > NORM_EPS, coef.view(T, B, 2 * k) / nrm.pow(5), 0.0)
        gab = sign / nrm  # ∂(α̃, β̃) = ⟨dm, V⟩ (±r / n) ρ'
        if use_relu:
            gab = gab * (Ho[..., : 2 * k] > 0)
        hmask = (S[:, 1:, :N] > 0).to(S.dtype)  # ReLU'(z_i)   [B, T, N]
        # [H + N, N]: ∂h_i = g_i + [∂o_i, ∂z_{i+1}] · w_dh, and [N + H, m]: ∂m_{i−1} = dm + [∂z_i, ∂o_i] · w_dm,
        # each the transpose of a contiguous matrix (MKL: ~25 % faster than the row-major operand here)
        w_dh = torch.cat([w_o[M:], w_z[:N]], 1).t()
        w_dm = torch.cat([w_z[N:], w_o[:M]], 1).t()
        D = x.new_empty(B, T + 1, N + H)  # D[:, i] = [∂z_i, ∂o_i]; D[:, T] = 0 (∂z_T = 0)
        D[:, T].zero_()
        dm_buf = x.new_zeros(2, B, M)
        dcr = x.new_empty(B, 2 * k)  # ⟨dm, V⟩ per direction and head
        gamma = x.new_empty(B, 2 * k, 1)
        vu, dV = x.new_empty(B, 2, 2 * k, M), x.new_empty(B, 2 * k, M)  # [V; U], ∂V
        v, u, vu5 = vu[:, 0], vu[:, 1], vu.view(B, 2, 2, s, s)
        dV4, gamma2 = dV.view(B, 2, s, s), gamma.view(B, 2 * k)
        dh = x.new_empty(B, N)
        dz_hat = x.new_empty(T, B, N) if ln else None
        # the factors [u; u³|u|] for all steps: one outer product then gives V = ρ(p qᵀ) and U = V³|V|
        # = ρ((p³|p|)(q³|q|)ᵀ) (the same signs), a third of the ops of making U from V per step
        uu = Ho[..., 2 * k :].unsqueeze(2).repeat(1, 1, 2, 1)  # [T, B, (V, U), 4s]
        ut = uu[:, :, 1]
        torch.mul(ut, ut, out=ut).mul_(ut).copysign_(uu[:, :, 0])
        uu6 = uu.view(T, B, 2, 2, 2, s)  # [T, B, (V, U), (p, q), j, s]
        dpq = D[:, :T, N + 2 * k :].view(B, T, 2, 2, s).transpose(0, 1)
        steps = [  # every view the loop touches, each step's as one [T, …] view (unbound once)
            g,
            uu6[:, :, :, 0].unsqueeze(-1),  # [p; p³|p|]
            uu6[:, :, :, 1].unsqueeze(-2),  # [q; q³|q|]
            *_directions(Ho, k, s),  # p, q
            kappa,
            coef.transpose(2, 3),  # c / n   [B, 2k, 1]
            gab,
            hmask.transpose(0, 1),
            dpq[:, :, 0],  # ∂p   [B, 2, s]
            dpq[:, :, 1],  # ∂q
            D[:, :T, N : N + 2 * k].transpose(0, 1),  # ∂(α̃, β̃)
            D[:, :T, :N].transpose(0, 1),  # ∂z_i
            _rows(D, H + N, N, T),  # [∂o_i, ∂z_{i+1}]
            _rows(D, N + H, 0, T),  # [∂z_i, ∂o_i]
        ]
        if dz_hat is not None:  # ∂ẑ_i, z_i, LayerNorm's mean and rstd
            steps += [dz_hat, ln[0], ln[3], ln[4]]
        fixed = [vu, v, u, vu5, dV, dV4, dcr, gamma, gamma2, dh, w_dh, w_dm, dm_buf, dm_buf.unsqueeze(2)]
        ln_w, ln_b = (ln[1], ln[2]) if ln else (None, None)
        step_loops().backward_steps(steps, fixed, gm, ln_w, ln_b, use_relu)
        need = ctx.needs_input_grad
        # every weight's gradient: one product over all (B, T+1) rows of the batch-major stores, whose
        # extra row per sequence has ∂ = 0 (D[:, T]) — no copies
        Dz, Do = D.view(-1, N + H)[:, :N], D.view(-1, N + H)[:, N:]  # ∂z, ∂o (the reordered head rows)
        grad_w = grad_wo = grad_b = grad_bo = grad_x = None
        if need[1]:  # ∂[W_x | W_h | W_m] = Σ ∂z_iᵀ [x_i, h_{i−1}, m_{i−1}]
            xb = x.new_zeros(B, T + 1, d)
            xb[:, :T] = x.transpose(0, 1)
            grad_w = torch.cat([Dz.t() @ xb.view(-1, d), Dz.t() @ S.view(-1, N + M)], 1)
        if need[3]:  # ∂W_H = Σ ∂o_iᵀ [m_{i−1}, h_i], back to the cell's rows and columns [h | m]
            grad_wo = Do.t() @ S.as_strided((B * (T + 1), M + N), (N + M, 1), S.storage_offset() + N)
            grad_wo = torch.cat([grad_wo[:, M:], grad_wo[:, :M]], 1)[ctx.rows]
        if need[2]:
            grad_b = Dz.sum(0)
        if need[4]:
            grad_bo = Do.sum(0)[ctx.rows]
        if need[0]:  # e.g. an embedding before the cell
            grad_x = (D[:, :T, :N] @ w[:, :d]).transpose(0, 1)
        grad_lnw = grad_lnb = None
        if dz_hat is not None:
            z_hat = (ln[0] - ln[3]) * ln[4]  # the normalised z
            grad_lnw = (dz_hat * z_hat).sum((0, 1)) if need[5] else None
            grad_lnb = dz_hat.sum((0, 1)) if need[6] else None
        return (
            grad_x, grad_w, grad_b, grad_wo, grad_bo, grad_lnw, grad_lnb,
            None, None, None, None, None, None,
        )  # fmt: skip


def nru_scan(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor,
    w_heads: torch.Tensor,
    b_heads: torch.Tensor,
    ln: torch.nn.LayerNorm | None,
    heads: int,
    memory_size: int,
    use_relu: bool,
    head_reduction: str,
    keep_memory: bool = False,
) -> tuple[torch.Tensor, ...]:
    """h [T, B, N] (and with `keep_memory` m [T, B, m]) of the NRU on x [T, B, d] (`NRUScan`)."""
    scale = 1.0 / heads if head_reduction == "mean" else 1.0
    ln_w, ln_b, ln_eps = (ln.weight, ln.bias, ln.eps) if ln is not None else (None, None, 0.0)
    out: tuple[torch.Tensor, ...] = NRUScan.apply(
        x, w, b, w_heads, b_heads, ln_w, ln_b, heads, memory_size, use_relu, scale, ln_eps, keep_memory
    )
    return out
