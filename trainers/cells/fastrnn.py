"""FastRNN (Kusupati et al. 2018) as written by the SGORNN authors (`sgornn/layers.py:FastRNNCell`).

docs/protocol.md §5. An inner Elman cell on the FastRNN state, mixed back through two scalar gates:

    z_t = f(W x_t + U h_{t−1} + b)          (the wrapped Keras SimpleRNNCell(relu))
    h_t = a·z_t + β·h_{t−1},   h_0 = 0       (SGORNN paper eq. 1 with U unconstrained)
    a = sigmoid(α_raw),  β = sigmoid(β_raw),  α_raw = −3.75, β_raw = 3.0 at init (a ≈ 0.0230, β ≈ 0.9526)
    if clip_scalar:  β ← clip(β, 0, 1 − 2a)   (SGORNN eq. 3; Keras K.clip, gradient reaches a when active)

U: Keras orthogonal init (gain 1); W: Glorot-uniform; b = 0. `clip_scalar` defaults to True because
the authors' `FastRNNModel` — which builds FastRNN, SGORNN-V and SGORNN-E alike — defaults to it and
their scripts only turn it off with `--no-scalar-clip`; the paper states the constraint for SGORNN
only and Kusupati's original has no clip, so a study of "FastRNN as published" sets it to False.

`ScalarGates` and `fast_rnn` (the recurrence, a hand-written autograd Function) are shared with
SGORNN (`trainers.cells.sgornn`), which only swaps U for VPRNN's rotations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from trainers.cells.base import Cell
from trainers.initializers import glorot_uniform, random_orthogonal
from trainers.kernels import (
    ACTIVATIONS,
    Workspace,
    act_,
    act_grad,
    member_acts,
    member_gemms,
    project_members,
)


class ScalarGates(nn.Module):
    """FastRNN's two scalar gates (a, β) from raw parameters, with SGORNN's optional clip β ≤ 1 − 2a."""

    def __init__(self, alpha_init: float, beta_init: float, clip: bool) -> None:
        super().__init__()
        self.alpha_raw = nn.Parameter(torch.tensor([alpha_init]))  # Keras shape (1, 1): one number
        self.beta_raw = nn.Parameter(torch.tensor([beta_init]))
        self.clip = clip

    def forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        return scalar_gates(self.alpha_raw, self.beta_raw, self.clip)


def scalar_gates(
    alpha_raw: torch.Tensor, beta_raw: torch.Tensor, clip: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, β) = (sigmoid(α_raw), sigmoid(β_raw)), β clipped to [0, 1 − 2a] with `clip` (eq. 3)."""
    a = torch.sigmoid(alpha_raw)
    b = torch.sigmoid(beta_raw)
    if clip:  # K.clip(b, 0, 1 − 2a) = max(min(b, 1 − 2a), 0), as TF 1.x computes clip_by_value
        b = torch.minimum(b, 1.0 - 2.0 * a).clamp_min(0.0)
    return a, b


def reads_before_last(grads: torch.Tensor, time_dim: int) -> bool:
    """Whether the loss's gradient w.r.t. the states is non-zero at any step before the last. The step
    before the last is looked at first: a per-step loss answers there, without scanning the whole
    store (a full `any()` over a large store costs a noticeable share of a step)."""
    steps = grads.shape[time_dim]
    if steps < 2:
        return False
    return bool(grads.select(time_dim, steps - 2).any()) or bool(grads.narrow(time_dim, 0, steps - 1).any())


class FastRNNScan(torch.autograd.Function):
    """h_t = a·f(xp_t + h_{t−1} Wᵀ) + β·h_{t−1} for all t (h_{−1} = 0), as one autograd node.

    The loop runs on the ungated state u_t = h_t / a (no division: u is built directly),
        pre_t = xp_t + a·u_{t−1} Wᵀ,   z_t = f(pre_t),   u_t = z_t + β·u_{t−1},   h = a·u,
    which is 3 ops per step forward (addmm, f, add) where the literal form needs 4. Backward runs on
    e_t = ∂L/∂h_t (through all later steps): ∂pre_t = a·f'_t ⊙ e_t, e_{t−1} = g_{t−1} + β e_t + ∂pre_t W,
    2 ops per step (3 when the loss reads more than the last state); ∂W, ∂a, ∂β are reductions over
    all steps after the loop. Shapes: xp [T, B, N], w [N, N], a and β [1].
    """

    @staticmethod
    def forward(
        ctx: Any, xp: torch.Tensor, w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, nonlinearity: str
    ) -> torch.Tensor:
        av, bv = float(a), float(b)
        zs = torch.empty_like(xp)  # z_t = f(pre_t), the inner cell's output
        us = torch.empty_like(xp)  # u_t = h_t / a
        u = xp.new_zeros(xp.shape[1:])  # u_{−1} = h_{−1} / a = 0
        # a·W formed once, not as addmm's alpha: where MKL applies alpha (to an operand, or to the
        # product) depends on its code path, and a fused bundle must round as this loop does
        wat = torch.mul(w, av).t()
        for xp_t, z_t, u_t in zip(
            xp.unbind(0), zs.unbind(0), us.unbind(0), strict=True
        ):  # views, unbound once
            torch.addmm(xp_t, u, wat, out=z_t)  # pre_t = xp_t + a·u_{t−1} Wᵀ
            act_(z_t, nonlinearity)  # z_t = f(pre_t), in place
            u = torch.add(z_t, u, alpha=bv, out=u_t)  # u_t = z_t + β u_{t−1}
        ctx.nonlinearity = nonlinearity
        ctx.coefs = (av, bv)
        ctx.save_for_backward(zs, us, w, a, b)
        return us * av  # h_t = a u_t

    @staticmethod
    def backward(ctx: Any, grad_hs: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        zs, us, w, a, b = ctx.saved_tensors
        av, bv = ctx.coefs
        T, _B, N = us.shape
        grad_hs = grad_hs.contiguous()
        only_last = not reads_before_last(grad_hs, 0)  # e.g. a readout of the last state only
        fprime_a = act_grad(zs, ctx.nonlinearity).mul_(av)  # ∂h_t/∂pre_t = a f'(pre_t), all t at once
        e = torch.empty_like(us)  # e_t = ∂L/∂h_t, total
        grad_pre = torch.empty_like(us)  # ∂L/∂pre_t
        es, gs, fs, gh = e.unbind(0), grad_pre.unbind(0), fprime_a.unbind(0), grad_hs.unbind(0)
        es[T - 1].copy_(gh[T - 1])
        for t in range(T - 1, 0, -1):
            torch.mul(es[t], fs[t], out=gs[t])
            torch.mul(es[t], bv, out=es[t - 1])  # β e_t (not addmm's beta: see forward's a·W)
            torch.addmm(es[t - 1], gs[t], w, out=es[t - 1])  # + ∂pre_t W
            if not only_last:
                es[t - 1].add_(gh[t - 1])  # + g_{t−1}
        torch.mul(es[0], fs[0], out=gs[0])
        # h_{−1} = 0, so step 0 adds nothing to ∂W and ∂β; flat views avoid [T, B, N] temporaries
        g_pre, u_prev, e_next = grad_pre[1:].reshape(-1, N), us[:-1].reshape(-1, N), e[1:].reshape(-1)
        grad_w = (g_pre.t() @ u_prev).mul_(av)  # Σ_t ∂pre_tᵀ h_{t−1}
        grad_a = torch.dot(e.reshape(-1), zs.reshape(-1)).reshape(a.shape)  # Σ_t e_t · z_t
        grad_b = torch.dot(e_next, u_prev.reshape(-1)).mul(av).reshape(b.shape)  # Σ_t e_t · h_{t−1}
        return grad_pre, grad_w, grad_a, grad_b, None


def fast_rnn(
    x: torch.Tensor,
    w_in: torch.Tensor,
    w_rec: torch.Tensor,
    bias: torch.Tensor | None,
    a: torch.Tensor,
    b: torch.Tensor,
    nonlinearity: str,
) -> torch.Tensor:
    """All states [T, B, N] of h_t = a·f(W_rec h_{t−1} + W_in x_t + bias) + β·h_{t−1}, h_{−1} = 0, x [T, B, d]."""
    if nonlinearity not in ACTIVATIONS:
        raise ValueError(f"nonlinearity {nonlinearity!r}: choose one of {', '.join(ACTIVATIONS)}")
    return FastRNNScan.apply(input_projection(x, w_in, bias), w_rec, a, b, nonlinearity)  # type: ignore[no-any-return]


def input_projection(x: torch.Tensor, w_in: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """xp = x W_inᵀ + bias [T, B, N], for all steps at once (a fused bundle runs it per member)."""
    xp = x @ w_in.t()
    return xp + bias if bias is not None else xp


class FusedFastRNNScan(torch.autograd.Function):
    """`fast_rnn` for K independent networks at once (a fused trial bundle, `trainers.fused`).

    Inputs: input weights W_in [K, N, d], bias [K, N] or None, W [K, N, N], a and β [K, 1], and
    member k's inputs xs[k] [T, B, d] (no gradient). Outputs: member k's states h [T, B, N], or with
    `last` only h_T [B, N]. Each member's numbers are its solo `fast_rnn`'s:
    - the input projection is written per member straight into its block (`project_members`), and
      its gradients are the ones autograd takes through the solo `input_projection` (`_projection_grads`);
    - the solo loop scales W by a and e by β itself (not through addmm's alpha and beta, which MKL
      applies in different places on different code paths), so its `addmm(xp, u, (aW)ᵀ)` is
      `baddbmm(xp, u, (aW)ᵀ)` and `addmm(β·e, g, W)` is `baddbmm(β·e, g, W)`, per member, for the
      shapes where a batched GEMM runs addmm's kernel;
    - `add(z, u, alpha=β)` rounds as `addcmul(z, u, β)` with β a per-row scalar, and f splits each
      member's elements between torch's vectorised and scalar paths as a solo call does.
    Per step: baddbmm, f, a copy and addcmul forward; mul, mul, baddbmm and a copy (and an add where
    the loss reads a sequence) backward; ∂W, ∂a, ∂β, ∂W_in, ∂b per member after the loop with the solo code.
    Stores are member-major [K, T, B, N] and live in `workspace` (the outputs too: valid until its
    next use), so no step maps fresh pages for them. Nothing is read on the host (a and β stay on the
    device), so a CUDA graph can hold the step (`trainers.fused.graphs`).
    """

    @staticmethod
    def forward(
        ctx: Any,
        w_in: torch.Tensor,
        bias: torch.Tensor | None,
        w: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        nonlinearity: str,
        last: bool,
        workspace: Workspace | None,
        *xs: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        ws = workspace if workspace is not None else Workspace()
        xp = project_members(xs, w_in, bias, ws)  # member k's x W_inᵀ + b
        K, T, B, N = xp.shape
        acol, bcol = a.view(K, 1, 1), b.view(K, 1, 1)
        wa = torch.mul(w, acol, out=torch.empty_like(w))  # a_k W_k, in W_k's own layout
        wat = wa.transpose(1, 2)
        zs = ws.get("zs", (K, T, B, N), xp)  # z_t = f(pre_t), member-major
        us = ws.get("us", (K, T, B, N), xp)  # u_t = h_t / a
        step = ws.get("step", (K, B, N), xp)  # this step's pre_t, then z_t, contiguous
        scratch = ws.get("scratch", (K, B, N), xp)
        (act,) = member_acts(nonlinearity, [step], scratch)
        xps, z_t, u_t = xp.unbind(1), zs.unbind(1), us.unbind(1)  # views made once
        (baddbmm, _), addcmul = member_gemms(xp.device, B, N), torch.addcmul
        u = ws.get("u0", (K, B, N), xp).zero_()  # u_{−1} = 0
        for t in range(T):
            baddbmm(xps[t], u, wat, out=step)  # pre_t = xp_t + a·u_{t−1} Wᵀ
            z = act()  # z_t = f(pre_t), in place
            z_t[t].copy_(z)
            u = addcmul(z, u, bcol, out=u_t[t])  # u_t = z_t + β u_{t−1}
        ctx.nonlinearity, ctx.last, ctx.workspace, ctx.has_bias = nonlinearity, last, ws, bias is not None
        ctx.save_for_backward(zs, us, w_in, w, a, b, *xs)
        if last:
            return tuple((us[:, T - 1] * acol).unbind(0))
        hs = torch.mul(us, acol.view(K, 1, 1, 1), out=ws.get("hs", (K, T, B, N), xp))  # h = a u
        return tuple(hs.unbind(0))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        zs, us, w_in, w, a, b, *xs = ctx.saved_tensors
        ws: Workspace = ctx.workspace
        K, T, B, N = zs.shape
        acol4, bcol = a.view(K, 1, 1, 1), b.view(K, 1, 1)
        shape = (B, N) if ctx.last else (T, B, N)
        gk = [g if g is not None else w.new_zeros(shape) for g in grads]
        e = ws.get("e", (K, T, B, N), w)  # e_t = ∂L/∂h_t, total
        grad_pre = ws.get("xp", (K, T, B, N), w)  # ∂L/∂pre_t, in the forward's xp (dead by now)
        if ctx.last:  # the loss reads h_T only: FastRNNScan's only_last
            gh = None
            torch.stack(gk, out=e[:, T - 1])
        else:  # the loss reads a sequence: g_{t−1} added at every step, read on the device, not asked
            # first (`reads_before_last`, a host read a CUDA graph cannot hold); where it is zero, adding
            # it moves no bit but a zero's sign
            gh = torch.stack(gk, out=ws.get("grad_hs", (K, T, B, N), w))
            e[:, T - 1].copy_(gh[:, T - 1])
        fprime_a = act_grad(zs, ctx.nonlinearity, out=ws.get("fprime", (K, T, B, N), w)).mul_(acol4)
        es, gs, fs = e.unbind(1), grad_pre.unbind(1), fprime_a.unbind(1)
        g_prev = gh.unbind(1) if gh is not None else None
        dh_buf = ws.get("dh", (2, K, B, N), w).unbind(0)
        mul, (baddbmm, _) = torch.mul, member_gemms(w.device, B, N)
        for t in range(T - 1, 0, -1):
            mul(es[t], fs[t], out=gs[t])  # ∂pre_t = a f'_t ⊙ e_t
            dh = mul(es[t], bcol, out=dh_buf[t & 1])  # β e_t
            baddbmm(dh, gs[t], w, out=dh)  # + ∂pre_t W
            if g_prev is not None:
                dh.add_(g_prev[t - 1])  # + g_{t−1}
            es[t - 1].copy_(dh)
        mul(es[0], fs[0], out=gs[0])
        grad_w, grad_a, grad_b, grad_in, grad_bias = [], [], [], [], []
        for k, x in enumerate(xs):  # FastRNNScan's reductions, per member, on its contiguous slices
            av = a[k]  # [1], on the device: the product rounds as by FastRNNScan's float (one float32 mul)
            g_pre, u_prev, e_next = (
                grad_pre[k, 1:].reshape(-1, N),
                us[k, :-1].reshape(-1, N),
                e[k, 1:].reshape(-1),
            )
            grad_w.append((g_pre.t() @ u_prev).mul_(av))
            grad_a.append(torch.dot(e[k].reshape(-1), zs[k].reshape(-1)).reshape(a.shape[1:]))
            grad_b.append(torch.dot(e_next, u_prev.reshape(-1)).mul(av).reshape(b.shape[1:]))
            v, bk = _projection_grads(x, w_in[k], grad_pre[k], ctx.has_bias)
            grad_in.append(v)
            grad_bias.append(bk)
        return (
            torch.stack(grad_in),
            torch.stack(grad_bias) if ctx.has_bias else None,  # type: ignore[arg-type]
            torch.stack(grad_w),
            torch.stack(grad_a),
            torch.stack(grad_b),
            None,
            None,
            None,
            *([None] * len(xs)),
        )


def _projection_grads(
    x: torch.Tensor, w_in: torch.Tensor, grad: torch.Tensor, need_bias: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(∂W_in, ∂bias) of `input_projection(x, w_in, bias)` for ∂L/∂xp `grad` [T, B, N], the very ops
    autograd runs for it: `x @ w_in.t()` folds x to [T·B, d] and calls mm, whose gradient for a
    column-major second operand (w_in.t() of a row-major w_in) is `(gradᵀ x)ᵀ`, else `xᵀ grad`
    (torch's `mm_mat2_backward`); `+ bias` sums the gradient over the leading dims (`sum_to_size`)."""
    x2d, g2d = x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1])
    wt = w_in.t()
    column_major = wt.stride(0) == 1 and wt.stride(1) == wt.shape[0]
    grad_w = g2d.t().mm(x2d) if column_major else x2d.t().mm(g2d).t()  # ∂W_in = (∂(w_in.t()))ᵀ
    return grad_w, grad.sum((0, 1), keepdim=True).view(-1) if need_bias else None


def fused_fast_rnn(
    xs: Sequence[torch.Tensor],
    w_in: torch.Tensor,
    bias: torch.Tensor | None,
    w_rec: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    nonlinearity: str,
    last: bool = False,
    workspace: Workspace | None = None,
) -> tuple[torch.Tensor, ...]:
    """K networks h_t = a_k·f(W_rec,k h_{t−1} + W_in,k x_t + bias_k) + β_k·h_{t−1} on xs[k] [T, B, d]:
    member k's states [T, B, N] (or [B, N], the last step only, with `last`), each bit for bit its
    `fast_rnn`'s. Outputs live in `workspace` until its next use."""
    if nonlinearity not in ACTIVATIONS:
        raise ValueError(f"nonlinearity {nonlinearity!r}: choose one of {', '.join(ACTIVATIONS)}")
    return FusedFastRNNScan.apply(w_in, bias, w_rec, a, b, nonlinearity, last, workspace, *xs)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class FastRNNConfig:
    alpha_init: float = -3.75  # raw gate: a = sigmoid(α_raw) ≈ 0.0230
    beta_init: float = 3.0  # raw gate: β = sigmoid(β_raw) ≈ 0.9526
    clip_scalar: bool = True  # β ≤ 1 − 2a (the authors' FastRNNModel default; see the module docstring)
    nonlinearity: Literal["elu", "relu", "tanh"] = "relu"
    bias: bool = True  # Keras SimpleRNNCell bias, zero-initialised


class FastRNNCell(Cell):
    name = "fastrnn"
    Config = FastRNNConfig
    config: FastRNNConfig

    def __init__(
        self, config: FastRNNConfig, input_size: int, hidden_size: int, gen: torch.Generator
    ) -> None:
        super().__init__(config, input_size, hidden_size, gen)
        self.weight_ih = nn.Parameter(glorot_uniform(hidden_size, input_size, gen))  # W [N, d]
        self.weight_hh = nn.Parameter(random_orthogonal(hidden_size, gen))  # U [N, N], Keras Orthogonal
        self.bias = nn.Parameter(torch.zeros(hidden_size)) if config.bias else None
        self.gates = ScalarGates(config.alpha_init, config.beta_init, config.clip_scalar)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.gates()
        return fast_rnn(x, self.weight_ih, self.weight_hh, self.bias, a, b, self.config.nonlinearity)

    def recurrent_matrix(self) -> torch.Tensor:
        return self.weight_hh.detach()
