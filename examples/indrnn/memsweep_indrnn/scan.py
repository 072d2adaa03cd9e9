"""IndRNN's recurrence over a whole sequence, as one autograd node: alone (`IndScan`) and for the K
members of a fused bundle at once (`FusedIndScan`).

    z_t = d_t + u ⊙ h_{t−1},   h_t = ReLU(z_t),   h_0 = 0        (Li et al. 2018, eq. 2)

with d_t = W x_t + b computed for all steps before the loop (one matmul, by autograd). Every op of the
loop is elementwise and exactly rounded — a product, a sum, ReLU, and in the backward a product with
the 0/1 mask D_t = [h_t > 0] — so each element rounds alike on any code path and whatever the shape
around it: the fused scan runs each step once over all members' [K, B, N] rows and gives each member
the numbers of its solo `IndScan`, bit for bit. (No `addcmul` in the forward: a fused multiply-add
rounds once where mul + add round twice, and torch's vectorised body and scalar tail may differ in
that; the backward's `addcmul` multiplies by 0 or 1, exact either way.)

Backward, with ∂z_{t+1}/∂h_t = u (a diagonal Jacobian):
    ∂L/∂z_t = D_t ⊙ (∂L/∂h_t + u ⊙ ∂L/∂z_{t+1}),   ∂L/∂d_t = ∂L/∂z_t,   ∂L/∂u = Σ_t Σ_b ∂L/∂z_t ⊙ h_{t−1}
"""

from __future__ import annotations

from typing import Any

import torch
from trainers.kernels import Workspace


def _grad_u(grad_z: torch.Tensor, hs: torch.Tensor) -> torch.Tensor:
    """∂L/∂u [N] from ∂L/∂z and h, both [T, B, N] (h_0 = 0 adds nothing): one product, one sum, the
    same ops on the same shapes alone and per bundle member (so the sum adds in the same order)."""
    return (grad_z[1:] * hs[:-1]).sum((0, 1))


class IndScan(torch.autograd.Function):
    """h [T, B, N] from the drive d [T, B, N] and the recurrent weights u [N]."""

    @staticmethod
    def forward(ctx: Any, drive: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        hs = torch.empty_like(drive)  # [T, B, N]
        d_t, h_t = drive.unbind(0), hs.unbind(0)  # T views each, made once
        carry = torch.empty_like(h_t[0])  # u ⊙ h_{t−1}   [B, N]
        torch.clamp(d_t[0], min=0.0, out=h_t[0])  # h_1 = ReLU(d_1 + u ⊙ 0)
        for t in range(1, len(d_t)):
            torch.mul(h_t[t - 1], u, out=carry)
            torch.add(d_t[t], carry, out=h_t[t]).relu_()  # eq. 2
        ctx.save_for_backward(hs, u)
        return hs

    @staticmethod
    def backward(ctx: Any, grad_hs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hs, u = ctx.saved_tensors
        mask = (hs > 0).to(hs.dtype)  # D_t, all steps at once   [T, B, N]
        grad_z: torch.Tensor = grad_hs * mask  # D_t ⊙ ∂L/∂h_t; the loop adds the path through z_{t+1}
        g_t, m_t = grad_z.unbind(0), mask.unbind(0)
        carry = torch.empty_like(g_t[0])
        for t in range(len(g_t) - 2, -1, -1):
            torch.mul(g_t[t + 1], u, out=carry)  # u ⊙ ∂L/∂z_{t+1}
            g_t[t].addcmul_(m_t[t], carry)
        return grad_z, _grad_u(grad_z, hs)


class FusedIndScan(torch.autograd.Function):
    """`IndScan` for K networks at once: recurrent weights u [K, N] (member k's row k) and member k's
    drive [T, B, N] in; its states [T, B, N] (or h_T [B, N] with `last`) out.

    Drives, states and gradients live in member-major [K, T, B, N] buffers of `workspace` (each
    member's states contiguous for its readout); the outputs and the drives' gradients are views into
    it, valid until its next use. ∂u is summed per member by `IndScan`'s own expression.
    """

    @staticmethod
    def forward(
        ctx: Any, last: bool, workspace: Workspace | None, u: torch.Tensor, *drives: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        ws = workspace if workspace is not None else Workspace()
        (T, B, N), K = drives[0].shape, len(drives)
        d = torch.stack(drives, out=ws.get("drive", (K, T, B, N), drives[0]))
        hs = ws.get("hs", (K, T, B, N), drives[0])
        carry = ws.get("carry", (K, B, N), drives[0])
        u_k = u.unsqueeze(1)  # [K, 1, N]: member k's u over its B rows
        d_t, h_t = d.unbind(1), hs.unbind(1)
        torch.clamp(d_t[0], min=0.0, out=h_t[0])
        for t in range(1, T):
            torch.mul(h_t[t - 1], u_k, out=carry)
            torch.add(d_t[t], carry, out=h_t[t]).relu_()  # eq. 2, every member at once
        ctx.last, ctx.workspace = last, ws
        ctx.save_for_backward(hs, u)
        return tuple(hs[:, T - 1].unbind(0) if last else hs.unbind(0))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        hs, u = ctx.saved_tensors
        K, T, B, N = hs.shape
        ws: Workspace = ctx.workspace
        grad_z = ws.get("grad", (K, T, B, N), hs)
        if ctx.last:  # ∂L/∂h_t is zero but at the last step
            grad_z.zero_()
            for k, g in enumerate(grads):
                if g is not None:
                    grad_z[k, T - 1].copy_(g)
        else:
            torch.stack([g if g is not None else hs.new_zeros(T, B, N) for g in grads], out=grad_z)
        mask = torch.gt(hs, 0, out=ws.get("mask", (K, T, B, N), hs))  # D_t, as IndScan's (hs > 0)
        grad_z.mul_(mask)
        carry = ws.get("carry", (K, B, N), hs)
        u_k = u.unsqueeze(1)
        g_t, m_t = grad_z.unbind(1), mask.unbind(1)
        for t in range(T - 2, -1, -1):
            torch.mul(g_t[t + 1], u_k, out=carry)
            g_t[t].addcmul_(m_t[t], carry)
        grad_u = torch.stack([_grad_u(grad_z[k], hs[k]) for k in range(K)])
        return (None, None, grad_u, *grad_z.unbind(0))
