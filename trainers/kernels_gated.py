"""Whole-sequence autograd functions for the two gated cells with one state: JANET and GRU; and, in
plain autograd step by step, the variants no kernel computes (the GRU with its reset before the product,
the LSTM with peepholes: the NRU authors' myTorch cells).

Like `trainers.kernels.ElmanScan`, each records one autograd node for the whole sequence instead of
~10 per step, hoists the input projection (x's contribution for all steps) out of the loop as one
matmul, and touches only views made once before the loop. The backward is written by hand and is
short because both cells are linear in ∂L/∂h_t at each step: every factor of the chain rule that
depends only on forward values (gate derivatives, h_{t−1} − candidate, …) is computed for all T
steps at once after the forward, into Q [T, B, G, N], so each backward step is

    ∂a_t = Q_t ⊙ dh_t                        one mul, dh_t broadcast over the G gate blocks
    dh_{t−1} = g_{t−1} + z_t ⊙ dh_t + ∂a_t W  one addcmul and one addmm

(z_t the gate that carries h_{t−1} straight through: JANET's f_t, GRU's z_t). ∂W, ∂V and ∂b are
one large product or sum each after the loop (`trainers.kernels.weight_grads`, `input_grads`).
Shapes are time-major: x [T, B, d], h0 [B, N], outputs [T, B, N].
"""

from __future__ import annotations

from typing import Any

import torch

from trainers.kernels import input_grads, weight_grads


def _backward_scan(
    grad_hs: torch.Tensor, q: torch.Tensor, carry: torch.Tensor, w_hh: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward recursion shared by both cells.

    grad_hs [T, B, N]: ∂L/∂h_t from outside; q [T, B, G, N]: ∂a_t/∂h_t per gate block (G ≥ the
    recurrent matmul's blocks R = w_hh.shape[0] / N: blocks past R are extra per-step products the
    caller wants, e.g. GRU's ∂L/∂(W_in x_t)); carry [T, B, N]: ∂h_t/∂h_{t−1} (elementwise);
    w_hh [R·N, N]. Returns (∂a [T, B, G·N], ∂L/∂h_0 [B, N]).
    """
    T, B, G, N = q.shape
    R = w_hh.shape[0] // N
    grad_a = torch.empty_like(q)  # ∂L/∂a_t, gate blocks side by side
    dh_buf = grad_hs.new_empty(2, B, N)  # ∂L/∂h_t, double-buffered
    g, qs, ga, cs = grad_hs.unbind(0), q.unbind(0), grad_a.unbind(0), carry.unbind(0)  # views made once
    ga_rec = grad_a.view(T, B, G * N)[..., : R * N].unbind(0)  # the blocks the recurrent matmul produced
    bufs = dh_buf.unbind(0)
    mul, addcmul = torch.mul, torch.addcmul
    dh = g[T - 1]
    for t in range(T - 1, -1, -1):
        mul(qs[t], dh.unsqueeze(1), out=ga[t])  # ∂a_t = Q_t ⊙ dh_t   [B, G, N]
        prev = g[t - 1] if t > 0 else torch.zeros_like(dh)
        nxt = addcmul(prev, cs[t], dh, out=bufs[t & 1])  # g_{t−1} + carry_t ⊙ dh_t
        dh = nxt.addmm_(ga_rec[t], w_hh)  # + ∂a_t W_hh: ∂L/∂h_{t−1}
    return grad_a.view(T, B, G * N), dh


class JANETScan(torch.autograd.Function):
    """JANET over a whole sequence (the equations in `trainers.cells.janet`).

    Forward per step: one addmm (both gates' recurrent parts), sigmoid and tanh in place on the two
    halves, one lerp — the very ops of the eager loop, so the forward's numbers are the same.
    Backward: with f, c the forget gate and candidate, h_t = c + f ⊙ (h_{t−1} − c):
        ∂a_f = dh ⊙ (h_{t−1} − c) ⊙ f (1 − f),   ∂a_c = dh ⊙ (1 − f) (1 − c²),   carry = f.
    Inputs: x [T, B, d], weight_ih [2N, d], weight_hh [2N, N], bias [2N], h0 [B, N].
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        w_ih: torch.Tensor,
        w_hh: torch.Tensor,
        bias: torch.Tensor,
        h0: torch.Tensor,
    ) -> torch.Tensor:
        T, B, d = x.shape
        N = h0.shape[1]
        # a_t = W_x x_t + b for all steps at once, then += W_h h_{t−1} in place per step   [T, B, 2N]
        gates = torch.addmm(bias, x.reshape(T * B, d), w_ih.t()).view(T, B, 2 * N)
        hs = torch.empty(T, B, N, dtype=h0.dtype, device=h0.device)
        w_hh_t = w_hh.t()  # [N, 2N]
        h = h0
        steps = zip(
            gates.unbind(0), gates[..., :N].unbind(0), gates[..., N:].unbind(0), hs.unbind(0), strict=True
        )
        for a_t, f_t, c_t, hs_t in steps:  # views made once
            a_t.addmm_(h, w_hh_t)  # [W_f; W_c][x_t, h_{t−1}] + [b_f; b_c]   [B, 2N]
            f_t.sigmoid_()  # f_t
            c_t.tanh_()  # candidate c_t
            h = torch.lerp(c_t, h, f_t, out=hs_t)  # f ⊙ h_{t−1} + (1 − f) ⊙ c_t
        ctx.save_for_backward(x, w_ih, w_hh, gates, hs, h0)
        return hs

    @staticmethod
    def backward(ctx: Any, grad_hs: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, w_ih, w_hh, gates, hs, h0 = ctx.saved_tensors
        T, B, N = hs.shape
        f, c = gates[..., :N], gates[..., N:]  # [T, B, N] each
        h_prev = torch.cat([h0.unsqueeze(0), hs[:-1]])  # h_{t−1}   [T, B, N]
        q = torch.empty(T, B, 2, N, dtype=hs.dtype, device=hs.device)
        one_minus_f = 1.0 - f
        torch.mul((h_prev - c) * f, one_minus_f, out=q[:, :, 0])  # ∂a_f/∂h_t
        torch.mul(one_minus_f, 1.0 - c * c, out=q[:, :, 1])  # ∂a_c/∂h_t
        grad_a, grad_h0 = _backward_scan(grad_hs.contiguous(), q, f, w_hh)
        need = ctx.needs_input_grad
        grad_w, grad_ih, grad_b = weight_grads(x, grad_a, h_prev, need[1], need[3])
        grad_x = grad_a @ w_ih if need[0] else None
        return grad_x, grad_ih, grad_w if need[2] else None, grad_b, grad_h0 if need[4] else None


def janet_scan(
    x: torch.Tensor, h0: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """All hidden states [T, B, N] of JANET (`JANETScan`)."""
    return JANETScan.apply(x, w_ih, w_hh, bias, h0)  # type: ignore[no-any-return]


class GRUScan(torch.autograd.Function):
    """`nn.GRU`'s recurrence over a whole sequence (the equations in `trainers.cells.gru`).

    Forward per step: one addmm gives [a_r − W_ir x − b_ir … ] — precisely, the recurrent matmul
    is added onto C_t = [W_ir x_t + b_ir + b_hr, W_iz x_t + b_iz + b_hz, b_hn] (made for all steps
    before the loop), so its r and z blocks are the gates' whole pre-activations and its n block is
    W_hn h + b_hn; then sigmoid on r, z in place, n = tanh(W_in x_t + b_in + r ⊙ (W_hn h + b_hn))
    (addcmul, tanh), h_t = lerp(n, h_{t−1}, z): 5 ops. torch's kernel adds the two biases and the
    two products in another order, so the last bits differ from `nn.GRU`.
    Backward: with ∂a_n = dh (1 − z)(1 − n²) (n's pre-activation),
        ∂a_r = ∂a_n ⊙ (W_hn h + b_hn) ⊙ r (1 − r),  ∂a_z = dh ⊙ (h_{t−1} − n) ⊙ z (1 − z),
        ∂(W_hn h + b_hn) = ∂a_n ⊙ r,  carry = z;
    Q holds those three and ∂a_n itself (the gradient of W_in x_t + b_in), four blocks.
    Inputs: x [T, B, d], weight_ih [3N, d], weight_hh [3N, N], bias_ih [3N], bias_hh [3N], h0 [B, N].
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        w_ih: torch.Tensor,
        w_hh: torch.Tensor,
        b_ih: torch.Tensor,
        b_hh: torch.Tensor,
        h0: torch.Tensor,
    ) -> torch.Tensor:
        T, B, d = x.shape
        N = h0.shape[1]
        gi = torch.addmm(b_ih, x.reshape(T * B, d), w_ih.t()).view(T, B, 3 * N)  # W_i x_t + b_i, all t
        gates = torch.empty_like(gi)  # C_t, then += h_{t−1} W_hᵀ, then σ on r and z in place
        torch.add(gi[..., : 2 * N], b_hh[: 2 * N], out=gates[..., : 2 * N])
        gates[..., 2 * N :] = b_hh[2 * N :]
        cand = torch.empty(T, B, N, dtype=h0.dtype, device=h0.device)  # n_t
        hs = torch.empty_like(cand)
        w_hh_t = w_hh.t()  # [N, 3N]
        steps = zip(  # views made once
            gates.unbind(0),
            *(gates[..., i * N : j * N].unbind(0) for i, j in ((0, 2), (0, 1), (1, 2), (2, 3))),
            gi[..., 2 * N :].unbind(0),
            cand.unbind(0),
            hs.unbind(0),
            strict=True,
        )
        h = h0
        for a, rz, r, z, hn, xn, n, h_t in steps:
            a.addmm_(h, w_hh_t)  # [a_r, a_z, W_hn h + b_hn]   [B, 3N]
            rz.sigmoid_()  # r_t, z_t
            torch.addcmul(xn, r, hn, out=n).tanh_()  # n_t = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn))
            h = torch.lerp(n, h, z, out=h_t)  # (1 − z) ⊙ n + z ⊙ h_{t−1}
        ctx.save_for_backward(x, w_ih, w_hh, gates, cand, hs, h0)
        return hs

    @staticmethod
    def backward(ctx: Any, grad_hs: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, w_ih, w_hh, gates, n, hs, h0 = ctx.saved_tensors
        T, B, N = hs.shape
        r, z, hn = gates[..., :N], gates[..., N : 2 * N], gates[..., 2 * N :]
        h_prev = torch.cat([h0.unsqueeze(0), hs[:-1]])  # h_{t−1}   [T, B, N]
        q = torch.empty(T, B, 4, N, dtype=hs.dtype, device=hs.device)
        qn = torch.mul(1.0 - z, 1.0 - n * n, out=q[:, :, 3])  # ∂a_n/∂h_t
        torch.mul(qn * hn, r * (1.0 - r), out=q[:, :, 0])  # ∂a_r/∂h_t
        torch.mul((h_prev - n) * z, 1.0 - z, out=q[:, :, 1])  # ∂a_z/∂h_t
        torch.mul(qn, r, out=q[:, :, 2])  # ∂(W_hn h + b_hn)/∂h_t
        grad_a, grad_h0 = _backward_scan(grad_hs.contiguous(), q, z, w_hh)  # [T, B, 4N]
        grad_gh = grad_a[..., : 3 * N]  # ∂L/∂(W_h h_{t−1} + b_h): blocks r, z, hn (strided views)
        grad_gi = (grad_a[..., : 2 * N], grad_a[..., 3 * N :])  # ∂L/∂(W_i x_t + b_i): blocks r, z | n
        need = ctx.needs_input_grad
        grad_w, _, grad_bh = weight_grads(x, grad_gh, h_prev, False, need[4])
        grad_ih = grad_bi = grad_x = None
        if need[1] or need[3]:
            (ih_rz, bi_rz), (ih_n, bi_n) = (input_grads(x, ga, need[1], need[3]) for ga in grad_gi)
            grad_ih = torch.cat([ih_rz, ih_n]) if ih_rz is not None and ih_n is not None else None
            grad_bi = torch.cat([bi_rz, bi_n]) if bi_rz is not None and bi_n is not None else None
        if need[0]:
            grad_x = grad_gi[0] @ w_ih[: 2 * N] + grad_gi[1] @ w_ih[2 * N :]
        return grad_x, grad_ih, grad_w if need[2] else None, grad_bi, grad_bh, grad_h0 if need[5] else None


def gru(
    x: torch.Tensor,
    h0: torch.Tensor,
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
    b_ih: torch.Tensor,
    b_hh: torch.Tensor,
    backend: str = "auto",
) -> torch.Tensor:
    """All hidden states [T, B, N] of `nn.GRU`'s recurrence on these weights.

    backend: `scan` (`GRUScan`), `native` (`torch._VF.gru`, what `nn.GRU` calls; cuDNN on GPU) or
    `auto`, the scan on the CPU (measured faster there: `benchmarks/cells.py`) and native elsewhere.
    """
    if backend not in ("auto", "scan", "native"):
        raise ValueError(f"backend {backend!r}: choose auto, scan or native")
    if backend == "native" or (backend == "auto" and x.device.type != "cpu"):
        params = [w_ih, w_hh, b_ih, b_hh]
        # _VF.gru(input, h0, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
        out, _ = torch._VF.gru(
            x, h0.unsqueeze(0), params, True, 1, 0.0, torch.is_grad_enabled(), False, False
        )
        return out
    return GRUScan.apply(x, w_ih, w_hh, b_ih, b_hh, h0)  # type: ignore[no-any-return]


def gru_reset_before(
    x: torch.Tensor, h0: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """All hidden states [T, B, N] of the GRU with the reset gate before the recurrent product
    (`trainers.cells.gru`, `reset="before"`; the NRU authors' myTorch GRUCell):

        r, z = σ(W_i[r,z] x_t + W_h[r,z] h_{t−1} + b_[r,z]),  n = tanh(W_in x_t + W_hn (r ⊙ h_{t−1}) + b_n),
        h_t = (1 − z) ⊙ n + z ⊙ h_{t−1}.

    Plain autograd, step by step: r enters the candidate's product, so its backward is not the
    elementwise recursion `_backward_scan` takes. Inputs: x [T, B, d], w_ih [3N, d], w_hh [3N, N],
    bias [3N], h0 [B, N]."""
    T, B, d = x.shape
    N = h0.shape[1]
    gi = torch.addmm(bias, x.reshape(T * B, d), w_ih.t()).view(T, B, 3 * N)  # W_i x_t + b, all t
    w_rz, w_n = w_hh[: 2 * N].t(), w_hh[2 * N :].t()  # [N, 2N], [N, N]
    h, hs = h0, []
    for g in gi.unbind(0):
        rz = torch.sigmoid(torch.addmm(g[:, : 2 * N], h, w_rz))
        r, z = rz[:, :N], rz[:, N:]
        n = torch.tanh(torch.addmm(g[:, 2 * N :], r * h, w_n))
        h = torch.lerp(n, h, z)  # (1 − z) ⊙ n + z ⊙ h_{t−1}
        hs.append(h)
    return torch.stack(hs)


def lstm_peepholes(
    x: torch.Tensor,
    h0: torch.Tensor,
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
    bias: torch.Tensor,
    peephole: torch.Tensor,
) -> torch.Tensor:
    """All hidden states [T, B, N] of the LSTM with diagonal peepholes (`trainers.cells.lstm`,
    `peepholes`; the NRU authors' myTorch LSTMCell, Graves 2013), gate order i, f, g, o:

        i = σ(a_i + p_i ⊙ c_{t−1}),  f = σ(a_f + p_f ⊙ c_{t−1}),  g = tanh(a_g),  c_t = f ⊙ c_{t−1} + i ⊙ g,
        o = σ(a_o + p_o ⊙ c_t),  h_t = o ⊙ tanh(c_t),   a = W_i x_t + W_h h_{t−1} + b,

    from h_0 = c_0 = `h0`. Plain autograd, step by step (torch's LSTM kernel has no peepholes). Inputs:
    x [T, B, d], w_ih [4N, d], w_hh [4N, N], bias [4N], peephole [3, N] (rows i, f, o), h0 [B, N]."""
    T, B, d = x.shape
    N = h0.shape[1]
    gx = torch.addmm(bias, x.reshape(T * B, d), w_ih.t()).view(T, B, 4 * N)  # W_i x_t + b, all t
    w_hh_t = w_hh.t()  # [N, 4N]
    p_i, p_f, p_o = peephole.unbind(0)
    h, c, hs = h0, h0, []
    for g_t in gx.unbind(0):
        a = torch.addmm(g_t, h, w_hh_t)  # [B, 4N]
        i = torch.sigmoid(torch.addcmul(a[:, :N], c, p_i))
        f = torch.sigmoid(torch.addcmul(a[:, N : 2 * N], c, p_f))
        c = f * c + i * torch.tanh(a[:, 2 * N : 3 * N])
        o = torch.sigmoid(torch.addcmul(a[:, 3 * N :], c, p_o))
        h = o * torch.tanh(c)
        hs.append(h)
    return torch.stack(hs)
