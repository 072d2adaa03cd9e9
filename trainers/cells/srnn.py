"""Shuffling RNN (Rotman & Wolf 2020; the authors' `rotmanmi/SRNN:models/SRNN.py`, docs/protocol.md §2).

    h_t  = ReLU(b(x_t) + roll(h_{t−1}, +1)),   h_0 = 0                       (eq. 3, the code's W_p)
    b(x) = f_r(x) ⊙ σ(W_s x + b_s)                                           (eq. 5)
    f_r  = Linear(d, H) → ReLU → [Linear(H, H) → ReLU] × (n_layers − 1) → Linear(H, N)

There are no recurrent weights: the transition is the fixed cyclic shift `torch.roll(h, 1, -1)`,
out[i] = h[i−1], so unit i hands its value to unit i+1 (eq. 4's W_p moves it the other way, which is
the same network up to relabelling the units; we follow the code). `no_gate` drops the sigmoid branch
(the code's `multihead=False`). b has no recurrence, so it is computed for all T steps in one batched
MLP, as the paper's §3 "time complexity" paragraph suggests; the recurrence is then roll + add + ReLU
per step, in `ShiftScan` below (one autograd node for the whole sequence).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from trainers.cells.base import Cell
from trainers.initializers import torch_default_linear
from trainers.kernels import Workspace
from trainers.params import UNHASHED_DEFAULT, ConfigError
from trainers.persistent import persistent_kernel


@dataclass(frozen=True)
class SRNNConfig:
    hyper_size: int = 64  # H, width of f_r's hidden layers (the code's default; paper: 8 copy/add, 32 pMNIST)
    n_layers: int = 1  # number of hidden layers of f_r (paper pMNIST: 3)
    no_gate: bool = False  # True: b(x) = f_r(x), without the sigmoid gate (the paper's ablation)
    # the shift recurrence: auto and scan are `ShiftScan` (a bundle's `FusedShiftScan`), "persistent" the
    # Triton kernel of trainers.kernels_persistent (issue 37, the same numbers), only when asked for;
    # "native" (torch's own kernel, where the Elman family has one) is the scan too, since torch has no
    # SRNN: a study's `backend: native` set for every model of a preset reaches SRNN as well. Added after
    # trials were recorded: at its default it is no part of a trial's hash (UNHASHED_DEFAULT)
    backend: Literal["auto", "scan", "native", "persistent"] = field(
        default="auto", metadata=UNHASHED_DEFAULT
    )

    def __post_init__(self) -> None:
        for name in ("hyper_size", "n_layers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"srnn: {name} = {getattr(self, name)} must be at least 1, e.g. {name}=1")


class ShiftScan(torch.autograd.Function):
    """h_t = ReLU(b_t + roll(h_{t−1}, +1)) for all t, from b [T, B, N]; h_0 = 0, so h_1 = ReLU(b_1).

    Forward: 3 ops per step (roll, add, ReLU). Backward with z_t the pre-activation and
    D_t = [h_t > 0]: ∂L/∂z_t = D_t ⊙ (∂L/∂h_t + roll(∂L/∂z_{t+1}, −1)), the inverse roll being the
    permutation's transpose; ∂L/∂b_t = ∂L/∂z_t. Bitwise the same numbers as the authors' eager loop.
    """

    @staticmethod
    def forward(ctx: Any, b: torch.Tensor) -> torch.Tensor:
        hs = torch.empty_like(b)  # [T, B, N]
        b_t, h_t = b.unbind(0), hs.unbind(0)  # T views each, made once
        torch.clamp(b_t[0], min=0.0, out=h_t[0])  # h_1 = ReLU(b_1 + roll(0))
        for t in range(1, len(b_t)):
            torch.add(b_t[t], h_t[t - 1].roll(1, -1), out=h_t[t]).relu_()  # eq. 3: out[i] = h[i−1]
        ctx.save_for_backward(hs)
        return hs

    @staticmethod
    def backward(ctx: Any, grad_hs: torch.Tensor) -> torch.Tensor:
        (hs,) = ctx.saved_tensors
        mask = (hs > 0).to(hs.dtype)  # D_t = ReLU'(z_t), all steps at once   [T, B, N]
        # ∂L/∂z_t starts as D_t ⊙ ∂L/∂h_t; the loop adds the path through h_{t+1}
        grad_z: torch.Tensor = grad_hs * mask
        g_t, m_t = grad_z.unbind(0), mask.unbind(0)
        for t in range(len(g_t) - 2, -1, -1):
            g_t[t].addcmul_(m_t[t], g_t[t + 1].roll(-1, -1))  # ∂z_{t+1}/∂h_t = Pᵀ: roll back by one
        return grad_z


class FusedShiftScan(torch.autograd.Function):
    """`ShiftScan` for K networks at once (a fused trial bundle, `trainers.fused`): member k's drive
    b_k [T, B, N] in, its states [T, B, N] (or h_T [B, N] with `last`) out.

    Every op is elementwise — roll copies, add, ReLU, the 0/1 mask and `addcmul` with it round each
    element alone and alike on any path — so each step runs once over all members' [K, B, N] rows
    and each member's numbers are its solo `ShiftScan`'s. Drives, states and gradients live in
    member-major [K, T, B, N] buffers of `workspace` (each member's states contiguous for its
    readout; no [T, K, B, N] stack of fresh pages every step); the outputs and the returned
    gradients are views into it, valid until its next use.
    """

    @staticmethod
    def forward(
        ctx: Any, last: bool, workspace: Workspace | None, *drives: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        ws = workspace if workspace is not None else Workspace()
        (T, B, N), K = drives[0].shape, len(drives)
        b = torch.stack(drives, out=ws.get("drive", (K, T, B, N), drives[0]))
        hs = ws.get("hs", (K, T, B, N), drives[0])
        b_t, h_t = b.unbind(1), hs.unbind(1)
        torch.clamp(b_t[0], min=0.0, out=h_t[0])  # h_1 = ReLU(b_1 + roll(0))
        for t in range(1, T):
            torch.add(b_t[t], h_t[t - 1].roll(1, -1), out=h_t[t]).relu_()  # eq. 3, every member at once
        ctx.last, ctx.workspace = last, ws
        ctx.save_for_backward(hs)
        return tuple(hs[:, T - 1].unbind(0) if last else hs.unbind(0))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        (hs,) = ctx.saved_tensors
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
        mask = torch.gt(hs, 0, out=ws.get("mask", (K, T, B, N), hs))  # D_t, as ShiftScan's (hs > 0)
        grad_z.mul_(mask)  # ∂L/∂z_t = D_t ⊙ ∂L/∂h_t, then the path through h_{t+1}
        g_t, m_t = grad_z.unbind(1), mask.unbind(1)
        for t in range(T - 2, -1, -1):
            g_t[t].addcmul_(m_t[t], g_t[t + 1].roll(-1, -1))
        return (None, None, *grad_z.unbind(0))


class SRNNCell(Cell):
    name = "srnn"
    Config = SRNNConfig
    config: SRNNConfig

    def __init__(self, config: SRNNConfig, input_size: int, hidden_size: int, gen: torch.Generator) -> None:
        super().__init__(config, input_size, hidden_size, gen)
        d, H, N = input_size, config.hyper_size, hidden_size
        layers: list[nn.Module] = [torch_default_linear(d, H, gen), nn.ReLU()]
        for _ in range(config.n_layers - 1):
            layers += [torch_default_linear(H, H, gen), nn.ReLU()]
        layers.append(torch_default_linear(H, N, gen))
        self.f_r = nn.Sequential(*layers)  # the primary branch, d → N
        self.gate = None if config.no_gate else torch_default_linear(d, N, gen)  # W_s [N, d], b_s [N]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [T, B, d] → [T, B, N]
        b = self.f_r(x)  # [T, B, N], one batched MLP over all T·B rows
        if self.gate is not None:
            b = b * torch.sigmoid(self.gate(x))  # eq. 5: f_r(x) ⊙ σ(W_s x + b_s)
        if self.config.backend == "persistent":  # a bundle of one through the kernel a member runs
            return persistent_kernel().persistent_shift_scan([b])[0]  # type: ignore[no-any-return]
        return ShiftScan.apply(b)  # type: ignore[no-any-return]

    def recurrent_matrix(self) -> torch.Tensor:
        """The fixed permutation P [N, N] of roll(h, +1): P_ij = 1 iff j = i − 1 (mod N)."""
        return torch.roll(torch.eye(self.hidden_size), 1, 0)
