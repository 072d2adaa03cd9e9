"""The hot path: the Elman recurrence h_t = f(a_t), a_t = xp_t + W h_{t−1}, over all T steps.

Two implementations, chosen by `elman_rnn`:
- `native`: torch's own RNN kernel (`torch._VF.rnn_relu / rnn_tanh`, what `nn.RNN` calls; cuDNN on
  GPU), for relu and tanh. We pass our own parameters so the cell keeps ONE bias b (Keras
  SimpleRNN / the paper) — `nn.RNN` would train two (b_ih + b_hh), which doubles the bias's step
  under RMSprop. `auto` picks it on CUDA.
- `scan`: a hand-written autograd Function for any f whose derivative is a function of f's output
  (elu, relu, tanh). Autograd would record ~6 nodes per step; this records one node for the whole
  sequence, runs 2 ops per step forward (addmm, f) and 2 per step backward (mul, addmm), and
  computes ∂W with one large matmul after the loop. `auto` picks it on the CPU for every f: measured
  by `benchmarks/rnn_loop.py`, it is faster than torch's native CPU kernel even for relu.
Shapes are time-major: xp [T, B, N] (input projection + bias, hoisted out of the loop), h0 [B, N].
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

ACTIVATIONS = ("elu", "relu", "tanh")


def _act_(a: torch.Tensor, nonlinearity: str) -> torch.Tensor:
    """f applied in place."""
    if nonlinearity == "elu":
        return F.elu_(a)
    if nonlinearity == "relu":
        return a.relu_()
    return a.tanh_()


def _act_grad(h: torch.Tensor, nonlinearity: str) -> torch.Tensor:
    """f'(a) written through h = f(a): elu' = 1 (h > 0) or h + 1; relu' = [h > 0]; tanh' = 1 − h²."""
    if nonlinearity == "elu":
        return torch.where(h > 0, torch.ones_like(h), h + 1.0)
    if nonlinearity == "relu":
        return (h > 0).to(h.dtype)
    return 1.0 - h * h


class ElmanScan(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, xp: torch.Tensor, h0: torch.Tensor, w: torch.Tensor, nonlinearity: str
    ) -> torch.Tensor:
        T = xp.shape[0]
        hs = torch.empty_like(xp)  # [T, B, N]
        wt = w.t()
        h = h0
        for t in range(T):
            torch.addmm(xp[t], h, wt, out=hs[t])  # a_t = xp_t + h_{t−1} Wᵀ
            h = _act_(hs[t], nonlinearity)  # h_t = f(a_t), in place
        ctx.nonlinearity = nonlinearity
        ctx.save_for_backward(hs, h0, w)
        return hs

    @staticmethod
    def backward(ctx: Any, grad_hs: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hs, h0, w = ctx.saved_tensors
        T, _B, N = hs.shape
        fprime = _act_grad(hs, ctx.nonlinearity)  # [T, B, N], all steps at once
        grad_a = torch.empty_like(hs)  # ∂L/∂a_t
        grad_hs = grad_hs.contiguous()
        dh = grad_hs[T - 1]
        for t in range(T - 1, 0, -1):
            torch.mul(dh, fprime[t], out=grad_a[t])
            dh = torch.addmm(grad_hs[t - 1], grad_a[t], w)  # ∂L/∂h_{t−1} = g_{t−1} + ∂a_t·W
        torch.mul(dh, fprime[0], out=grad_a[0])
        # ∂W = Σ_t ∂a_tᵀ h_{t−1}: one [N, T·B] × [T·B, N] matmul instead of T small ones
        h_prev = torch.cat([h0.unsqueeze(0), hs[:-1]])  # [T, B, N]
        grad_w = grad_a.reshape(-1, N).t() @ h_prev.reshape(-1, N)
        grad_h0 = grad_a[0] @ w if ctx.needs_input_grad[1] else None
        return grad_a, grad_h0, grad_w, None


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
    use_native = backend == "native" or (
        backend == "auto" and x.device.type == "cuda" and nonlinearity in ("relu", "tanh")
    )
    if use_native:
        if nonlinearity == "elu":
            raise ValueError("torch's native RNN kernel has no elu; use backend 'scan' or 'auto'")
        b = bias if bias is not None else torch.zeros(w_rec.shape[0], device=x.device, dtype=x.dtype)
        params = [w_in, w_rec, b, torch.zeros_like(b)]  # b_hh is a constant zero: one trained bias
        fn = torch._VF.rnn_relu if nonlinearity == "relu" else torch._VF.rnn_tanh
        out, _ = fn(x, h0.unsqueeze(0), params, True, 1, 0.0, torch.is_grad_enabled(), False, False)
        return out
    xp = x @ w_in.t()  # [T, B, N]: the input projection, hoisted out of the loop
    if bias is not None:
        xp = xp + bias
    return ElmanScan.apply(xp, h0, w_rec, nonlinearity)  # type: ignore[no-any-return]
