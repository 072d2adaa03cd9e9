"""The optimisers' update rules, RMSprop (Keras' form) and Adam and AMSGrad (torch's and Keras' forms), as
torch computes them, and the square root they take: one arithmetic for a solo run (`Optimizer`) and a
fused bundle (`trainers.fused`).

Adam has two forms, which part where √v is small against ε: torch's (since 1.3, 2019) adds ε to the
bias-corrected √v, p ← p − lr/(1−β1ⁿ) · m/(√v/√(1−β2ⁿ) + ε); Keras' and TensorFlow's (`keras_adam`:
Keras 2's `optimizers.Adam`, tf.keras' and TF's `ApplyAdam`), and torch's before 1.3 (pytorch#22628),
fold both corrections into the rate and add ε to √v, p ← p − lr·√(1−β2ⁿ)/(1−β1ⁿ) · m/(√v + ε), which is
torch's with ε/√(1−β2ⁿ) in place of ε (3.2e-6 for ε = 1e-7 at the first step, ε itself only after
thousands). One rule computes both (`adam_`), with the factors `adam_factors` gives for the form.
AMSGrad (Reddi et al. 2018) steps with v̂, the running maximum of v, in place of v, in either form:
`amsgrad` (torch's `Adam(amsgrad=True)`) and `keras_amsgrad` (Keras 2's `Adam(amsgrad=True)`, and
torch's before 1.3: the NRU code's, which ran torch 0.4).

Each rule repeats the float32 arithmetic of torch's single-tensor RMSprop and Adam (`torch.optim`'s
path on the CPU) line by line; its constants are Python floats for a solo run, or [K, 1, …] float32
columns for a bundle's stacked tensors, and both round alike (a float scalar is cast to float32 before
the product, as torch casts it).

The square root is `trainers.numerics.sqrt`: `torch.sqrt` in the native mode and on a GPU, and the
correctly rounded root on the CPU in the portable mode. torch's own optimisers take `torch.sqrt`,
which on the CPU is MKL's vector maths (`vsSqrt`), whose kernel in the portable mode's COMPATIBLE
branch starts from `rsqrtps`, an approximation whose bits each vendor sets: an Intel Xeon and an AMD
EPYC parted in the last bit of the first RMSprop step (issue 33).

The learning rate of each step is `LearningRate`'s: the trial's `lr`, or its course under
`lr_drop_epochs` / `lr_decay_steps` (a scheduler's drops, Keras 2's `decay`), the same for a solo run
(`set_lr` before each step) and a bundle's member (`trainers.fused.FusedOptimizer`).

Which optimiser a solo run uses (`make_optimizer`): on the CPU in the portable mode, and for the Keras
forms everywhere (torch has them no more), this module's `Optimizer`; otherwise torch's own
(`torch.optim.RMSprop` / `Adam`), so the native mode and the GPU compute what they always computed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch

from trainers import numerics
from trainers.config import TrainConfig

Constant = float | torch.Tensor  # a Python float (a solo run) or a [K, 1, …] column (a bundle)
#: the optimisers that keep Adam's two moments and step with `adam_` (the rest: RMSprop)
ADAM_KINDS = ("adam", "keras_adam", "amsgrad", "keras_amsgrad")
#: those that keep a third, v̂, the running maximum of v, and step with it (Reddi et al. 2018)
AMSGRAD_KINDS = ("amsgrad", "keras_amsgrad")
#: those in Keras' form: ε added to √v, the bias corrections folded into the rate (`adam_factors`)
KERAS_FORMS = ("keras_adam", "keras_amsgrad")
OPTIMIZERS = ("rmsprop", *ADAM_KINDS)


def moments(kind: str) -> int:
    """The state tensors an optimiser keeps per parameter: RMSprop's a; Adam's m, v; AMSGrad's m, v, v̂."""
    return 1 if kind == "rmsprop" else 3 if kind in AMSGRAD_KINDS else 2


Sqrt = Callable[[torch.Tensor], torch.Tensor]


def rmsprop_(
    p: torch.Tensor, g: torch.Tensor, square_avg: torch.Tensor, *,
    rho: Constant, one_minus_rho: Constant, eps: Constant, neg_lr: Constant, root: Sqrt = numerics.sqrt,
) -> None:  # fmt: skip
    """a ← ρa + (1−ρ)g²;  p ← p − lr·g/(√a + ε), in place (torch's RMSprop with alpha = ρ)."""
    square_avg.mul_(rho).addcmul_(g * one_minus_rho, g)
    avg = root(square_avg).add_(eps)
    p.add_((g * neg_lr).div_(avg))


def adam_(
    p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, *,
    one_minus_beta1: Constant, beta2: Constant, one_minus_beta2: Constant, eps: Constant,
    neg_step: Constant, bc2_sqrt: Constant, root: Sqrt = numerics.sqrt, v_max: torch.Tensor | None = None,
) -> None:  # fmt: skip
    """m ← lerp(m, g, 1−β1);  v ← β2 v + (1−β2) g²;  p ← p + neg_step · m / (√v / bc2_sqrt + ε), in
    place, with `adam_factors`' factors: torch's Adam (neg_step = −lr/(1−β1ⁿ), bc2_sqrt = √(1−β2ⁿ)), or
    Keras' (neg_step = −lr·√(1−β2ⁿ)/(1−β1ⁿ), bc2_sqrt = 1: ε added to √v itself). With `v_max`
    (AMSGrad): v̂ ← max(v̂, v), and √v̂ in place of √v."""
    m.lerp_(g, one_minus_beta1)
    v.mul_(beta2).addcmul_(g * one_minus_beta2, g)
    if v_max is not None:
        torch.maximum(v_max, v, out=v_max)
    denom = root(v if v_max is None else v_max).div_(bc2_sqrt).add_(eps)
    p.add_((m * neg_step).div_(denom))


def adam_factors(lr: float, beta1: float, beta2: float, n: int, kind: str = "adam") -> tuple[float, float]:
    """Adam's factors at step n for `adam_`, in double: torch's −lr / (1 − β1ⁿ) and √(1 − β2ⁿ); for
    the Keras forms the rate Keras computes, −lr·√(1 − β2ⁿ)/(1 − β1ⁿ), and 1 (√v / 1 is √v exactly, so
    `adam_` then adds ε to √v itself)."""
    if kind in KERAS_FORMS:
        return -(lr * (1 - beta2**n) ** 0.5 / (1 - beta1**n)), 1.0
    return -(lr / (1 - beta1**n)), (1 - beta2**n) ** 0.5


@dataclass(frozen=True)
class LearningRate:
    """A trial's learning rate at each optimiser step (`at`): `lr`, multiplied by `drop_factor` once each
    of `drop_epochs` epochs is done, and, with `decay_steps` S, divided by 1 + (lr / S)·(n − 1).

    The drops are a Keras `LearningRateScheduler`'s step function (SGORNN's HAR-2: lr / 10 from the
    201st epoch, `epoch >= 200` of its 0-based epochs) and torch's MultiStepLR: the product in double,
    rounded to float32 where the optimiser reads it (Keras's `K.set_value` of its float32 rate).
    The decay is Keras 2's optimiser `decay` d = lr / S (SGORNN's addition code: `decay=(initial_lr −
    final_lr)/(epochs·steps_per_epoch)`), applied to update n as Keras 2.3.1's `get_updates` computes it
    in float32, lr · (1 / (1 + d·iterations)) with `iterations` = n − 1, the updates taken before it;
    each operation rounded to float32 here too."""

    lr: float
    drop_epochs: tuple[int, ...] = ()
    drop_factor: float = 0.1
    decay_steps: int | None = None
    steps_per_epoch: int = 1

    @classmethod
    def of(cls, cfg: TrainConfig, steps_per_epoch: int) -> LearningRate:
        return cls(cfg.lr, tuple(cfg.lr_drop_epochs), cfg.lr_drop_factor, cfg.lr_decay_steps, steps_per_epoch)

    @property
    def constant(self) -> bool:
        """Whether every step takes `lr` itself."""
        return not self.drop_epochs and self.decay_steps is None

    def drops_past(self, budget: int) -> tuple[int, ...]:
        """The drop epochs whose first step (epoch × steps_per_epoch + 1) lies past a budget of `budget`
        steps: drops the trial never takes."""
        return tuple(e for e in self.drop_epochs if e * self.steps_per_epoch >= budget)

    def at(self, n: int) -> float:
        """The rate of optimiser step n (1, 2, …): `lr` itself until a drop or the decay moves it."""
        done = (n - 1) // self.steps_per_epoch  # epochs done before this step
        rate = self.lr * self.drop_factor ** sum(1 for e in self.drop_epochs if done >= e)
        if self.decay_steps is None:
            return rate
        f32 = np.float32
        decay = f32(self.lr / self.decay_steps)  # Keras's float32 `decay` variable, set from a double
        return float(f32(rate) * (f32(1.0) / (f32(1.0) + decay * f32(n - 1))))


def set_lr(optimizer: Optimizer | torch.optim.Optimizer, lr: float) -> None:
    """The rate `optimizer` takes at its next step (this module's `Optimizer`, or torch's)."""
    if isinstance(optimizer, Optimizer):
        optimizer.lr = lr
        return
    for group in optimizer.param_groups:
        group["lr"] = lr


class Optimizer:
    """A solo run's RMSprop or Adam (either form) over its parameters, with this module's rules (the
    optimiser of the portable mode on the CPU, and of the Keras forms everywhere; `make_optimizer`). The
    part of torch.optim's interface the loop uses: `zero_grad`, `step`."""

    def __init__(self, kind: str, params: Iterable[torch.nn.Parameter], *, lr: float, rho: float,
                 betas: tuple[float, float], eps: float, root: Sqrt = numerics.sqrt) -> None:  # fmt: skip
        if kind not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {kind!r}; valid: {', '.join(OPTIMIZERS)}")
        self.kind, self.lr, self.rho, self.betas, self.eps, self.root = kind, lr, rho, betas, eps, root
        self.params = list(params)
        self.state = [[torch.zeros_like(p) for p in self.params] for _ in range(moments(kind))]
        self.step_count = 0

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        self.step_count += 1
        live = [(i, p) for i, p in enumerate(self.params) if p.grad is not None]
        if self.kind == "rmsprop":
            for i, p in live:
                rmsprop_(p, p.grad, self.state[0][i], rho=self.rho, one_minus_rho=1 - self.rho,  # type: ignore[arg-type]
                         eps=self.eps, neg_lr=-self.lr, root=self.root)  # fmt: skip
            return
        beta1, beta2 = self.betas
        neg_step, bc2_sqrt = adam_factors(self.lr, beta1, beta2, self.step_count, self.kind)
        for i, p in live:
            v_max = self.state[2][i] if self.kind in AMSGRAD_KINDS else None
            adam_(p, p.grad, self.state[0][i], self.state[1][i], one_minus_beta1=1 - beta1, beta2=beta2,  # type: ignore[arg-type]
                  one_minus_beta2=1 - beta2, eps=self.eps, neg_step=neg_step, bc2_sqrt=bc2_sqrt,
                  root=self.root, v_max=v_max)  # fmt: skip


def make_optimizer(cfg: TrainConfig, params: list[torch.nn.Parameter]) -> Optimizer | torch.optim.Optimizer:
    """A solo run's optimiser for `cfg`: this module's `Optimizer` on the CPU in the portable mode (a
    correctly rounded √) and for the Keras forms (torch has them no more), else torch's RMSprop (alpha =
    ρ: Keras' form) or Adam (`amsgrad=True` for AMSGrad)."""
    on_cpu = all(p.device.type == "cpu" for p in params)
    if (on_cpu and numerics.current() == "portable") or cfg.optimizer in KERAS_FORMS:
        return Optimizer(cfg.optimizer, params, lr=cfg.lr, rho=cfg.rho, betas=cfg.betas, eps=cfg.eps)
    if cfg.optimizer in ("adam", "amsgrad"):
        return torch.optim.Adam(
            params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, amsgrad=cfg.optimizer == "amsgrad"
        )
    # Keras RMSprop: a ← ρa + (1−ρ)g²;  p ← p − lr·g/(√a + ε) — torch's RMSprop with alpha = ρ
    return torch.optim.RMSprop(params, lr=cfg.lr, alpha=cfg.rho, eps=cfg.eps)
