"""The hot path: the Elman recurrence h_t = f(a_t), a_t = xp_t + W h_{t−1}, over all T steps.

Three implementations, the first two chosen by `elman_rnn`:
- `native`: torch's own RNN kernel (`torch._VF.rnn_relu / rnn_tanh`, what `nn.RNN` calls; cuDNN on
  GPU), for relu and tanh. We pass our own parameters so the cell keeps ONE bias b (Keras
  SimpleRNN / the paper) — `nn.RNN` would train two (b_ih + b_hh), which doubles the bias's step
  under RMSprop. Only when asked for: on a GPU its solo step is much faster than the scan's, but it
  sums in another order than a bundle's scan, so its runs part from their bundled runs (both,
  measured: docs/gpu.md).
- `scan`: a hand-written autograd Function for any f whose derivative is a function of f's output
  (elu, relu, tanh). Autograd would record ~6 nodes per step; this records one node for the whole
  sequence, runs 2 ops per step forward (addmm, f) and 2 per step backward (mul, addmm), and
  computes ∂W, ∂V and ∂b with one large product or sum each after the loop. `auto` picks it on
  every device, so that a trial computes what its bundled run (`FusedElmanScan`) computes, as Keras'
  SimpleRNN (a loop of matmuls, no cuDNN kernel) did; on the CPU it is also faster than torch's native
  kernel even for relu (`benchmarks/rnn_loop.py`; docs/speed.md).
- `persistent`: the Triton kernel of `trainers.kernels_persistent` (issue 37), W on chip for all T steps,
  a solo run as a bundle of one (the very program a bundle's member runs; `trainers.cells.rnn.recurrence`
  picks it). Only when asked for: on CUDA it is not yet measured, and on the CPU it runs only under
  Triton's interpreter (a slow check of its arithmetic; docs/gpu.md).
Shapes are time-major: x [T, B, d], h0 [B, N]; the input projection xp = x Vᵀ + b [T, B, N] is
one matmul over all steps, hoisted out of the loop.

`FusedElmanScan` (via `fused_elman_rnn`) runs K independent networks of one shape at once — a
fused trial bundle (`trainers.fused`) — with one batched matmul per step for all K, and each
member's numbers bit for bit those `ElmanScan` computes for it alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch

from trainers.numerics import ATEN_SMALL_BATCHED_GEMM, batched_gemm_rounds_as_single

ACTIVATIONS = ("elu", "relu", "tanh")
#: `elman_rnn`'s implementations of the recurrence (a cell's `backend` field)
BACKENDS = ("auto", "scan", "native", "persistent")


def act_(a: torch.Tensor, nonlinearity: str, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """f applied in place (`scratch`, like a: elu's buffer; a fresh one when None)."""
    if nonlinearity == "elu":
        return elu_(a, scratch)
    if nonlinearity == "relu":
        return a.relu_()
    return a.tanh_()


def elu_(a: torch.Tensor, scratch: torch.Tensor | None = None, exp_: Any = torch.Tensor.exp_) -> torch.Tensor:
    """elu in place as TensorFlow's Elu kernel computes it — a if a ≥ 0, else exp(a) − 1 — which is
    what Orhan & Pitkow's Keras code ran, written max(a, 0) + (exp(min(a, 0)) − 1).

    torch's own elu uses expm1, several times slower than exp on the CPU (docs/speed.md); the two
    differ by ~1e-7 (absolute) for a < 0. Only exp may round differently between torch's
    vectorised and scalar paths; clamp, add and subtract are exact on either (`exp_`: how to take
    exp in place, e.g. per member as `member_acts` does).
    """
    s = torch.clamp_max(a, 0.0, out=scratch) if scratch is not None else a.clamp_max(0.0)
    exp_(s).sub_(1.0)
    return a.clamp_min_(0.0).add_(s)


def _solo_parts(x: torch.Tensor) -> list[torch.Tensor]:
    """Views of x [K, B, N] on which to call an in-place elementwise op so that each member's
    elements round as one [B, N] call of `ElmanScan` rounds them.

    Only exp and tanh may round differently between torch's vectorised body and its scalar tail
    (clamp, add and subtract are exact on either path). On the CPU the body takes whole blocks of
    two vectors, so a member's last B·N mod block elements go the scalar way alone: the op runs on
    every member's body at once, then on every member's tail. Elsewhere one call suffices.
    """
    if x.device.type != "cpu":
        return [x]
    rows = x.view(x.shape[0], -1)  # [K, B·N]
    block = _CPU_BLOCK.get(torch.backends.cpu.get_cpu_capability())
    if block is None:  # an unknown vector width: one call per member, as alone
        return list(rows.unbind(0))
    body = rows.shape[1] // block * block
    return [x] if body in (0, rows.shape[1]) else [rows[:, :body], rows[:, body:]]


#: float32 elements per vectorised iteration of torch's CPU elementwise loops (two vectors)
_CPU_BLOCK = {"AVX512": 32, "AVX2": 16, "DEFAULT": 16}


def member_acts(
    nonlinearity: str, blocks: Sequence[torch.Tensor], scratch: torch.Tensor
) -> list[Callable[[], torch.Tensor]]:
    """For each [K, B, N] block, a call that applies f to it in place and returns it, each member's
    elements rounded as one [B, N] call of `ElmanScan` rounds them (`scratch`: elu's buffer, like a
    block). The views are made once: a fused step's cost is mostly dispatch, not arithmetic."""
    if nonlinearity == "relu":  # one path for every element
        return [b.relu_ for b in blocks]
    if nonlinearity == "tanh":
        return [partial(_each_, _solo_parts(b), torch.Tensor.tanh_, b) for b in blocks]
    exp_ = partial(_each_, _solo_parts(scratch), torch.Tensor.exp_)
    return [partial(elu_, b, scratch, exp_) for b in blocks]


def _each_(
    parts: Sequence[torch.Tensor], op: Callable[[torch.Tensor], Any], whole: torch.Tensor
) -> torch.Tensor:
    for part in parts:
        op(part)
    return whole


def act_grad(h: torch.Tensor, nonlinearity: str, out: torch.Tensor | None = None) -> torch.Tensor:
    """f'(a) written through h = f(a): elu' = 1 (h > 0) or h + 1; relu' = [h > 0]; tanh' = 1 − h².

    With `out`, written into it (the same numbers: for h ≤ 0, h + 1 ≤ 1, and for h > 0, h + 1 > 1).
    """
    if out is None:
        if nonlinearity == "elu":
            return torch.where(h > 0, torch.ones_like(h), h + 1.0)
        if nonlinearity == "relu":
            return (h > 0).to(h.dtype)
        return 1.0 - h * h
    if nonlinearity == "elu":
        return torch.add(h, 1.0, out=out).clamp_max_(1.0)
    if nonlinearity == "relu":
        return torch.gt(h, 0, out=out)
    return torch.mul(h, h, out=out).neg_().add_(1.0)


class ElmanScan(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        w_in: torch.Tensor,
        bias: torch.Tensor | None,
        h0: torch.Tensor,
        w: torch.Tensor,
        nonlinearity: str,
    ) -> torch.Tensor:
        xp = x @ w_in.t()  # [T, B, N]: the input projection, hoisted out of the loop
        if bias is not None:
            xp = xp + bias
        hs = torch.empty_like(xp)
        wt = w.t()
        h = h0
        scratch = torch.empty_like(h0)
        act = partial(act_, nonlinearity=nonlinearity, scratch=scratch)
        addmm = torch.addmm
        for xp_t, hs_t in zip(xp.unbind(0), hs.unbind(0), strict=True):  # views made once
            addmm(xp_t, h, wt, out=hs_t)  # a_t = xp_t + h_{t−1} Wᵀ
            h = act(hs_t)  # h_t = f(a_t), in place
        ctx.nonlinearity = nonlinearity
        ctx.save_for_backward(x, w_in, hs, h0, w)
        return hs

    @staticmethod
    def backward(ctx: Any, grad_hs: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, w_in, hs, h0, w = ctx.saved_tensors
        T = hs.shape[0]
        fprime = act_grad(hs, ctx.nonlinearity)  # [T, B, N], all steps at once
        grad_a = torch.empty_like(hs)  # ∂L/∂a_t
        grad_hs = grad_hs.contiguous()
        g, fp, ga = grad_hs.unbind(0), fprime.unbind(0), grad_a.unbind(0)
        mul, addmm = torch.mul, torch.addmm
        dh = g[T - 1]
        for t in range(T - 1, 0, -1):
            mul(dh, fp[t], out=ga[t])
            dh = addmm(g[t - 1], ga[t], w)  # ∂L/∂h_{t−1} = g_{t−1} + ∂a_t·W
        mul(dh, fp[0], out=ga[0])
        h_prev = torch.cat([h0.unsqueeze(0), hs[:-1]])  # [T, B, N]
        grad_w, grad_in, grad_b = weight_grads(x, grad_a, h_prev, *ctx.needs_input_grad[1:3])
        grad_h0 = grad_a[0] @ w if ctx.needs_input_grad[3] else None
        grad_x = grad_a @ w_in if ctx.needs_input_grad[0] else None  # e.g. an embedding before the cell
        return grad_x, grad_in, grad_b, grad_h0, grad_w, None


def weight_grads(
    x: torch.Tensor, grad_a: torch.Tensor, h_prev: torch.Tensor, need_in: bool = True, need_b: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(∂W, ∂V, ∂b) of one network from its whole sequence — x [T, B, d], ∂a [T, B, G] and h_{t−1}
    [T, B, N] (G = N for the Elman cell, a multiple of N for gated cells) — one product or sum each;
    `ElmanScan`, every member of `FusedElmanScan` and the gated scans (`trainers.kernels_gated`)
    call this very code.

    ∂W = Σ_t ∂a_tᵀ h_{t−1}: one [G, T·B] × [T·B, N] matmul instead of T small ones; ∂V and ∂b as
    `input_grads`.
    """
    grad_w = grad_a.reshape(-1, grad_a.shape[-1]).t() @ h_prev.reshape(-1, h_prev.shape[-1])
    return (grad_w, *input_grads(x, grad_a, need_in, need_b))


def input_grads(
    x: torch.Tensor, grad_a: torch.Tensor, need_in: bool = True, need_b: bool = True
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(∂V, ∂b) of a = x Vᵀ + b + …, from x [T, B, d] and ∂a [T, B, G]: ∂V = (xᵀ ∂a)ᵀ, [d, T·B] ×
    [T·B, G] (the other order, ∂aᵀ x, is slower in MKL at small d: docs/speed.md); ∂b = Σ ∂a."""
    flat = grad_a.reshape(-1, grad_a.shape[-1])
    grad_in = (x.reshape(-1, x.shape[-1]).t() @ flat).t() if need_in else None
    grad_b = grad_a.sum((0, 1)) if need_b else None
    return grad_in, grad_b


def elman_rnn(
    x: torch.Tensor,
    h0: torch.Tensor,
    w_in: torch.Tensor,
    w_rec: torch.Tensor,
    bias: torch.Tensor | None,
    nonlinearity: str,
    backend: str = "auto",
) -> torch.Tensor:
    """All hidden states [T, B, N] of h_t = f(W_rec h_{t−1} + W_in x_t + b), for x [T, B, d]."""
    if nonlinearity not in ACTIVATIONS:
        raise ValueError(f"nonlinearity {nonlinearity!r}: choose one of {', '.join(ACTIVATIONS)}")
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}: choose auto, scan, native or persistent")
    if backend == "persistent":
        raise ValueError("backend 'persistent' runs through trainers.kernels_persistent (`recurrence`)")
    if backend == "native":
        if nonlinearity == "elu":
            raise ValueError("torch's native RNN kernel has no elu; use backend 'scan' or 'auto'")
        b = bias if bias is not None else torch.zeros(w_rec.shape[0], device=x.device, dtype=x.dtype)
        # cuDNN views its weights into one flat buffer, which a transposed W (an initialiser's Qᵀ) defeats:
        # contiguous copies here, through which autograd still reaches the parameters
        params = [w_in.contiguous(), w_rec.contiguous(), b, torch.zeros_like(b)]  # b_hh: a constant zero
        fn = torch._VF.rnn_relu if nonlinearity == "relu" else torch._VF.rnn_tanh
        out, _ = fn(x, h0.unsqueeze(0), params, True, 1, 0.0, torch.is_grad_enabled(), False, False)
        return out
    return ElmanScan.apply(x, w_in, bias, h0, w_rec, nonlinearity)  # type: ignore[no-any-return]


def elman_layer_norm(
    x: torch.Tensor,
    h0: torch.Tensor,
    w_in: torch.Tensor,
    w_rec: torch.Tensor,
    bias: torch.Tensor | None,
    ln_weight: torch.Tensor,
    ln_bias: torch.Tensor,
    nonlinearity: str,
    eps: float = 1e-5,
) -> torch.Tensor:
    """All hidden states [T, B, N] of h_t = f(LN(W_rec h_{t−1} + W_in x_t + b)), LN torch's LayerNorm over
    the N units with gain `ln_weight` and shift `ln_bias` [N] (the NRU authors' RNN-orth / RNN-id:
    `apsarath/myTorch:myTorch/memory/RNNCell.py`, `layer_norm: True`). Plain autograd, step by step: the
    normalisation couples every unit of a step, so its backward is not the elementwise recursion
    `ElmanScan` takes. f as the scan's (elu TensorFlow's formula, `elu_`)."""
    if nonlinearity not in ACTIVATIONS:
        raise ValueError(f"nonlinearity {nonlinearity!r}: choose one of {', '.join(ACTIVATIONS)}")
    T, B, d = x.shape
    N = h0.shape[1]
    flat = x.reshape(T * B, d)
    xp = (torch.addmm(bias, flat, w_in.t()) if bias is not None else flat @ w_in.t()).view(T, B, N)
    w_rec_t = w_rec.t()
    h, hs = h0, []
    for a in xp.unbind(0):
        z = torch.nn.functional.layer_norm(torch.addmm(a, h, w_rec_t), (N,), ln_weight, ln_bias, eps)
        h = _act(z, nonlinearity)
        hs.append(h)
    return torch.stack(hs)


def _act(a: torch.Tensor, nonlinearity: str) -> torch.Tensor:
    """f out of place, for autograd: `act_`'s numbers (elu as TensorFlow computes it, `elu_`)."""
    if nonlinearity == "elu":
        return a.clamp_min(0.0) + (a.clamp_max(0.0).exp() - 1.0)
    return torch.relu(a) if nonlinearity == "relu" else torch.tanh(a)


class Workspace:
    """Named buffers a caller reuses across calls of `FusedElmanScan`.

    A fresh [K, T, B, N] tensor per call (tens of MB: malloc maps fresh pages above 32 MB) costs a
    page fault per 4 KB touched, which costs more than the arithmetic on it (docs/speed.md). With a
    workspace, a call's outputs are valid until its next call.
    """

    def __init__(self) -> None:
        self.buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """Buffer `name` viewed as `shape` (contiguous, from its start); it grows, never shrinks."""
        numel = math.prod(shape)
        buf = self.buffers.get(name)
        if buf is None or buf.numel() < numel or buf.dtype != like.dtype or buf.device != like.device:
            buf = self.buffers[name] = torch.empty(numel, dtype=like.dtype, device=like.device)
        return buf[:numel].view(shape)


def project_members(
    xs: Sequence[torch.Tensor], w_in: torch.Tensor, bias: torch.Tensor | None, ws: Workspace
) -> torch.Tensor:
    """xp [K, T, B, N] in workspace buffer "xp": member k's `x @ w_in[k].t() + bias[k]` for xs[k]
    [T, B, d], bit for bit what the solo cell's projection gives (addmm rounds as mm then add:
    checked), written straight into the member's block (no [K, …] stack of K fresh tensors)."""
    (T, B, d), K, N = xs[0].shape, len(xs), w_in.shape[1]
    xp = ws.get("xp", (K, T, B, N), w_in)
    for k, x in enumerate(xs):
        out = xp[k].view(T * B, N)
        if out.data_ptr() % 16:  # MKL's rounding can depend on C's alignment: go via aligned memory
            out = ws.get("proj", (T * B, N), w_in)
        if bias is None:
            torch.mm(x.reshape(T * B, d), w_in[k].t(), out=out)
        else:
            torch.addmm(bias[k], x.reshape(T * B, d), w_in[k].t(), out=out)
        if out.data_ptr() != xp[k].data_ptr():
            xp[k].view(T * B, N).copy_(out)
    return xp


def member_gemms(
    device: torch.device, rows: int, n: int
) -> tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]]:
    """(baddbmm, bmm) for a fused scan's per-step products over K members, each [rows, n] × [n, n]:
    torch's batched GEMMs where they round each member as its solo addmm / mm does — MKL's batched GEMM
    where this process's MKL does at these shapes (`trainers.numerics.batched_gemm_rounds_as_single`:
    under the AUTO branch, asked once per shape), for products large
    enough that ATen hands them to MKL at all (rows·n·n ≥ ATEN_SMALL_BATCHED_GEMM) — and always on a
    GPU, where bit equality is not promised; else one addmm / mm per member: the solo op itself, on
    the member's slices (MKL's reproducibility mode makes a GEMM independent of alignment)."""
    if device.type != "cpu" or (
        rows * n * n >= ATEN_SMALL_BATCHED_GEMM and batched_gemm_rounds_as_single(rows, n)
    ):
        return torch.baddbmm, torch.bmm
    return _addmm_each, _mm_each


def _addmm_each(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    for ck, ak, bk, ok in zip(c.unbind(0), a.unbind(0), b.unbind(0), out.unbind(0), strict=True):
        torch.addmm(ck, ak, bk, out=ok)
    return out


def _mm_each(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    for ak, bk, ok in zip(a.unbind(0), b.unbind(0), out.unbind(0), strict=True):
        torch.mm(ak, bk, out=ok)
    return out


class FusedElmanScan(torch.autograd.Function):
    """`ElmanScan` for K independent networks at once (a fused trial bundle, `trainers.fused`).

    Inputs: h0 [K, B, N], input weights V [K, N, d], W [K, N, N], bias b [K, N] or None, and member
    k's inputs xs[k] [T, B, d] (no gradient). Outputs: member k's states [T, B, N], or with `last`
    only the last one [B, N] (a last-step readout then sends no [T, B, N] of zeros back).

    Per step: one baddbmm over all members and f on a contiguous [K, B, N] block, then a copy into
    the member-major store hs [K, T+1, B, N]; backward f', one mul and one (b)addbmm per step.
    Member-major storage keeps each member's outputs, ∂a and h_{t−1} rows contiguous, so nothing
    is transposed after the loop. Once per sequence, per member: the input projection, and ∂W, ∂V,
    ∂b, with the very ops `elman_rnn` and its autograd run. The batched matmul runs the same GEMM
    per member as `ElmanScan`'s addmm, and f splits each member's elements between torch's
    vectorised and scalar paths as a solo call does: each member's numbers are its solo run's
    (W must be laid out as the solo W: a transposed operand changes a GEMM's rounding). Buffers come
    from `workspace` (fresh tens of MB per call cost a page fault per 4 KB: `Workspace`).
    """

    @staticmethod
    def forward(
        ctx: Any,
        h0: torch.Tensor,
        w_in: torch.Tensor,
        w: torch.Tensor,
        bias: torch.Tensor | None,
        nonlinearity: str,
        last: bool,
        workspace: Workspace | None,
        *xs: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        ws = workspace if workspace is not None else Workspace()
        (T, B, _d), K, N = xs[0].shape, len(xs), w.shape[1]
        xp = project_members(xs, w_in, bias, ws)  # member k's x_t Vᵀ + b
        hs = ws.get("hs", (K, T + 1, B, N), h0)  # h_0 … h_T, member-major
        hs[:, 0].copy_(h0)
        step = ws.get("step", (2, K, B, N), h0)  # this step's a_t, then h_t, contiguous
        scratch = ws.get("scratch", (K, B, N), h0)
        wt = w.transpose(1, 2)
        # every view the loop touches, made up front (indexing in the loop cost ~15 % of the step)
        xps, states, steps = xp.unbind(1), hs.unbind(1), step.unbind(0)
        acts = member_acts(nonlinearity, steps, scratch)  # f in place on steps[0] or steps[1]
        baddbmm, _ = member_gemms(h0.device, B, N)
        h = h0
        for t in range(T):
            baddbmm(xps[t], h, wt, out=steps[t & 1])  # a_t = xp_t + h_{t−1} Wᵀ, per member
            h = acts[t & 1]()  # h_t = f(a_t)
            states[t + 1].copy_(h)
        ctx.nonlinearity, ctx.last, ctx.workspace, ctx.has_bias = nonlinearity, last, ws, bias is not None
        ctx.save_for_backward(hs, w, *xs)
        return tuple(hs[:, T].unbind(0) if last else hs[:, 1:].unbind(0))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        hs, w, *xs = ctx.saved_tensors
        K, T, B, N = hs.shape[0], hs.shape[1] - 1, hs.shape[2], hs.shape[3]
        ws: Workspace = ctx.workspace
        outs = hs[:, T].unbind(0) if ctx.last else hs[:, 1:].unbind(0)
        grads_k = [g if g is not None else torch.zeros_like(o) for g, o in zip(grads, outs, strict=True)]
        # ∂L/∂a_t = ∂L/∂h_t · f'(a_t), in the forward's xp buffer (dead once the loop has run): a
        # third less memory per bundle
        grad_a = ws.get("xp", (K, T, B, N), hs)
        dh_buf = ws.get("dh", (2, K, B, N), hs)
        if ctx.last:  # ∂L/∂h_t arrives only through h_{t+1}, but at the last step
            grad_hs = None
            dh = torch.stack(grads_k, out=dh_buf[T % 2])
        else:
            grad_hs = torch.stack(grads_k, out=ws.get("grad_hs", (K, T, B, N), hs))
            dh = grad_hs[:, T - 1]
        states, grads_a, dhs = hs.unbind(1), grad_a.unbind(1), dh_buf.unbind(0)
        nonlinearity, (baddbmm, bmm) = ctx.nonlinearity, member_gemms(hs.device, B, N)
        g_prev = grad_hs.unbind(1) if grad_hs is not None else None
        for t in range(T - 1, 0, -1):
            ga = act_grad(states[t + 1], nonlinearity, out=grads_a[t]).mul_(dh)  # step by step: in cache
            if g_prev is None:
                dh = bmm(ga, w, out=dhs[t & 1])  # ∂L/∂h_{t−1} = ∂a_t·W
            else:
                dh = baddbmm(g_prev[t - 1], ga, w, out=dhs[t & 1])  # g_{t−1} + ∂a_t·W
        act_grad(hs[:, 1], ctx.nonlinearity, out=grad_a[:, 0]).mul_(dh)
        # ∂W_k, ∂V_k, ∂b_k by ElmanScan's own code, per member, into fresh (aligned) memory (MKL's
        # rounding can depend on where C starts)
        per_member = [weight_grads(x, grad_a[k], hs[k, :T], True, ctx.has_bias) for k, x in enumerate(xs)]
        grad_w = torch.stack([g[0] for g in per_member])
        grad_in = torch.stack([g[1] for g in per_member if g[1] is not None])
        grad_b = torch.stack([g[2] for g in per_member if g[2] is not None]) if ctx.has_bias else None
        grad_h0 = bmm(grad_a[:, 0], w, out=torch.empty_like(dh)) if ctx.needs_input_grad[0] else None
        return (grad_h0, grad_in, grad_w, grad_b, None, None, None, *([None] * len(xs)))


def fused_elman_rnn(
    xs: Sequence[torch.Tensor],
    h0: torch.Tensor,
    w_in: torch.Tensor,
    w_rec: torch.Tensor,
    bias: torch.Tensor | None,
    nonlinearity: str,
    last: bool = False,
    workspace: Workspace | None = None,
) -> tuple[torch.Tensor, ...]:
    """K networks h_t = f(W_k h_{t−1} + V_k x_t + b_k) on xs[k] [T, B, d]: member k's states [T, B, N]
    (or [B, N], the last step only, with `last`). Outputs live in `workspace` until its next use."""
    if nonlinearity not in ACTIVATIONS:
        raise ValueError(f"nonlinearity {nonlinearity!r}: choose one of {', '.join(ACTIVATIONS)}")
    return FusedElmanScan.apply(h0, w_in, w_rec, bias, nonlinearity, last, workspace, *xs)  # type: ignore[no-any-return]
