"""SRNN's persistent shift kernel (`trainers.kernels_persistent.persistent_shift_scan`, issue 37) on the
CPU under Triton's interpreter: its states and drive gradients against `FusedShiftScan` (and each
member's `ShiftScan`) bit for bit in float32 and against an unrolled autograd recurrence in float64; a
member against its run alone; SRNN's `backend="persistent"` through `train` and `train_fused`, equal to
`auto` bit for bit. At tiny shapes: seconds in all."""

import pytest
import torch

from tests.trainers.interpreted import persistent_kernel

persistent = persistent_kernel()  # before anything imports the kernel without the interpreter

from tests.trainers.test_fused import assert_same_run  # noqa: E402
from trainers import train  # noqa: E402
from trainers.cells.srnn import FusedShiftScan, ShiftScan  # noqa: E402
from trainers.config import resolve  # noqa: E402
from trainers.fused import check_fusable, train_fused  # noqa: E402
from trainers.kernels import Workspace  # noqa: E402

pytestmark = pytest.mark.numerics


def drives(seed: int, K: int, T: int, B: int, N: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """K drives b_k [T, B, N] needing gradients: about half of the pre-activations are negative, so
    the ReLU's mask has both values."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(T, B, N, generator=g, dtype=dtype).requires_grad_() for _ in range(K)]


def out_grads(outs, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in outs]


def poisoned() -> Workspace:
    """A workspace whose buffers start as NaN: an element the kernel leaves unwritten shows."""
    ws = Workspace()
    for name in ("drive", "hs", "grad"):
        ws.buffers[name] = torch.full((1 << 14,), float("nan"), dtype=torch.float32)
    return ws


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (a signed zero too), not only as values."""
    ints = {torch.float32: torch.int32, torch.float64: torch.int64}[a.dtype]
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(ints), b.view(ints))


@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize(("B", "N"), [(2, 4), (20, 10)])
def test_float32_states_and_drive_gradients_are_the_fused_scans_bit_for_bit(B, N, K, last):
    """Against `FusedShiftScan` (states, ∂b) and, for every state, each member's `ShiftScan`. N = 10
    is no power of two (padded to 16, masked); B = 20 is two batch slices of 16. With K = 3 member 1's
    outputs get no gradient (its ∂b is zero, as the reference's)."""
    T = 7
    bs = drives(10 * N + K, K, T, B, N, torch.float32)
    ours = persistent.persistent_shift_scan(bs, last, poisoned())
    ref = FusedShiftScan.apply(last, Workspace(), *bs)
    for o, r in zip(ours, ref, strict=True):
        assert torch.isfinite(o).all() and same_bits(o, r)
    if not last:
        for o, b in zip(ours, bs, strict=True):
            assert same_bits(o, ShiftScan.apply(b))
    used = [k for k in range(K) if k != 1]
    gs = out_grads(ours, seed=1)
    g_ours = torch.autograd.grad([ours[k] for k in used], bs, [gs[k] for k in used])
    g_ref = torch.autograd.grad([ref[k] for k in used], bs, [gs[k] for k in used])
    for o, r in zip(g_ours, g_ref, strict=True):
        assert torch.isfinite(o).all() and same_bits(o, r)
    if K == 3:
        assert not g_ours[1].any() and g_ours[0].any()
    if not last:
        for k in used:
            b = bs[k].detach().requires_grad_()
            (g_solo,) = torch.autograd.grad(ShiftScan.apply(b), b, gs[k])
            assert same_bits(g_ours[k], g_solo)


@pytest.mark.parametrize("last", [False, True])
def test_float64_matches_an_unrolled_recurrence(last):
    """Against plain autograd through h_t = ReLU(b_t + torch.roll(h_{t−1}, 1, -1)), h_0 = 0, float64: a
    reference that shares no code with either scan. Every operation is elementwise and rounds alike on
    both paths (autograd's ReLU' selects where the scan multiplies by 0/1), so the values are equal."""
    K, T, B, N = 3, 6, 20, 10
    bs = drives(7, K, T, B, N, torch.float64)
    ours = persistent.persistent_shift_scan(bs, last)
    ref = []
    for b in bs:
        h, states = torch.zeros(B, N, dtype=torch.float64), []
        for t in range(T):
            h = torch.relu(b[t] + torch.roll(h, 1, -1))
            states.append(h)
        ref.append(h if last else torch.stack(states))
    for o, r in zip(ours, ref, strict=True):
        assert torch.equal(o, r)
    gs = out_grads(ours, seed=2)
    for o, r in zip(torch.autograd.grad(ours, bs, gs), torch.autograd.grad(ref, bs, gs), strict=True):
        assert torch.equal(o, r)


def test_a_member_equals_its_run_alone_bit_for_bit():
    """A member's program runs the same operations whatever K is: its states and ∂b through a bundle of
    3 are those of a bundle of 1."""
    bs = drives(3, 3, 6, 20, 12, torch.float32)
    outs = persistent.persistent_shift_scan(bs)
    gs = out_grads(outs, seed=4)
    g = torch.autograd.grad(outs, bs, gs)
    for k in range(3):
        b = bs[k].detach().requires_grad_()
        (alone,) = persistent.persistent_shift_scan([b])
        assert same_bits(alone, outs[k])
        assert same_bits(torch.autograd.grad(alone, b, gs[k])[0], g[k])


def test_a_nan_drive_gives_nan_states_as_the_reference():
    """ReLU keeps a NaN (torch's relu and clamp do; a plain max would turn it into 0 on a GPU)."""
    bs = drives(5, 2, 4, 3, 6, torch.float32)
    with torch.no_grad():
        bs[1][1, 2, 3] = float("nan")
    ours = persistent.persistent_shift_scan(bs)
    ref = FusedShiftScan.apply(False, Workspace(), *bs)
    assert ours[1].isnan().any()
    for o, r in zip(ours, ref, strict=True):
        torch.testing.assert_close(o, r, rtol=0, atol=0, equal_nan=True)


def test_cpu_tensors_without_the_interpreter_are_refused(monkeypatch):
    monkeypatch.setattr(persistent, "INTERPRETED", False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        persistent.persistent_shift_scan(drives(5, 1, 2, 2, 4, torch.float32))


# ----- SRNN's backend="persistent" -------------------------------------------------------------------

# tiny: the interpreter runs each program's T steps as numpy operations, one program after another
TASKS = {
    "addition": {"task": "addition", "task_params": {"seq_len": 8, "n_train": 32, "n_val": 16}},  # last
    "copy": {"task": "copy", "task_params": {"seq_len": 21, "n_train": 32, "n_val": 16}},  # every step
}
SCHEDULE = {"hidden": 12, "steps": 4, "eval_every": 2, "early_stop_loss": None}
MEMBERS = [{"lr": 3e-3, "seed": 1}, {"lr": 1e-3, "seed": 2}]


def configs(task: str, backend: str) -> list[dict]:
    params = {"hyper_size": 4, "backend": backend}
    return [{**TASKS[task], **SCHEDULE, **m, "cell": "srnn", "cell_params": params} for m in MEMBERS]


@pytest.mark.parametrize("task", ["addition", "copy"])
def test_persistent_srnn_trains_as_auto_bit_for_bit_solo_and_bundled(task):
    """`train` and `train_fused` with backend="persistent" against backend="auto" (`ShiftScan` /
    `FusedShiftScan`): the whole loop (every evaluation's train and validation loss) bit for bit —
    the kernel's numbers are the scans', and a solo run is a bundle of one through the kernel."""
    persistent_runs = train_fused(configs(task, "persistent"))
    auto_runs = train_fused(configs(task, "auto"))
    for p, a, c_p, c_a in zip(
        persistent_runs, auto_runs, configs(task, "persistent"), configs(task, "auto"), strict=True
    ):
        solo_p, solo_a = train(c_p), train(c_a)
        assert p.status == solo_p.status == "done", (p.reason, solo_p.reason)
        assert len(solo_p.history) == 2
        for run in (a, solo_p, solo_a):
            assert_same_run(p, run)


def test_members_with_another_backend_do_not_fuse():
    """`backend` is one of the fields an SRNN bundle's members share."""
    mixed = [resolve(configs("addition", "persistent")[0]), resolve(configs("addition", "auto")[1])]
    with pytest.raises(ValueError, match=r"differ in 'cell_params.backend' \('persistent' vs 'auto'\)"):
        check_fusable(mixed)
