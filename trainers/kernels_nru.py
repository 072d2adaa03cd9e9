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
takes 150 µs a step). Per step: two addmm (z, o), ReLU, one mul for both outer products, three ops
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
"""

from __future__ import annotations

import math
from typing import Any

import torch

NORM_EPS = 1e-12  # F.normalize's eps: n = max(‖V‖₅, ε)


def _head_rows(k: int, s: int, device: torch.device) -> torch.Tensor:
    """Row order [α̃, β̃, p^w, p^e, q^w, q^e] of the head layer from the cell's [α̃, β̃, p^w, q^w, p^e, q^e]
    (it swaps two blocks: its own inverse)."""
    blocks = [torch.arange(2 * k)] + [2 * k + s * b + torch.arange(s) for b in (0, 2, 1, 3)]
    return torch.cat(blocks).to(device)


def _rows(buf: torch.Tensor, width: int, offset: int, count: int) -> tuple[torch.Tensor, ...]:
    """Views [B, width] of the batch-major buf [B, R, C]: the i-th starts at row i, column `offset`,
    of every batch row and may run on into row i + 1 (for i < count). Made once, before the loop."""
    B, R, C = buf.shape
    return buf.as_strided((count, B, width), (C, R * C, 1), buf.storage_offset() + offset).unbind(0)


def _directions(o: torch.Tensor, k: int, s: int) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Per step, p as [B, 2, s, 1] and q as [B, 2, 1, s] (write, erase) from o [T, B, 2k + 4s] = [α̃, β̃ |
    p^w, p^e | q^w, q^e]: ready to broadcast into p qᵀ."""
    T, B = o.shape[:2]
    pq = o[..., 2 * k :].view(T, B, 2, 2, s)
    return pq[:, :, 0].unsqueeze(-1).unbind(0), pq[:, :, 1].unsqueeze(-2).unbind(0)


def _state_store(x: torch.Tensor, B: int, T: int, N: int, M: int) -> torch.Tensor:
    """S [B, T+1, N+m] of zeros, in storage N elements longer: the row of [m_{i−1}, h_i] that starts
    in S's last row (paired with a zero gradient row) stays inside it."""
    return x.new_zeros(B * (T + 1) * (N + M) + N)[: B * (T + 1) * (N + M)].view(B, T + 1, N + M)


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
        m_rows = m_bufs.view(2, B, M).unbind(0)
        sign = torch.full((2 * k,), scale, dtype=x.dtype, device=x.device)
        sign[k:] = -scale  # +r for writing, −r for erasing
        ln_stats: list[tuple[torch.Tensor, torch.Tensor]] = []
        steps = zip(  # every view the loop touches, made once (a view costs ~1 µs)
            xp.unbind(0),
            Z.unbind(0) if Z is not None else [x.new_empty(B, N)] * T,
            _rows(S, N + M, 0, T),  # [h_{i−1}, m_{i−1}]
            S[:, 1:, :N].unbind(1),  # h_i's place
            _rows(S, M + N, N, T),  # [m_{i−1}, h_i]
            Ho.unbind(0),
            Ho[..., : 2 * k].unsqueeze(2).unbind(0),  # α̃, β̃   [B, 1, 2k]
            *_directions(Ho, k, s),
            nrm.unbind(0),
            coef.unbind(0),
            S[:, 1:, N:].unbind(1),  # m_i's place
            strict=True,
        )
        addmm, baddbmm, mul, vecdot = torch.addmm, torch.baddbmm, torch.mul, torch.linalg.vecdot
        for i, (xp_i, z, zin, h, oin, o, ab, p, q, n, cn, m) in enumerate(steps):
            addmm(xp_i, zin, w_z, out=z)  # z_i (eq. 9)
            if ln_w is not None:
                z, mean, rstd = torch.native_layer_norm(z, (N,), ln_w, ln_b, ln_eps)
                ln_stats.append((mean, rstd))
            torch.clamp_min(z, 0.0, out=h)  # h_i = ReLU(z)
            addmm(b_o, oin, w_o, out=o)  # o_i = b_H + W_H [m_{i−1}, h_i]
            if use_relu:
                mul(p, q, out=v4).relu_()  # V = ρ(p qᵀ), both directions   [B, 2, s, s]
            else:
                mul(p, q, out=v4)
            mul(v, v, out=u).mul_(u).copysign_(v)  # U = V³|V|
            vecdot(u_rows, v_rows, out=n).pow_(0.2).clamp_min_(NORM_EPS)  # n = max((Σ|V|⁵)^⅕, ε)
            mul(ab.relu() if use_relu else ab, sign, out=cn).div_(n)  # c / n   [B, 1, 2k]
            baddbmm(m_bufs[i & 1], cn, v, out=m_bufs[~i & 1])  # m_i = m_{i−1} + Σ (c/n) V   [B, 1, m]
            m.copy_(m_rows[~i & 1])
        ctx.dims = (k, M, s, use_relu)
        ctx.rows = rows
        if ln_w is not None:
            means, rstds = (torch.stack(t) for t in zip(*ln_stats, strict=True))
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
        x, w, w_z, w_o, S, Ho, nrm, coef, sign, *ln = ctx.saved_tensors
        k, M, s, use_relu = ctx.dims
        T, B, d = x.shape
        N, H = w.shape[0], Ho.shape[-1]
        gm = grad_ms[0] if grad_ms else None
        g = grad_hs.contiguous() if grad_hs is not None else x.new_zeros(T, B, N)
        # factors that depend on forward values only, all steps at once ([T, B, 2k]: small)
        nrm = nrm.view(T, B, 2 * k)
        live = nrm > NORM_EPS  # n = ε: the norm is a constant
        kappa = coef.view(T, B, 2 * k) / nrm.pow(5) * live  # ∂V = (c/n) dm − ⟨dm, V⟩ (c/n) / n⁵ · U
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
        # views made once
        dzo = _rows(D, N + H, 0, T)  # [∂z_i, ∂o_i]
        doz = _rows(D, H + N, N, T)  # [∂o_i, ∂z_{i+1}]
        d_z, d_ab = D[:, :T, :N].unbind(1), D[:, :T, N : N + 2 * k].unbind(1)
        dpq = D[:, :T, N + 2 * k :].view(B, T, 2, 2, s)
        d_p, d_q = dpq[:, :, 0].unbind(1), dpq[:, :, 1].unbind(1)  # ∂p, ∂q   [B, 2, s]
        ps, qs = _directions(Ho, k, s)
        # the factors [u; u³|u|] for all steps: one outer product then gives V = ρ(p qᵀ) and U = V³|V|
        # = ρ((p³|p|)(q³|q|)ᵀ) (the same signs), a third of the ops of making U from V per step
        uu = Ho[..., 2 * k :].unsqueeze(2).repeat(1, 1, 2, 1)  # [T, B, (V, U), 4s]
        ut = uu[:, :, 1]
        torch.mul(ut, ut, out=ut).mul_(ut).copysign_(uu[:, :, 0])
        uu6 = uu.view(T, B, 2, 2, 2, s)  # [T, B, (V, U), (p, q), j, s]
        fp, fq = uu6[:, :, :, 0].unsqueeze(-1).unbind(0), uu6[:, :, :, 1].unsqueeze(-2).unbind(0)
        gs, hmasks, kappas, gabs = g.unbind(0), hmask.unbind(1), kappa.unbind(0), gab.unbind(0)
        coefs = coef.transpose(2, 3).unbind(0)  # [B, 2k, 1]
        dms, dm_rows = dm_buf.unbind(0), dm_buf.unsqueeze(2).unbind(0)  # [B, m], [B, 1, m]
        j = T & 1  # step i writes ∂m_{i−1} into the other buffer, dms[i & 1]
        dm, dm_row = dms[j], dm_rows[j]
        if gm is not None:
            dm.copy_(gm[T - 1])
        addmm, mul, vecdot = torch.addmm, torch.mul, torch.linalg.vecdot
        for i in range(T - 1, -1, -1):
            p, q = ps[i], qs[i]
            mul(fp[i], fq[i], out=vu5)  # V and U again
            if use_relu:
                vu.relu_()
            vecdot(v, dm_row, out=dcr)  # ⟨dm, V⟩
            mul(dcr, kappas[i], out=gamma2)
            mul(dm_row, coefs[i], out=dV).addcmul_(gamma, u, value=-1.0)  # ∂V
            if use_relu:
                dV.mul_(v > 0)  # ρ'
            vecdot(dV4, q, out=d_p[i])  # ∂p = ∂V q
            vecdot(dV4, p, dim=-2, out=d_q[i])  # ∂q = ∂Vᵀ p
            mul(dcr, gabs[i], out=d_ab[i])  # ∂(α̃, β̃)
            addmm(gs[i], doz[i], w_dh, out=dh)  # ∂h_i = g_i + ∂o_i W_Hh + ∂z_{i+1} W_h
            if dz_hat is None:
                mul(dh, hmasks[i], out=d_z[i])  # ∂z_i
            else:
                mul(dh, hmasks[i], out=dz_hat[i])  # ∂ẑ_i, then LayerNorm's backward
                d_z[i].copy_(
                    torch.ops.aten.native_layer_norm_backward(
                        dz_hat[i], ln[0][i], (N,), ln[3][i], ln[4][i], ln[1], ln[2], [True, False, False]
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
