"""The optimisers' arithmetic (trainers/optim.py) and the maths the portable mode computes its own way
(trainers/numerics.py: `sqrt`, `log`), issue 33: the same numbers on any x86-64 CPU needs the update's
√ correctly rounded, and torch's √ on the CPU (MKL's vsSqrt) is not."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.trainers.test_numerics import X86, run_python
from trainers import numerics
from trainers.optim import LearningRate, Optimizer

pytestmark = pytest.mark.numerics  # CI runs them under every numerics mode

SPECIAL = [
    0.0,
    -0.0,
    math.inf,
    math.nan,
    -1.0,
    -math.inf,
    1e-45,
    1.4e-45,
    1.1754942e-38,
    1.17549435e-38,
    3.4028235e38,
]


def ieee_sqrt(t: torch.Tensor) -> torch.Tensor:
    """numpy's float32 √: the `sqrtps` instruction, IEEE's correctly rounded root."""
    with np.errstate(invalid="ignore"):  # √ of a negative number is NaN, as intended
        return torch.from_numpy(np.sqrt(t.numpy()))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Element by element: the same float32 bits (NaNs of either sign count as equal)."""
    return (a.view(torch.int32) == b.view(torch.int32)) | (a.isnan() & b.isnan())


def test_portable_sqrt_is_correctly_rounded_on_every_float32(one_thread):
    """Every float32 in [1, 4) — each mantissa under both exponent parities; scaling by 4 scales each
    step of `portable_sqrt` by 2 exactly, so these stand for every positive float32, subnormals too —
    and the special values. MKL's float32 √ (torch.sqrt on the CPU) misses millions of them. On this
    thread alone, whose flags keep subnormals (each test starts so): an OpenMP pool thread keeps the
    flags of the thread that made it, which a trial in this test process may have set to flush them."""
    x = torch.from_numpy(np.arange(0x3F800000, 0x40800000, dtype=np.uint32).view(np.float32))
    ours = numerics.portable_sqrt(x)
    ref = ieee_sqrt(x)
    wrong = int((~same_bits(ours, ref)).sum())
    assert wrong == 0, f"{wrong} of {len(x)} roots are not correctly rounded"
    special = torch.tensor(SPECIAL)
    assert bool(same_bits(numerics.portable_sqrt(special), ieee_sqrt(special)).all())
    tiny = torch.from_numpy(np.arange(1, 1 << 16, dtype=np.uint32).view(np.float32))  # subnormals
    assert bool(same_bits(numerics.portable_sqrt(tiny), ieee_sqrt(tiny)).all())


def test_the_portable_sqrt_differentiates_as_torchs(one_thread):
    """A cell's √ (`arjovsky_urnn`'s modReLU) takes `numerics.sqrt` with autograd: the forward is
    `portable_sqrt`'s correctly rounded root, the backward torch's rule g / (2√t) on that root, bit for
    bit, so within a rounding of torch.sqrt's own gradient."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(4099, generator=gen) * 10 + 1e-3).requires_grad_()
    g = torch.randn(4099, generator=gen)
    root = numerics._PortableSqrt.apply(x)
    root.backward(g)
    assert bool(same_bits(root.detach(), ieee_sqrt(x.detach())).all())
    assert bool(same_bits(x.grad, g / (2 * ieee_sqrt(x.detach()))).all())
    y = x.detach().clone().requires_grad_()
    y.sqrt().backward(g)
    torch.testing.assert_close(x.grad, y.grad, rtol=2.5e-7, atol=0)


@pytest.mark.parametrize("kind", ["rmsprop", "adam"])
def test_the_update_rules_with_torchs_root_take_torchs_steps_bit_for_bit(kind):
    """trainers.optim's rules are torch.optim's single-tensor arithmetic: with torch's √ they take
    torch's steps exactly (gradients from 1e-6 to 10, odd sizes, 20 steps)."""
    g = torch.Generator().manual_seed(0)
    shapes = [(100, 100), (37,), (9, 100), (1,), (3, 17, 5)]
    for lr in (1e-3, 3e-4, 1e-5):
        ps = [torch.randn(s, generator=g).requires_grad_() for s in shapes]
        qs = [p.detach().clone().requires_grad_() for p in ps]
        ref = (
            torch.optim.RMSprop(ps, lr=lr, alpha=0.9, eps=1e-7)
            if kind == "rmsprop"
            else torch.optim.Adam(ps, lr=lr, betas=(0.9, 0.999), eps=1e-7)
        )
        ours = Optimizer(kind, qs, lr=lr, rho=0.9, betas=(0.9, 0.999), eps=1e-7, root=torch.sqrt)
        for _ in range(20):
            for p, q, s in zip(ps, qs, shapes, strict=True):
                grad = torch.randn(s, generator=g) * 10.0 ** float(torch.randint(-6, 2, (1,), generator=g))
                p.grad, q.grad = grad.clone(), grad.clone()
            ref.step()
            ours.step()
        assert all(torch.equal(p, q) for p, q in zip(ps, qs, strict=True)), (kind, lr)


def keras_adam_transcription(
    p: torch.Tensor, grads: list[torch.Tensor], lr: float, b1: float, b2: float, eps: float
) -> torch.Tensor:
    """Keras 2's `optimizers.Adam.get_updates` (and TensorFlow's `ApplyAdam`), in float64: lr_t = lr ·
    √(1 − β2ᵗ)/(1 − β1ᵗ); m ← β1 m + (1 − β1) g; v ← β2 v + (1 − β2) g²; p ← p − lr_t · m/(√v + ε)."""
    p, m, v = p.double(), torch.zeros_like(p, dtype=torch.float64), torch.zeros_like(p, dtype=torch.float64)
    for t, g in enumerate(grads, 1):
        lr_t = lr * math.sqrt(1.0 - b2**t) / (1.0 - b1**t)
        m = b1 * m + (1.0 - b1) * g.double()
        v = b2 * v + (1.0 - b2) * g.double() ** 2
        p = p - lr_t * m / (v.sqrt() + eps)
    return p


def test_keras_adam_is_keras_and_tensorflows_rule_and_parts_from_torchs_on_small_gradients():
    """`keras_adam` adds ε to √v and folds the bias corrections into the rate, as Keras' and TF's Adam
    (Emami et al.'s tf.keras code); torch's adds ε to the bias-corrected √v, which is Keras' rule with
    ε/√(1 − β2ⁿ): the two part where a gradient's RMS is near ε, and agree where it is large."""
    g = torch.Generator().manual_seed(0)
    start = torch.zeros(
        50, 50
    )  # Adam's steps do not depend on p: from 0, p holds them to float32's precision
    for scale, parts in ((1e-6, True), (1.0, False)):
        grads = [torch.randn(50, 50, generator=g) * scale for _ in range(10)]
        steps = {}
        for kind in ("keras_adam", "adam"):
            q = torch.nn.Parameter(start.clone())
            opt = Optimizer(kind, [q], lr=1e-2, rho=0.9, betas=(0.9, 0.999), eps=1e-7)
            for grad in grads:
                q.grad = grad.clone()
                opt.step()
            steps[kind] = (q.detach() - start).double()
        want = keras_adam_transcription(start, grads, 1e-2, 0.9, 0.999, 1e-7) - start.double()
        torch.testing.assert_close(steps["keras_adam"], want, rtol=1e-5, atol=1e-7 * float(want.abs().max()))
        gap = float((steps["adam"] - want).abs().max() / want.abs().max())
        assert (gap > 0.05) == parts, (scale, gap)  # torch's rule is another one where √v ~ ε


PORTABLE_UPDATE = """
    import json, numpy as np, torch
    from trainers import numerics
    numerics.use("portable")
    from trainers.config import resolve
    from trainers.optim import Optimizer, make_optimizer

    def ieee_sqrt(t):
        return torch.from_numpy(np.sqrt(t.numpy()))

    out = {}
    for kind in ("rmsprop", "adam", "keras_adam", "amsgrad", "keras_amsgrad"):
        cfg = resolve({"optimizer": kind, "lr": 1e-3}).config
        g = torch.Generator().manual_seed(1)
        start = [torch.randn(100, 100, generator=g), torch.randn(10, 100, generator=g), torch.randn(9, generator=g)]
        ps = [torch.nn.Parameter(s.clone()) for s in start]
        qs = [torch.nn.Parameter(s.clone()) for s in start]
        run = make_optimizer(cfg, ps)  # what a solo run on the CPU steps with
        ref = Optimizer(kind, qs, lr=cfg.lr, rho=cfg.rho, betas=cfg.betas, eps=cfg.eps, root=ieee_sqrt)
        for step in range(5):
            for p, q in zip(ps, qs):
                grad = torch.randn(p.shape, generator=g) * 10.0 ** (step - 3)
                p.grad, q.grad = grad.clone(), grad.clone()
            run.step()
            ref.step()
        out[kind] = sum(int((p.detach() != q.detach()).sum()) for p, q in zip(ps, qs))
    print(json.dumps(out))
"""


@pytest.mark.skipif(not X86, reason="the portable mode is defined for x86-64; elsewhere `use` refuses it")
def test_a_portable_solo_runs_update_takes_the_correctly_rounded_root():
    """In a portable process a solo run's optimiser steps as its rule with IEEE's √, element by element
    (before issue 33: torch's own optimiser, whose MKL √ parted from IEEE's on ~4 % of a step's
    elements, and from an Intel Xeon's)."""
    differing = run_python(PORTABLE_UPDATE)
    assert differing == {"rmsprop": 0, "adam": 0, "keras_adam": 0, "amsgrad": 0, "keras_amsgrad": 0}


def test_amsgrad_is_torchs_adam_with_amsgrad_bit_for_bit():
    """`amsgrad`: torch's single-tensor Adam with `amsgrad=True` (the NRU authors' copy runs), v̂ the running
    maximum of v in place of v. Gradients that shrink make v fall below v̂, where the two rules part."""
    g = torch.Generator().manual_seed(3)
    start = [torch.randn(40, 30, generator=g), torch.randn(30, generator=g)]
    ours = [torch.nn.Parameter(s.clone()) for s in start]
    theirs = [torch.nn.Parameter(s.clone()) for s in start]
    opt = Optimizer("amsgrad", ours, lr=1e-2, rho=0.9, betas=(0.9, 0.999), eps=1e-8, root=torch.sqrt)
    ref = torch.optim.Adam(theirs, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, amsgrad=True, foreach=False)
    plain = [torch.nn.Parameter(s.clone()) for s in start]
    adam = torch.optim.Adam(plain, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, foreach=False)
    for step in range(8):
        for a, b, c in zip(ours, theirs, plain, strict=True):
            grad = torch.randn(a.shape, generator=g) * 10.0 ** (1 - step)  # large, then ever smaller
            a.grad, b.grad, c.grad = grad.clone(), grad.clone(), grad.clone()
        opt.step()
        ref.step()
        adam.step()
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a.detach(), b.detach())
    v, v_max = opt.state[1][0], opt.state[2][0]
    assert bool((v_max > v).all())  # the maximum is what steps
    assert not torch.equal(ours[0].detach(), plain[0].detach())  # and it is not Adam's step


def test_sqrt_and_log_follow_this_processs_mode():
    """The portable mode's √ and float64 log are the correctly rounded √ and the C library's log
    (what `math.log` computes); the native mode's are torch's own, as before issue 33."""
    g = torch.Generator().manual_seed(0)
    a = torch.rand(10_000, generator=g) * 1e-3
    d = torch.rand(10_000, generator=g, dtype=torch.float64) * 1e3
    libm = torch.tensor([math.log(v) for v in d.tolist()], dtype=torch.float64)
    if numerics.current() == "portable":
        assert torch.equal(numerics.sqrt(a), ieee_sqrt(a))
        assert torch.equal(numerics.log(d), libm)
    else:
        assert torch.equal(numerics.sqrt(a), a.sqrt())
        assert torch.equal(numerics.log(d), d.log())


# ----- the learning rate's course (`LearningRate`) ------------------------------------------------------


def test_a_drop_is_kerass_scheduler_and_torchs_multistep_lr():
    """The drops change the rate at each epoch's first step: after 200 epochs HAR-2's code (`lr / 10
    if epoch >= 200`, Keras's 0-based epochs, set as float32) and torch's MultiStepLR, stepped per epoch
    (several drops: its chained products, within double's rounding)."""
    har = LearningRate(1e-3, drop_epochs=(200,), steps_per_epoch=74)
    for n in (1, 200 * 74, 200 * 74 + 1, 300 * 74):
        epoch = (n - 1) // 74
        keras = np.float32(1e-3 / 10 if epoch >= 200 else 1e-3)
        assert np.float32(har.at(n)) == keras, n
    assert har.at(1) == 1e-3  # the trial's own rate, exactly, until it drops

    rate = LearningRate(3e-2, drop_epochs=(2, 5, 6), drop_factor=0.3, steps_per_epoch=3)
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=3e-2)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[2, 5, 6], gamma=0.3)
    for epoch in range(8):
        for i in range(3):
            assert rate.at(epoch * 3 + i + 1) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-15, abs=0)
        opt.step()
        sched.step()


def keras_decayed_lr(lr: float, decay: float, iterations: int) -> torch.Tensor:
    """Keras 2.3.1 RMSprop.get_updates with `decay`: lr · (1 / (1 + decay · iterations)), float32 tensors
    (the rate, the decay and the cast iteration count are float32 variables) — the TF graph's ops."""
    f32 = torch.float32
    lr_t, decay_t, it = (torch.tensor(v, dtype=f32) for v in (lr, decay, float(iterations)))
    return lr_t * (1.0 / (1.0 + decay_t * it))


@pytest.mark.parametrize("lr, steps", [(1e-2, 7_500), (1e-2, 20_000), (1e-3, 20_000), (0.5, 3)])
def test_the_decay_is_kerass_decay_in_float32(lr, steps):
    """`lr_decay_steps` S is Keras 2's decay lr / S (SGORNN's addition code, S = epochs × 100), the rate
    of update n computed as Keras 2.3.1 computes it in float32 with n − 1 iterations done; it ends at
    lr / (1 + lr), not at zero."""
    rate = LearningRate(lr, decay_steps=steps)
    for n in (1, 2, 3, steps // 2, steps, steps + 1):
        assert rate.at(n) == float(keras_decayed_lr(lr, lr / steps, n - 1)), n
    assert rate.at(1) == float(np.float32(lr))
    assert rate.at(steps + 1) == pytest.approx(lr / (1 + lr), rel=3e-7)


def test_each_evaluation_records_the_rate_its_trial_stepped_at_where_it_moves():
    """A moving rate is recorded with each evaluation (and so in the ledger's history and as MLflow's
    `lr`), the same solo and in a bundle; a constant one is not, and its history reads as before."""
    from trainers import train
    from trainers.fused import train_fused

    base = {
        "task": "addition", "task_params": {"seq_len": 10, "n_train": 32, "n_val": 16}, "hidden": 8,
        "steps": 8, "eval_every": 2, "lr": 1e-2, "device": "cpu",
    }  # fmt: skip
    moving = {**base, "lr_drop_epochs": [2], "lr_drop_factor": 0.5, "lr_decay_steps": 4}  # 2 steps an epoch
    solo, constant = train(moving), train(base)
    fused = train_fused([moving, {**base, "seed": 2}])
    rate = LearningRate(1e-2, drop_epochs=(2,), drop_factor=0.5, decay_steps=4, steps_per_epoch=2)
    assert (
        [e.lr for e in solo.history]
        == [rate.at(e.step) for e in solo.history]
        == [e.lr for e in fused[0].history]
    )
    assert solo.history[-1].lr < solo.history[1].lr < solo.history[0].lr  # halved after step 4, decayed
    assert all(e.lr is None and "lr" not in e.to_dict() for e in constant.history + fused[1].history)


def torch04_adam_step(p, grad, state, lr, betas, eps, amsgrad):
    """torch 0.4's `Adam.step` for one parameter (torch/optim/adam.py, 2018; before pytorch#22628, 1.3),
    transcribed: what the NRU code's `optim.Adam(..., amsgrad=config.amsgrad)` computed."""
    beta1, beta2 = betas
    state["step"] += 1
    state["exp_avg"].mul_(beta1).add_(grad, alpha=1 - beta1)
    state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    if amsgrad:
        torch.max(state["max_exp_avg_sq"], state["exp_avg_sq"], out=state["max_exp_avg_sq"])
        denom = state["max_exp_avg_sq"].sqrt().add_(eps)
    else:
        denom = state["exp_avg_sq"].sqrt().add_(eps)
    bias_correction1 = 1 - beta1 ** state["step"]
    bias_correction2 = 1 - beta2 ** state["step"]
    step_size = lr * math.sqrt(bias_correction2) / bias_correction1
    p.addcdiv_(state["exp_avg"], denom, value=-step_size)


@pytest.mark.parametrize(("kind", "amsgrad"), [("keras_adam", False), ("keras_amsgrad", True)])
def test_the_keras_forms_are_torch_0_4s_adam_and_amsgrad(kind, amsgrad):
    """The NRU code ran torch 0.4, whose Adam added ε to √v (or √v̂) and folded both corrections into the
    step: Keras' form. Steps in float64 against the transcription, with gradients small enough (1e-5 and
    below) that ε's place shows: torch's present form (`adam`, `amsgrad`) parts from it there."""
    g = torch.Generator().manual_seed(5)
    start = torch.randn(30, 20, generator=g, dtype=torch.float64)
    ours = torch.nn.Parameter(start.clone())
    modern = torch.nn.Parameter(start.clone())
    ref = start.clone()
    state = {"step": 0, **{k: torch.zeros_like(start) for k in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")}}
    opt = Optimizer(kind, [ours], lr=1e-3, rho=0.9, betas=(0.9, 0.999), eps=1e-8, root=torch.sqrt)
    now = Optimizer(kind.removeprefix("keras_"), [modern], lr=1e-3, rho=0.9, betas=(0.9, 0.999), eps=1e-8,
                    root=torch.sqrt)  # fmt: skip
    for step in range(12):
        grad = torch.randn(start.shape, generator=g, dtype=torch.float64) * 10.0 ** (-5 - step % 3)
        ours.grad, modern.grad = grad.clone(), grad.clone()
        opt.step()
        now.step()
        torch04_adam_step(ref, grad, state, 1e-3, (0.9, 0.999), 1e-8, amsgrad)
    torch.testing.assert_close(ours.detach(), ref, rtol=1e-13, atol=1e-15)
    assert (modern.detach() - ref).abs().max() > 1e-6  # the present form is another optimiser here
