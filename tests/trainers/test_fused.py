"""Fused trial bundles: each member's run equals its solo `train` run, bit for bit (issue 7).

Exact equality holds while MKL runs each member of a batched matmul with the kernel `addmm` runs
for the same shapes and layout (torch 2.14, AVX-512 and AVX2); with another BLAS, relax
`assert_same_run(..., exact=False)` to RTOL.
"""

import dataclasses
import math
import re
from dataclasses import fields

import pytest
import torch

from trainers import TrainConfig, apply_overrides, resolve, train
from trainers import fused as fused_module
from trainers.cells import get_cell, list_cells
from trainers.cells.fastrnn import _projection_grads, fast_rnn, fused_fast_rnn, input_projection
from trainers.cells.srnn import FusedShiftScan, ShiftScan
from trainers.fused import FUSED_CELLS, FusedOptimizer, check_fusable, fusable_key, train_fused
from trainers.kernels import Workspace, elman_rnn, fused_elman_rnn
from trainers.optim import make_optimizer
from trainers.tasks.addition import AdditionTask

pytestmark = pytest.mark.numerics  # CI runs them under every numerics mode

RTOL = 1e-4  # the "tight tolerance" on every evaluation's train and validation loss

# hidden 25 with batch 16: 400 states a step, so f's vectorised body and scalar tail both occur
COPY = {"task": "copy", "hidden": 25, "task_params": {"seq_len": 30, "n_train": 128, "n_val": 64}}
ADDITION = {"task": "addition", "hidden": 16, "task_params": {"seq_len": 30, "n_train": 128, "n_val": 64}}
SCHEDULE = {"steps": 150, "eval_every": 25, "early_stop_loss": None}

# three grid points: learning rate, initialiser, scale and seed all differ
MEMBERS = [
    {"lr": 1e-3, "seed": 1, "cell_params": {"init": "chain", "scale": 1.0}},
    {"lr": 3e-3, "seed": 2, "cell_params": {"init": "orthogonal", "scale": 0.9}},
    {"lr": 5e-4, "seed": 3, "cell_params": {"init": "identity", "scale": 0.5}},
]


def bundle(base, members=MEMBERS, **common):
    return [{**base, **SCHEDULE, **m, **common} for m in members]


def with_cell(configs, **cell):
    return [{**c, "cell_params": {**c.get("cell_params", {}), **cell}} for c in configs]


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def assert_same_run(fused, solo, exact=True, rtol=RTOL):
    """Member vs solo: identity, history step by step (train and validation loss, metric), outcome."""
    assert (fused.status, fused.steps, fused.budget_steps, fused.early_stopped) == (
        solo.status,
        solo.steps,
        solo.budget_steps,
        solo.early_stopped,
    )
    assert (fused.baseline_loss, fused.reference_baselines, fused.param_count, fused.metric_name) == (
        solo.baseline_loss,
        solo.reference_baselines,
        solo.param_count,
        solo.metric_name,
    )
    assert [(e.step, e.epoch) for e in fused.history] == [(e.step, e.epoch) for e in solo.history]
    for f, s in zip(fused.history, solo.history, strict=True):
        if exact:
            assert (f.train_loss, f.val_loss, f.metric) == (s.train_loss, s.val_loss, s.metric), f.step
        else:
            assert rel(f.train_loss, s.train_loss) <= rtol, (f.step, f.train_loss, s.train_loss)
            assert rel(f.val_loss, s.val_loss) <= rtol, (f.step, f.val_loss, s.val_loss)
            if s.metric is not None:  # an accuracy may flip on a near tie: one example at most
                assert abs(f.metric - s.metric) <= 1.0 / 16, (f.step, f.metric, s.metric)
    if solo.recurrent_matrix is None:
        assert fused.recurrent_matrix is None
    elif exact:
        assert torch.equal(fused.recurrent_matrix, solo.recurrent_matrix)
    else:
        assert torch.allclose(fused.recurrent_matrix, solo.recurrent_matrix, rtol=1e-3, atol=1e-5)
    if solo.input_matrix is None:
        assert fused.input_matrix is None
    elif exact:
        assert torch.equal(fused.input_matrix, solo.input_matrix)
        assert (fused.henrici_index, fused.profile) == (solo.henrici_index, solo.profile)


def run_both(configs, **kw):
    fused = train_fused(configs, **kw)
    solo = [train(c) for c in configs]
    return fused, solo


# ----- the kernel ------------------------------------------------------------------------------------


def kernel_inputs(K=3, T=5, B=2, N=4, d=2, dtype=torch.double, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(T, B, d, generator=g, dtype=dtype) for _ in range(K)]
    h0 = torch.randn(K, B, N, generator=g, dtype=dtype).requires_grad_()
    wi = torch.randn(K, N, d, generator=g, dtype=dtype).requires_grad_()
    wr = (0.9 / N**0.5 * torch.randn(K, N, N, generator=g, dtype=dtype)).requires_grad_()
    b = torch.randn(K, N, generator=g, dtype=dtype).requires_grad_()
    return xs, h0, wi, wr, b


@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("nonlinearity", ["elu", "relu", "tanh"])
def test_fused_kernel_gradients_match_finite_differences(nonlinearity, last):
    xs, h0, wi, wr, b = kernel_inputs()

    def fn(h0, wi, wr, b):
        return fused_elman_rnn(xs, h0, wi, wr, b, nonlinearity, last)

    assert torch.autograd.gradcheck(fn, (h0, wi, wr, b))


@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("nonlinearity", ["elu", "relu", "tanh"])
def test_fused_kernel_is_each_members_elman_scan(nonlinearity, last):
    """Float32, N=25, B=16: each member's states and gradients against the solo kernel on its slice."""
    xs, h0, wi, wr, b = kernel_inputs(T=7, N=25, B=16, dtype=torch.float32)
    h0, wi, wr, b = (t.detach().requires_grad_() for t in (h0, wi, wr, b))
    outs = fused_elman_rnn(xs, h0, wi, wr, b, nonlinearity, last)
    weights = [torch.randn_like(o) for o in outs]
    sum((o * w).sum() for o, w in zip(outs, weights, strict=True)).backward()
    for k, x in enumerate(xs):
        p = [t.detach()[k].clone().requires_grad_() for t in (h0, wi, wr, b)]
        hs = elman_rnn(x, p[0], p[1], p[2], p[3], nonlinearity, "scan")
        ref = hs[-1] if last else hs
        (ref * weights[k]).sum().backward()
        pairs = [(outs[k], ref)] + [(t.grad[k], q.grad) for t, q in zip((h0, wi, wr, b), p, strict=True)]
        assert all(torch.equal(f, s) for f, s in pairs)


def fastrnn_inputs(K=3, T=5, B=2, N=4, d=3, dtype=torch.double, seed=1):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(T, B, d, generator=g, dtype=dtype) for _ in range(K)]
    wi = torch.randn(K, N, d, generator=g, dtype=dtype).requires_grad_()
    bias = torch.randn(K, N, generator=g, dtype=dtype).requires_grad_()
    w = (torch.randn(K, N, N, generator=g, dtype=dtype) / N**0.5).requires_grad_()
    a = torch.rand(K, 1, generator=g, dtype=dtype).requires_grad_()
    b = torch.rand(K, 1, generator=g, dtype=dtype).requires_grad_()
    return xs, wi, bias, w, a, b


@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("nonlinearity", ["elu", "relu", "tanh"])
def test_fused_fastrnn_kernel_gradients_match_finite_differences(nonlinearity, last):
    xs, wi, bias, w, a, b = fastrnn_inputs()

    def fn(wi, bias, w, a, b):
        return fused_fast_rnn(xs, wi, bias, w, a, b, nonlinearity, last)

    assert torch.autograd.gradcheck(fn, (wi, bias, w, a, b))


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("nonlinearity", ["elu", "relu", "tanh"])
def test_fused_fastrnn_kernel_is_each_members_fast_rnn(nonlinearity, last, with_bias):
    """Float32, N=25, B=16, d=10, per-member a and β: states and every gradient (W_in and bias
    included) against the solo `fast_rnn`, projection and all."""
    xs, wi, bias, w, a, b = fastrnn_inputs(T=7, B=16, N=25, d=10, dtype=torch.float32, seed=2)
    params = (wi, bias if with_bias else None, w, a, b)
    ws = Workspace()
    for _ in range(2):  # the second call reuses the workspace's buffers
        for t in params:
            if t is not None:
                t.grad = None
        outs = fused_fast_rnn(xs, *params, nonlinearity, last, ws)
        weights = [torch.randn_like(o) for o in outs]
        sum((o * q).sum() for o, q in zip(outs, weights, strict=True)).backward()
        for k, x in enumerate(xs):
            p = [t.detach()[k].clone().requires_grad_() if t is not None else None for t in params]
            hs = fast_rnn(x, p[0], p[2], p[1], p[3], p[4], nonlinearity)
            ref = hs[-1] if last else hs
            (ref * weights[k]).sum().backward()
            pairs = [(outs[k], ref)] + [
                (t.grad[k], q.grad) for t, q in zip(params, p, strict=True) if t is not None
            ]
            assert all(torch.equal(f, s) for f, s in pairs), k


@pytest.mark.parametrize("layout", ["row-major", "column-major"])
@pytest.mark.parametrize("d", [1, 10])
def test_fastrnn_projection_grads_are_autograds_through_input_projection(d, layout):
    """The fused scan's ∂W_in and ∂bias: autograd's own, for either memory layout of W_in (the
    branch torch's mm backward takes depends on it)."""
    g = torch.Generator().manual_seed(4)
    x, grad = torch.randn(9, 16, d, generator=g), torch.randn(9, 16, 25, generator=g)
    w = torch.randn(25, d, generator=g) if layout == "row-major" else torch.randn(d, 25, generator=g).t()
    w.requires_grad_()
    bias = torch.randn(25, generator=g).requires_grad_()
    input_projection(x, w, bias).backward(grad)
    grad_w, grad_b = _projection_grads(x, w.detach(), grad, True)
    assert torch.equal(grad_w, w.grad) and torch.equal(grad_b, bias.grad)


@pytest.mark.parametrize("last", [False, True])
def test_fused_shift_scan_is_each_members_shift_scan(last):
    """SRNN's shift for K members, B·N = 21 (not a multiple of a vector: scalar tails inside every
    member's rows): states and drive gradients against `ShiftScan` on each member alone, twice
    through one workspace."""
    g = torch.Generator().manual_seed(3)
    K, T, B, N = 3, 6, 3, 7
    ws = Workspace()
    for _ in range(2):
        drives = [torch.randn(T, B, N, generator=g).requires_grad_() for _ in range(K)]
        outs = FusedShiftScan.apply(last, ws, *drives)
        weights = [torch.randn_like(o) for o in outs]
        sum((o * q).sum() for o, q in zip(outs, weights, strict=True)).backward()
        for k, b in enumerate(drives):
            solo = b.detach().clone().requires_grad_()
            hs = ShiftScan.apply(solo)
            ref = hs[-1] if last else hs
            (ref * weights[k]).sum().backward()
            assert torch.equal(outs[k], ref) and torch.equal(b.grad, solo.grad), k


# ----- the optimiser ---------------------------------------------------------------------------------


@pytest.mark.parametrize("optimizer", ["rmsprop", "adam", "keras_adam", "amsgrad", "keras_amsgrad"])
def test_stacked_optimizer_takes_a_solo_runs_steps_bit_for_bit(optimizer):
    """Per-member lr, ρ/β, ε and clip (one member unclipped), gradients large enough to clip; the
    reference is a solo run's optimiser in this process's mode (`make_optimizer`: torch's own in the
    native mode, trainers.optim's with its correctly rounded √ in the portable one)."""
    cfgs = [
        resolve({"lr": 1e-3, "rho": 0.9, "betas": (0.9, 0.999), "eps": 1e-7, "clip_norm": 10.0}).config,
        resolve({"lr": 3e-2, "rho": 0.5, "betas": (0.8, 0.99), "eps": 1e-3, "clip_norm": 0.5}).config,
        resolve({"lr": 1e-4, "rho": 0.99, "betas": (0.5, 0.9), "eps": 1e-8, "clip_norm": None}).config,
    ]
    g = torch.Generator().manual_seed(0)
    shapes = [(6, 6), (6, 2), (6,), (3, 6), (3,)]
    start = [torch.randn(3, *s, generator=g) for s in shapes]
    grads = [[torch.randn(3, *s, generator=g) * 10.0 ** (i % 3 - 1) for s in shapes] for i in range(6)]
    stacked = [p.clone().requires_grad_() for p in start]
    opt = FusedOptimizer(optimizer, cfgs, stacked, steps_per_epoch=1)  # constant rates: no epoch counts
    for gs in grads:
        for p, gr in zip(stacked, gs, strict=True):
            p.grad = gr.clone()
        opt.step(stacked)
    for k, cfg in enumerate(cfgs):
        params = [torch.nn.Parameter(p[k].clone()) for p in start]
        ref = make_optimizer(dataclasses.replace(cfg, optimizer=optimizer), params)
        for gs in grads:
            for p, gr in zip(params, gs, strict=True):
                p.grad = gr[k].clone()
            if cfg.clip_norm:
                torch.nn.utils.clip_grad_norm_(params, cfg.clip_norm)
            ref.step()
        assert all(torch.equal(p.detach(), s[k]) for p, s in zip(params, stacked, strict=True)), k


# ----- equivalence with train ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "data", "optimizer"),
    [
        (COPY, "fixed", "rmsprop"),  # sequence loss, elu
        (ADDITION, "fixed", "rmsprop"),  # last-step loss, relu
        (ADDITION, "fresh", "adam"),
        (ADDITION, "fixed", "keras_adam"),
        (COPY, "fresh", "amsgrad"),
    ],
)
def test_each_member_runs_as_it_would_alone(base, data, optimizer):
    configs = [
        {**c, "task_params": {**c["task_params"], "data": data}, "optimizer": optimizer} for c in bundle(base)
    ]
    fused, solo = run_both(configs)
    for f, s in zip(fused, solo, strict=True):
        assert f.status == "done" and len(f.history) == 6
        assert_same_run(f, s)


@pytest.mark.parametrize("nonlinearity", ["relu", "tanh", "elu"])
def test_every_initialiser_and_nonlinearity(nonlinearity):
    """chain, fbchain, identity (row-major W) and orthogonal (column-major W) in one bundle."""
    members = [
        {"lr": 1e-3, "seed": 1, "cell_params": {"init": "chain", "scale": 1.0}},
        {"lr": 3e-3, "seed": 2, "cell_params": {"init": "fbchain", "scale": 0.2}},
        {"lr": 5e-4, "seed": 3, "cell_params": {"init": "identity", "scale": 0.5}},
        {"lr": 2e-3, "seed": 4, "cell_params": {"init": "orthogonal", "scale": 1.1}},
    ]
    configs = with_cell(bundle(ADDITION, members), nonlinearity=nonlinearity)
    fused, solo = run_both(configs)
    for f, s in zip(fused, solo, strict=True):
        assert_same_run(f, s)


def test_members_sharing_a_seed_see_the_same_batches_in_every_layout_group():
    """A grid over init × seed: chain and orthogonal run as separate sub-bundles, each from step 1."""
    members = [
        {"lr": 1e-3, "seed": 7, "cell_params": {"init": "chain"}},
        {"lr": 1e-3, "seed": 7, "cell_params": {"init": "orthogonal"}},
        {"lr": 3e-3, "seed": 7, "cell_params": {"init": "orthogonal"}},
        {"lr": 3e-3, "seed": 8, "cell_params": {"init": "chain"}},
    ]
    fused, solo = run_both(bundle(ADDITION, members, steps=40, eval_every=20))
    for f, s in zip(fused, solo, strict=True):
        assert_same_run(f, s)


def test_psmnist_members_each_with_their_own_permutation(tiny_mnist_root):
    base = {"task": "psmnist", "hidden": 9, "task_params": {"root": str(tiny_mnist_root)}}
    configs = [{**c, "steps": 40, "eval_every": 10} for c in bundle(base)]
    fused, solo = run_both(configs)
    for f, s in zip(fused, solo, strict=True):
        assert f.status == "done" and f.metric_name == "accuracy" and len(f.history) == 4
        assert_same_run(f, s)


@pytest.mark.parametrize("buffer_bytes", [None, 1])  # the default: every member in one pass; 1: one each
def test_validation_in_batches_and_member_chunks_is_each_members_own(monkeypatch, buffer_bytes):
    """Validation batches of 24, 24 and 16 (n_val 64), members evaluated together or one by one."""
    if buffer_bytes is not None:
        monkeypatch.setattr(fused_module.validation, "EVAL_BUFFER_BYTES", buffer_bytes)
    members = [*MEMBERS, {"lr": 2e-3, "seed": 1, "cell_params": {"init": "fbchain", "scale": 0.2}}]
    fused, solo = run_both(bundle(COPY, members, steps=50, eval_every=25, eval_batch_size=24))
    for f, s in zip(fused, solo, strict=True):
        assert len(f.history) == 2
        assert_same_run(f, s)


def test_a_diverging_member_fails_alone_and_the_others_are_untouched():
    members = [*MEMBERS[:1], {"lr": 50.0, "seed": 2, "clip_norm": None}, *MEMBERS[2:]]
    configs = bundle(ADDITION, members)
    fused, solo = run_both(configs)
    assert fused[1].status == solo[1].status == "failed"
    assert fused[1].reason == solo[1].reason and "not finite" in fused[1].reason
    assert fused[1].steps == solo[1].steps < 150 and fused[1].recurrent_matrix is None
    for f, s in zip(fused, solo, strict=True):
        assert_same_run(f, s)
    assert fused[0].steps == fused[2].steps == 150


def test_a_member_follows_its_own_divergence_guard_as_its_solo_run():
    """The opt-in guard (not the papers' protocol) per member: a guard far below any real loss fails
    that member at its first check, exactly where its solo run fails; the others train on."""
    members = [MEMBERS[0], {**MEMBERS[1], "divergence_guard": 1e-3}, MEMBERS[2]]
    fused, solo = run_both(bundle(ADDITION, members))
    assert fused[1].status == solo[1].status == "failed" and "divergence guard" in fused[1].reason
    assert fused[1].steps == solo[1].steps == 25
    for f, s in zip(fused, solo, strict=True):
        assert_same_run(f, s)


def test_a_member_that_stops_early_leaves_the_bundle_as_it_would_alone():
    members = [MEMBERS[0], {**MEMBERS[1], "early_stop_loss": 10.0}, MEMBERS[2]]
    seen = []
    fused = train_fused(bundle(ADDITION, members), report=lambda k, e: seen.append((k, e.step)))
    solo = [train(c) for c in bundle(ADDITION, members)]
    assert fused[1].early_stopped and fused[1].steps == 25 and len(fused[1].history) == 1
    for f, s in zip(fused, solo, strict=True):
        assert_same_run(f, s)
    assert sorted(k for k, step in seen if step == 25) == [0, 1, 2]
    assert sorted(k for k, step in seen if step == 150) == [0, 2]


def test_a_members_result_is_handed_out_as_it_leaves_the_bundle():
    """`finished`: a member that stops early is handed out as it leaves (after its evaluations, before
    the rest train on), the rest together at the bundle's end, each once: a bundle's process lost
    later loses none of them. (Before, every result waited for the whole bundle.)"""
    members = [MEMBERS[0], {**MEMBERS[0], "lr": 3e-3, "seed": 2, "early_stop_loss": 10.0}, MEMBERS[2]]
    seen: list[tuple] = []
    final: dict[int, object] = {}

    def finished(results):
        seen.append(("finished", *sorted(k for k, _ in results)))
        final.update(results)

    fused = train_fused(
        bundle(ADDITION, members),
        report=lambda k, e: seen.append(("evaluated", k, e.step)),
        finished=finished,
    )
    assert fused[1].early_stopped and fused[1].steps == 25
    leaves = seen.index(("finished", 1))
    assert seen[:leaves] == [("evaluated", k, 25) for k in (0, 1, 2)]
    assert seen[leaves + 1 :] == [
        *(("evaluated", k, s) for s in range(50, 151, 25) for k in (0, 2)),
        ("finished", 0, 2),
    ]
    assert final == dict(enumerate(fused))  # each member's returned result, once
    assert {r.provenance["bundle_members"] for r in fused} == {"3"}


def test_report_sees_each_members_evaluations_with_its_index():
    seen = []
    fused = train_fused(
        bundle(ADDITION, MEMBERS, steps=10, eval_every=4), report=lambda k, e: seen.append((k, e))
    )
    for k, result in enumerate(fused):
        assert [e for i, e in seen if i == k] == result.history
        assert [e.step for e in result.history] == [4, 8, 10]


def test_an_exception_fails_every_member_with_its_reason(monkeypatch):
    def boom(self, batch, device):
        raise RuntimeError("out of memory (simulated)")

    monkeypatch.setattr(AdditionTask, "encode", boom)
    fused = train_fused(bundle(ADDITION, MEMBERS))
    assert all(r.status == "failed" and "out of memory (simulated)" in r.reason for r in fused)


# ----- running out of memory ----------------------------------------------------------------------

CHAINS = [{"lr": lr, "seed": seed, "cell_params": {"init": "chain"}} for lr, seed in
          ((1e-3, 1), (3e-3, 2), (5e-4, 3), (2e-3, 1), (1e-4, 4))]  # fmt: skip


def fake_memory(monkeypatch, members_that_fit, from_step=1):
    """An allocator that holds a bundle of at most `members_that_fit` members: a larger one runs out
    of memory at its `from_step`-th step, as CUDA's allocator raises it."""
    real = fused_module.steps.forward_backward
    steps: dict[int, int] = {}

    def forward_backward(model, optimizer, members, batch):
        steps[id(model)] = steps.get(id(model), 0) + 1
        if len(members) > members_that_fit and steps[id(model)] >= from_step:
            raise torch.OutOfMemoryError(f"CUDA out of memory (fake: {len(members)} members)")
        return real(model, optimizer, members, batch)

    monkeypatch.setattr(fused_module.steps, "forward_backward", forward_backward)


@pytest.mark.parametrize("from_step", [1, 40])  # at the first step, and after the first evaluation
def test_a_bundle_out_of_memory_trains_again_in_halves_each_member_as_alone(monkeypatch, from_step):
    """5 members where 2 fit: 5 → 2 + 3 → 2 + 1 + 2, every member its solo run; each evaluation is
    reported once (those before the split are not reported again)."""
    configs = bundle(COPY, CHAINS)
    solo = [train(c) for c in configs]
    fake_memory(monkeypatch, 2, from_step)
    reports: list[tuple[int, int, float]] = []
    fused = train_fused(configs, lambda k, e: reports.append((k, e.step, e.val_loss)))
    for f, s in zip(fused, solo, strict=True):
        assert_same_run(f, s)
    assert sorted(reports) == sorted((k, e.step, e.val_loss) for k, s in enumerate(solo) for e in s.history)
    # each result says in what bundle it trained to the end: the halves, then the halves' halves
    assert sorted(int(r.provenance["bundle_members"]) for r in fused) == [1, 2, 2, 2, 2]


def test_a_member_that_runs_out_of_memory_alone_fails_with_the_reason(monkeypatch):
    fake_memory(monkeypatch, 0)
    fused = train_fused(bundle(COPY, CHAINS[:3]))
    assert [r.status for r in fused] == ["failed"] * 3
    assert all(r.reason.startswith("OutOfMemoryError: CUDA out of memory (fake: 1 members)") for r in fused)


@pytest.mark.parametrize("where", ["building a member", "training the bundle"])
def test_a_sticky_device_error_ends_the_bundle_by_raising(monkeypatch, where):
    """No member's result: the service runs the bundle again in a new process (tests/trainers/test_loop.py)."""

    def boom(*args, **kwargs):
        raise torch.AcceleratorError("CUDA error: unspecified launch failure")

    target = (
        (fused_module.members, "build_model")
        if where == "building a member"
        else (fused_module.steps, "forward_backward")
    )
    monkeypatch.setattr(*target, boom)
    with pytest.raises(torch.AcceleratorError, match="unspecified launch failure"):
        train_fused(bundle(COPY, CHAINS[:3]))


def test_out_of_memory_is_the_allocators_on_either_device():
    assert fused_module.out_of_memory(
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    )
    cpu = "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried to allocate"
    assert fused_module.out_of_memory(RuntimeError(cpu))
    assert not fused_module.out_of_memory(RuntimeError("shape '[448, 10]' is invalid for input of size 3840"))
    assert not fused_module.out_of_memory(ValueError("can't allocate memory"))


def test_nan_in_one_member_does_not_reach_the_others(monkeypatch):
    """A member whose loss turns NaN (here: its third batch) fails at the next check; the rest run on."""
    original = AdditionTask.loss
    calls = {"n": 0}

    def loss(self, out, y):
        calls["n"] += 1
        value = original(self, out, y)
        return value * math.nan if self.seed == 2 and calls["n"] > 6 else value

    monkeypatch.setattr(AdditionTask, "loss", loss)
    fused = train_fused(bundle(ADDITION, MEMBERS, steps=60, eval_every=60))
    monkeypatch.setattr(AdditionTask, "loss", original)
    solo = [train(c) for c in bundle(ADDITION, MEMBERS, steps=60, eval_every=60)]
    assert fused[1].status == "failed" and "nan" in fused[1].reason and fused[1].steps == 50
    for k in (0, 2):
        assert_same_run(fused[k], solo[k])


# ----- every fused cell ---------------------------------------------------------------------------

# per cell: members that differ in learning rate, seed and the fields that only set initial weights;
# hidden 26 with batch 12 (312 states a step: f's vectorised body and scalar tail both occur)
CELL_MEMBERS = {
    "rnn": [{"init": "chain"}, {"init": "orthogonal", "scale": 0.9}, {"init": "identity"}],
    "urnn": [{}, {"init": "chain"}, {"input_init": "initializer", "init": "identity"}],
    "crnn": [{}, {"init": "fbchain", "scale": 1.5}, {"scale": 1.2}],
    "vprnn": [{}, {"theta_bound": 0.5}, {}],
    "fastrnn": [{}, {"alpha_init": -2.0, "beta_init": 2.0}, {}],
    "sgornn": [{}, {"alpha_init": -2.0}, {"theta_bound": 0.3}],
    "srnn": [{}, {}, {}],
}
SMALL = {"rotations": 4, "hyper_size": 8}  # shape fields of the rotation cells and SRNN, kept small


def cell_bundle(cell, base, **cell_fields):
    shape = {k: v for k, v in SMALL.items() if k in {f.name for f in fields(get_cell(cell).Config)}}
    return [
        {**c, "cell": cell, "cell_params": {**shape, **extra, **cell_fields}}
        for c, extra in zip(bundle(base), CELL_MEMBERS[cell], strict=True)
    ]


def test_every_fused_cell_has_members_to_test_it_with():
    assert set(CELL_MEMBERS) == set(FUSED_CELLS) and set(FUSED_CELLS) <= set(list_cells())


@pytest.mark.parametrize("cell", sorted(FUSED_CELLS))
@pytest.mark.parametrize(
    ("base", "common"),
    [
        ({**COPY, "hidden": 26}, {"batch_size": 12, "steps": 60, "eval_every": 20}),  # sequence loss
        (ADDITION, {"steps": 60, "eval_every": 20, "optimizer": "adam"}),  # last-step loss
    ],
    ids=["copy", "addition-adam"],
)
def test_each_member_of_every_fused_cell_runs_as_it_would_alone(cell, base, common):
    configs = [{**c, **common} for c in cell_bundle(cell, base)]
    fused, solo = run_both(configs)
    for f, s in zip(fused, solo, strict=True):
        assert f.status == "done" and len(f.history) == 3
        assert_same_run(f, s)


@pytest.mark.parametrize("cell", ["fastrnn", "sgornn"])
def test_fastrnn_cells_without_the_clip_and_with_tanh(cell):
    configs = cell_bundle(cell, ADDITION, clip_scalar=False, nonlinearity="tanh")
    fused, solo = run_both([{**c, "steps": 40, "eval_every": 20} for c in configs])
    for f, s in zip(fused, solo, strict=True):
        assert_same_run(f, s)


def test_rnn_members_with_nn_rnns_two_biases_and_init():
    """`bias_hh` (nn.RNN's second bias, the sum entering the scan) and `init="plain"` beside Orhan's."""
    configs = cell_bundle("rnn", ADDITION, bias_hh=True, nonlinearity="tanh")
    configs[0] = {**configs[0], "cell_params": {**configs[0]["cell_params"], "init": "plain"}}
    fused, solo = run_both([{**c, "steps": 40, "eval_every": 20} for c in configs])
    for f, s in zip(fused, solo, strict=True):
        assert_same_run(f, s)


def test_srnn_without_gate_and_with_a_deeper_mlp():
    configs = cell_bundle("srnn", COPY, no_gate=True, n_layers=2)
    fused, solo = run_both([{**c, "steps": 40, "eval_every": 20} for c in configs])
    for f, s in zip(fused, solo, strict=True):
        assert_same_run(f, s)


@pytest.mark.parametrize(
    ("cell", "change", "field"),
    [
        ("srnn", {"hyper_size": 16}, "cell_params.hyper_size"),
        ("srnn", {"no_gate": True}, "cell_params.no_gate"),
        ("sgornn", {"rotations": 6}, "cell_params.rotations"),
        ("sgornn", {"clip_scalar": False}, "cell_params.clip_scalar"),
        ("vprnn", {"nonlinearity": "tanh"}, "cell_params.nonlinearity"),
        ("rnn", {"bias_hh": True}, "cell_params.bias_hh"),
    ],
)
def test_fused_cells_refuse_members_of_another_shape(cell, change, field):
    configs = cell_bundle(cell, ADDITION)
    configs[1] = {**configs[1], "cell_params": {**configs[1]["cell_params"], **change}}
    with pytest.raises(ValueError, match=re.escape(f"differ in '{field}'")):
        train_fused(configs)


@pytest.mark.parametrize("cell", ["sgornn", "srnn", "urnn"])
def test_members_leaving_a_fused_cells_bundle_leave_the_others_untouched(cell):
    """Member 0 fails its divergence guard at the first check, member 1 stops early at the second;
    member 2 trains on alone (its rows, permutations and MLP weights are the ones kept)."""
    configs = cell_bundle(cell, ADDITION)
    configs[0] = {**configs[0], "divergence_guard": 1e-3, "eval_every": 10}
    configs[1] = {**configs[1], "early_stop_loss": 10.0, "eval_every": 10}
    configs[2] = {**configs[2], "eval_every": 10}
    fused, solo = run_both([{**c, "steps": 40} for c in configs])
    assert fused[0].status == "failed" and fused[0].steps == 10
    assert fused[1].early_stopped and fused[1].steps == 10 and fused[2].steps == 40
    for f, s in zip(fused, solo, strict=True):
        assert_same_run(f, s)


# ----- grouping --------------------------------------------------------------------------------------


def test_grid_points_of_one_shape_share_a_key_and_other_shapes_do_not():
    a, b, c = (resolve(cfg) for cfg in bundle(COPY))
    assert fusable_key(a) == fusable_key(b) == fusable_key(c)
    assert fusable_key(resolve({**COPY, "hidden": 32})) != fusable_key(a)
    assert fusable_key(resolve({**COPY, "cell": "lstm"})) is None
    assert fusable_key(resolve({**COPY, "task": "ptb", "task_params": {}})) is None


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"hidden": 32}, "hidden"),
        ({"batch_size": 8}, "batch_size"),
        ({"steps": 10}, "budget"),
        ({"optimizer": "adam"}, "optimizer"),
        ({"task_params": {**COPY["task_params"], "seq_len": 40}}, "task_params"),
        ({"cell_params": {"nonlinearity": "tanh"}}, "cell_params.nonlinearity"),
    ],
)
def test_configs_that_differ_in_shape_are_refused_naming_the_field(change, field):
    configs = bundle(COPY)
    configs[2] = {**configs[2], **change}
    with pytest.raises(ValueError, match=re.escape(f"differ in '{field}'")):
        train_fused(configs)


VARCOPY = {"task": "varcopy", "hidden": 12, "steps": 4, "eval_every": 2,
           "task_params": {"lag_min": 2, "lag_max": 12, "n_train": 64, "n_val": 22}}  # fmt: skip


def test_varcopy_bundles_share_a_seed_and_train_each_member_as_alone():
    """varcopy draws one lag per batch, so two seeds' batches differ in length at the same step: such
    trials bundle per seed (their bundle used to fail every member on a shape error), and a bundle of
    one seed's learning rates is each member's solo run."""
    one, other = resolve({**VARCOPY, "seed": 1}), resolve({**VARCOPY, "seed": 2})
    assert fusable_key(one) != fusable_key(other)
    with pytest.raises(ValueError, match=re.escape("differ in 'seed'")):
        check_fusable([one, other])
    configs = [{**VARCOPY, "seed": 3, "lr": lr} for lr in (1e-3, 3e-4)]
    for fused, cfg in zip(train_fused(configs), configs, strict=True):
        assert fused.status == "done", fused.reason
        assert_same_run(fused, train(cfg))


def test_unsupported_cells_are_refused_with_what_to_do():
    with pytest.raises(ValueError, match=r"train it with trainers\.train"):
        check_fusable([resolve({**COPY, "cell": "lstm"})])
    assert train_fused([]) == []


@pytest.mark.slow
def test_a_long_copy_run_stays_identical():
    """400 steps of copy (elu); member 1 (lr 3e-3) would turn a 1e-7 difference into ~40 % here."""
    configs = [{**c, "steps": 400, "eval_every": 50} for c in bundle(COPY)]
    fused, solo = run_both(configs)
    for f, s in zip(fused, solo, strict=True):
        assert_same_run(f, s)


def test_a_members_memory_counts_its_own_parameters_and_its_cells_stores():
    """Packing sized every fused cell's bundle by an Elman cell's parameter count and two stores (the
    service's guess: VPRNN's 3,465 parameters at hidden 128 counted as 18,953, FastRNN's four stores as
    two); `member_bytes` is now the trainers' own, counted on the member's model and its `FusedCell`."""
    from trainers.fused import member_bytes
    from trainers.fused.memory import FLOAT_BYTES
    from trainers.model import build_model, count_params

    def of(cell: str) -> tuple[int, int]:
        cfg = apply_overrides(TrainConfig(task="addition", cell=cell), {"hidden": 64, "seq_len": 50})
        r = resolve(cfg)
        return member_bytes(r), count_params(build_model(r, r.make_task()))

    (rnn, rnn_params), (srnn, srnn_params), (fast, fast_params) = of("rnn"), of("srnn"), of("fastrnn")
    assert srnn_params != rnn_params  # SRNN's shift and MLP against a dense W: counted alike before
    assert rnn - srnn == FLOAT_BYTES * 4 * (rnn_params - srnn_params)  # both keep two stores
    batch_steps = 50 * TrainConfig().batch_size  # addition: T = 50, one batch over it
    extra_stores = FLOAT_BYTES * batch_steps * 2 * (4 - 2) * 64  # four stores and their gradients, not two
    assert fast - rnn == extra_stores + FLOAT_BYTES * 4 * (fast_params - rnn_params)
