"""A bundle's optimiser: RMSprop or Adam (either form, or AMSGrad) over the stacked [K, …] tensors with per-member constants,
and the global-norm clip per member, each member's arithmetic its solo run's (`trainers.optim`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial

import torch

from trainers.config import TrainConfig
from trainers.fused.stacked import flat
from trainers.optim import ADAM_KINDS, AMSGRAD_KINDS, LearningRate, adam_, adam_factors, moments, rmsprop_


class FusedOptimizer:
    """RMSprop or Adam over stacked [K, …] tensors with per-member constants and global-norm clip.

    The updates are `trainers.optim`'s rules (torch's single-tensor RMSprop / Adam, with the portable
    mode's correctly rounded √ on the CPU) with the constants as [K, 1, …] columns; the clip repeats
    the float32 arithmetic of `clip_grad_norm_` per member. Each member steps at its own learning rate's
    course (`trainers.optim.LearningRate`, whose drops count epochs of `steps_per_epoch` steps).
    """

    def __init__(
        self,
        kind: str,
        configs: Sequence[TrainConfig],
        params: Sequence[torch.Tensor],
        steps_per_epoch: int,
    ) -> None:
        self.kind = kind
        self.step_count = 0
        device = params[0].device
        self.rates = [LearningRate.of(c, steps_per_epoch) for c in configs]
        #: whether some member's rate moves: RMSprop's −lr is then made for each step (`factors`)
        self.scheduled = not all(r.constant for r in self.rates)
        self.f64 = {  # per-member constants as Python floats (bias corrections are computed in double)
            "beta1": [c.betas[0] for c in configs],
            "beta2": [c.betas[1] for c in configs],
        }

        def column(values: Sequence[float]) -> torch.Tensor:  # double → float32, as a Python scalar is
            return torch.tensor(values, dtype=torch.float64).to(device=device, dtype=torch.float32)

        self.consts = {
            "neg_lr": column([-c.lr for c in configs]),
            "rho": column([c.rho for c in configs]),
            "one_minus_rho": column([1 - c.rho for c in configs]),
            "eps": column([c.eps for c in configs]),
            "one_minus_beta1": column([1 - c.betas[0] for c in configs]),
            "beta2": column([c.betas[1] for c in configs]),
            "one_minus_beta2": column([1 - c.betas[1] for c in configs]),
            "clip": column([c.clip_norm if c.clip_norm else math.inf for c in configs]),
        }
        self.clipped = torch.tensor([bool(c.clip_norm) for c in configs], device=device)
        self.state = [[torch.zeros_like(p) for p in params] for _ in range(moments(kind))]
        #: None (always, but under a CUDA graph): the per-step factors (`factors`) are made from
        #: `step_count`; a captured step (`trainers.fused.graphs`) reads them from these device buffers,
        #: which it fills with `factors(n)` before each replay
        self.static_factors: tuple[torch.Tensor, ...] | None = None

    @property
    def varies(self) -> bool:
        """Whether the step takes factors that change from step to step (`factors`): Adam's bias
        corrections, or a member's learning rate that moves."""
        return self.kind in ADAM_KINDS or self.scheduled

    def factors(self, n: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """Step n's per-member factors, [K] float32 on `device`, each computed in double, then rounded
        once: RMSprop's (−lr,), at each member's rate of step n; Adam's (neg_step, bc2_sqrt)
        (`trainers.optim.adam_factors` for the bundle's form, at that rate)."""
        rates = [r.at(n) for r in self.rates]
        if self.kind not in ADAM_KINDS:
            return (torch.tensor([-r for r in rates], dtype=torch.float64).to(device, torch.float32),)
        f = self.f64
        factors = [
            adam_factors(*member, n, self.kind) for member in zip(rates, f["beta1"], f["beta2"], strict=True)
        ]
        return tuple(
            torch.tensor(column, dtype=torch.float64).to(device, torch.float32)
            for column in zip(*factors, strict=True)
        )

    def keep(self, index: torch.Tensor) -> None:
        idx = index.tolist()
        self.rates = [self.rates[i] for i in idx]
        self.scheduled = not all(r.constant for r in self.rates)
        self.f64 = {name: [values[i] for i in idx] for name, values in self.f64.items()}
        self.consts = {name: c[index] for name, c in self.consts.items()}
        self.clipped = self.clipped[index]
        self.state = [[s[index] for s in states] for states in self.state]
        self.static_factors = None  # a captured step's buffers were [K]: its next GraphedStep makes new ones

    @staticmethod
    def _col(c: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return c.view(-1, *([1] * (like.dim() - 1)))  # [K] → [K, 1, …]

    @torch.no_grad()
    def step(self, params: Sequence[torch.Tensor]) -> None:
        grads = [p.grad for p in params]
        assert all(g is not None for g in grads)
        gs: list[torch.Tensor] = [g for g in grads if g is not None]
        # clip_grad_norm_: total = ‖(‖g_1‖, …, ‖g_P‖)‖ per member; g ← g·min(clip / (total + 1e-6), 1)
        norms = torch.stack([torch.linalg.vector_norm(flat(g), 2.0, dim=1) for g in gs], 1)
        total = torch.linalg.vector_norm(norms, 2.0, dim=1)  # [K]
        # max_norm / tensor is Tensor.__rtruediv__: reciprocal, then a product (two roundings)
        coef = torch.clamp(torch.reciprocal(total + 1e-6) * self.consts["clip"], max=1.0)
        coef = torch.where(self.clipped, coef, torch.ones_like(coef))
        for g in gs:
            g.mul_(self._col(coef, g))
        self.step_count += 1
        c = self.consts
        if self.static_factors is not None:
            factors = self.static_factors
        elif self.varies:
            factors = self.factors(self.step_count, gs[0].device)
        else:
            factors = (c["neg_lr"],)  # RMSprop at constant rates
        if self.kind == "rmsprop":
            (neg_lr,) = factors
            for p, g, sq in zip(params, gs, self.state[0], strict=True):
                col = partial(self._col, like=g)
                rmsprop_(p, g, sq, rho=col(c["rho"]), one_minus_rho=col(c["one_minus_rho"]),
                         eps=col(c["eps"]), neg_lr=col(neg_lr))  # fmt: skip
            return
        neg_step, bc2_sqrt = factors
        v_maxes = self.state[2] if self.kind in AMSGRAD_KINDS else [None] * len(gs)
        for p, g, m, v, v_max in zip(params, gs, self.state[0], self.state[1], v_maxes, strict=True):
            col = partial(self._col, like=g)
            adam_(p, g, m, v, one_minus_beta1=col(c["one_minus_beta1"]), beta2=col(c["beta2"]),
                  one_minus_beta2=col(c["one_minus_beta2"]), eps=col(c["eps"]), neg_step=col(neg_step),
                  bc2_sqrt=col(bc2_sqrt), v_max=v_max)  # fmt: skip
