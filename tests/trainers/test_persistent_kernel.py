"""The persistent Elman kernel (`trainers.kernels_persistent`, issue 37) on the CPU, under Triton's
interpreter: its states and every gradient against `FusedElmanScan` / `ElmanScan` in float32 and
against an unrolled autograd recurrence in float64, at tiny shapes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.trainers.interpreted import persistent_kernel

persistent = persistent_kernel()  # before anything imports the kernel without the interpreter

from trainers.kernels import ElmanScan, Workspace, fused_elman_rnn  # noqa: E402

pytestmark = pytest.mark.numerics
ROOT = Path(__file__).resolve().parents[2]
ACT = {"elu": torch.nn.functional.elu, "relu": torch.relu, "tanh": torch.tanh}


def bundle(seed: int, K: int, T: int, B: int, N: int, d: int, dtype: torch.dtype, transposed: bool = False):
    """Member inputs xs, and h0, V, W, b stacked [K, …], all needing gradients (fresh random draws)."""
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(T, B, d, generator=g, dtype=dtype).requires_grad_() for _ in range(K)]
    h0 = torch.randn(K, B, N, generator=g, dtype=dtype).requires_grad_()
    w_in = torch.randn(K, N, d, generator=g, dtype=dtype).requires_grad_()
    w = 0.9 / N**0.5 * torch.randn(K, N, N, generator=g, dtype=dtype)
    if transposed:  # column-major, as the orthogonal initialiser's W comes out of QR
        w = w.transpose(1, 2).contiguous().transpose(1, 2)
    b = torch.randn(K, N, generator=g, dtype=dtype).requires_grad_()
    return xs, h0, w_in, w.requires_grad_(), b


def grads(outs, xs, h0, w_in, w, b, seed: int):
    """∂ of Σ ⟨g_k, out_k⟩ for fixed random g_k, in the order (h0, V, W, b, x_0 … x_{K−1}); None for
    an input the outputs do not reach."""
    g = torch.Generator().manual_seed(seed)
    gs = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in outs]
    return torch.autograd.grad(outs, (h0, w_in, w, b, *xs), gs, allow_unused=True)


def poisoned() -> Workspace:
    """A workspace whose buffers start as NaN: an element the kernel leaves unwritten shows."""
    ws = Workspace()
    for name in ("xp", "hs", "grad_hs"):
        ws.buffers[name] = torch.full((1 << 16,), float("nan"), dtype=torch.float32)
    return ws


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("nonlinearity", ["elu", "relu", "tanh"])
@pytest.mark.parametrize("N", [4, 10, 16, 40])
def test_float32_states_and_gradients_match_the_scans(N, nonlinearity, last):
    """Against `FusedElmanScan` (states, ∂h0, ∂V, ∂W, ∂b) and each member's `ElmanScan` (∂x), float32.
    N = 10 is no power of two: the kernel pads to 16 and masks. N = 40: the forward's three column
    blocks of 16, the last one half masked."""
    K, T, B, d = 3, 5, 2, 3
    args = bundle(N, K, T, B, N, d, torch.float32)
    xs, h0, w_in, w, b = args
    ours = persistent.persistent_elman_rnn(xs, h0, w_in, w, b, nonlinearity, last, poisoned())
    ref = fused_elman_rnn(xs, h0, w_in, w, b, nonlinearity, last, Workspace())
    # two float32 recurrences summed in other orders (the interpreter's matmul is numpy's, whose kernels
    # differ between CPUs): a few units in the last place a step, 2.7e-7 at worst on the EPYC
    for o, r in zip(ours, ref, strict=True):
        assert torch.isfinite(o).all()
        assert rel(o, r) < 8 * T * torch.finfo(torch.float32).eps  # 4.8e-6
    g_ours = grads(ours, *args, seed=1)
    g_ref = grads(ref, *args, seed=1)[:4]  # FusedElmanScan gives its inputs x no gradient
    solo = [ElmanScan.apply(x, w_in[k], b[k], h0[k], w[k], nonlinearity) for k, x in enumerate(xs)]
    g_solo = grads([s[-1] if last else s for s in solo], *args, seed=1)[4:]
    for name, o, r in zip(
        ["h0", "V", "W", "b"] + [f"x{k}" for k in range(K)], g_ours, [*g_ref, *g_solo], strict=True
    ):
        assert torch.isfinite(o).all(), name
        assert rel(o, r) < 1e-5, (name, rel(o, r))


@pytest.mark.parametrize(
    ("nonlinearity", "last", "B", "N", "transposed"),
    [
        ("elu", False, 2, 16, False),
        ("tanh", True, 3, 10, True),
        ("relu", False, 20, 12, False),
        ("elu", True, 3, 48, True),
        ("relu", False, 2, 130, False),
    ],
)
def test_float64_matches_an_unrolled_recurrence(nonlinearity, last, B, N, transposed):
    """Against plain autograd through h_t = f(x_t Vᵀ + b + h_{t−1} Wᵀ), float64: a reference that shares
    no code with either scan. B = 20 is two batch slices of 16 (∂W summed over slices); a transposed W
    is read through its strides. N = 48: three full column blocks of 16 (Wᵀ's tiles read through a
    transposed W's strides); N = 130: more than MAX_BLOCKS blocks of 16, so five of 32, the last with
    2 columns."""
    K, T, d = 3, 5, 2
    args = bundle(7, K, T, B, N, d, torch.float64, transposed)
    xs, h0, w_in, w, b = args
    ours = persistent.persistent_elman_rnn(xs, h0, w_in, w, b, nonlinearity, last)
    ref = []
    for k, x in enumerate(xs):
        h, states = h0[k], []
        for t in range(T):
            h = ACT[nonlinearity](x[t] @ w_in[k].T + b[k] + h @ w[k].T)
            states.append(h)
        ref.append(h if last else torch.stack(states))
    for o, r in zip(ours, ref, strict=True):
        assert rel(o, r) < 1e-13
    for o, r in zip(grads(ours, *args, seed=2), grads(ref, *args, seed=2), strict=True):
        assert rel(o, r) < 1e-12


@pytest.mark.parametrize("nonlinearity", ["elu", "relu", "tanh"])
def test_a_nan_stays_a_nan_as_in_the_scan(nonlinearity):
    """A diverged member's NaN must show in its states and gradients as the scan shows it, not turn
    into 0 in f (a GPU's max and min return the number beside a NaN unless told otherwise): the loop
    sees a NaN loss and stops the member as it would without the kernel."""
    K, T, B, N, d = 2, 4, 2, 10, 3
    xs, h0, w_in, w, b = bundle(3, K, T, B, N, d, torch.float32)
    with torch.no_grad():
        w[1, 2, 3] = float("nan")  # member 1 only
    ours = persistent.persistent_elman_rnn(xs, h0, w_in, w, b, nonlinearity, False)
    ref = fused_elman_rnn(xs, h0, w_in, w, b, nonlinearity, False, Workspace())
    for o, r in zip(ours, ref, strict=True):
        assert torch.equal(o.isnan(), r.isnan())
    assert ours[1].isnan().any() and not ours[0].isnan().any()
    for o, r in zip(
        grads(ours, xs, h0, w_in, w, b, seed=4)[:4], grads(ref, xs, h0, w_in, w, b, seed=4)[:4], strict=True
    ):
        assert torch.equal(o.isnan(), r.isnan())


@pytest.mark.parametrize("N", [12, 40])
def test_a_member_equals_its_run_alone_bit_for_bit(N):
    """A member's program runs the same operations whatever K is: its states and gradients through a
    bundle of 3 are those of a bundle of 1 (here in the interpreter's numpy; on a GPU, the benchmark).
    N = 40: three column blocks."""
    xs, h0, w_in, w, b = bundle(3, 3, 6, 16, N, 2, torch.float32)
    outs = persistent.persistent_elman_rnn(xs, h0, w_in, w, b, "elu")
    g = grads(outs, xs, h0, w_in, w, b, seed=4)
    for k in range(3):
        one = [t[k : k + 1].detach().requires_grad_() for t in (h0, w_in, w, b)]
        alone = persistent.persistent_elman_rnn([xs[k]], one[0], one[1], one[2], one[3], "elu")
        assert torch.equal(alone[0], outs[k])
        g_out = torch.Generator().manual_seed(4)
        g_k = [torch.randn(o.shape, generator=g_out, dtype=o.dtype) for o in outs][k]  # `grads`' k-th
        g_alone = torch.autograd.grad(alone, (*one, xs[k]), [g_k])
        for full, part in zip(g[:4], g_alone, strict=False):
            assert torch.equal(full[k : k + 1], part)
        assert torch.equal(g[4 + k], g_alone[4])


def test_column_blocks_cover_the_hidden_units():
    """The forward's blocks: width 16 (a tl.dot's least) while at most MAX_BLOCKS blocks cover N, then
    doubled; Orhan's N = 100 is 7 blocks (112 columns, where a power of two computed 128)."""
    assert persistent.MAX_BLOCKS == 8
    cases = {1: (16, 1), 16: (16, 1), 25: (16, 2), 40: (16, 3), 100: (16, 7), 128: (16, 8), 130: (32, 5)}
    for n, blocks in {**cases, 256: (32, 8), 1000: (128, 8)}.items():
        assert persistent._column_blocks(n) == blocks, n


def test_cpu_tensors_without_the_interpreter_are_refused(monkeypatch):
    monkeypatch.setattr(persistent, "INTERPRETED", False)
    xs, h0, w_in, w, b = bundle(5, 1, 2, 2, 4, 1, torch.float32)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        persistent.persistent_elman_rnn(xs, h0, w_in, w, b, "relu")


def test_a_launch_past_the_cards_shared_memory_names_the_limit_and_the_fix(monkeypatch):
    """The interpreter has no shared memory to run out of, so the backward's launch raises what Triton
    raises on a card that cannot hold its program (an RTX 40xx at N = 128: 112 KB of 99 KB): the
    trial's reason names the backend, the kernel, both sizes and the fix."""
    from triton.runtime.errors import OutOfResources

    class TooBig:
        def __getitem__(self, grid):
            def launch(*args, **meta):
                raise OutOfResources(114688, 101376, "shared memory")

            return launch

    monkeypatch.setattr(persistent, "_elman_backward", TooBig())
    xs, h0, w_in, w, b = bundle(5, 1, 2, 2, 4, 1, torch.float32)
    states = persistent.persistent_elman_rnn(xs, h0, w_in, w, b, "relu")  # the forward fits
    with pytest.raises(RuntimeError) as refused:
        states[0].sum().backward()
    assert str(refused.value) == (
        "backend 'persistent': the Elman backward kernel at hidden 4 needs 114688 bytes of shared memory "
        "a program, and this GPU has 101376 bytes: use backend 'auto' (the same recurrence, cuBLAS), or a "
        "smaller hidden size"
    )


def test_an_unknown_nonlinearity_names_the_valid_ones():
    xs, h0, w_in, w, b = bundle(5, 1, 2, 2, 4, 1, torch.float32)
    with pytest.raises(ValueError, match="elu, relu, tanh"):
        persistent.persistent_elman_rnn(xs, h0, w_in, w, b, "sigmoid")


def test_importing_the_trainers_imports_no_triton():
    """Nothing changes for CPU users: Triton is imported only with the persistent kernel."""
    code = (
        "import sys, trainers, trainers.fused, trainers.cli, trainers.kernels; print('triton' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_device_benchmarks_budget_predicts_a_gpu_bundle_flat_then_in_proportion():
    """A row is skipped when its predicted cost does not fit what is left. In proportion to K, K = 1's
    row (Triton's compiles included) predicted K = 64 at 64 times it, so a card would have skipped
    every large bundle of the whole-step section, the issue's target; on a GPU the prediction is flat
    up to FLAT_UP_TO members and in proportion beyond (docs/gpu.md: K = 64 → 594 costs 3.2-5.1 times)."""
    from benchmarks.persistent_kernel import FLAT_UP_TO, predicted_cost

    gpu, cpu = FLAT_UP_TO["cuda"], FLAT_UP_TO["cpu"]
    assert predicted_cost((1, 10.0), 64, gpu) == 10.0  # launch-bound: 64 members cost what one does
    assert predicted_cost((64, 4.0), 594, gpu) == pytest.approx(4.0 * 594 / 128)
    assert predicted_cost((462, 9.0), 594, gpu) == pytest.approx(9.0 * 594 / 462)
    assert predicted_cost((594, 9.0), 64, gpu) == 9.0  # never less than the last
    assert predicted_cost((1, 2.0), 3, cpu) == 6.0  # on the CPU in proportion from one member


def test_the_device_benchmark_runs_on_the_cpu(tmp_path):
    """`benchmarks/persistent_kernel.py --device cpu --quick`: every bundle timed, its members equal to
    their K = 1 runs, its deviation from the scan small, SRNN's shift kernel equal to its scan, the
    bundle's whole step timed with each backend, and the tables written (the lent GPU's command)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "persistent_kernel.py"), "--device", "cpu", "--quick", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "persistent_kernel.json").read_text())["rows"]
    assert rows and all("error" not in r and "skipped" not in r for r in rows), rows
    assert all(r["bit_equal"] and r["kernel_ms"] > 0 and r["scan_ms"] > 0 for r in rows)
    devs = [r["dev_steps"] for r in rows if "dev_steps" in r]
    assert devs and max(devs) < 1e-5
    assert "| tiny-elu-all | 3 |" in (tmp_path / "persistent_kernel.md").read_text()
    # SRNN's shift recurrence: the kernel's numbers are the scan's, a member's its K = 1 run's
    shift = json.loads((tmp_path / "persistent_kernel.json").read_text())["shift"]
    assert [(r["shape"], r["K"]) for r in shift] == [
        (s, k) for s in ("tiny-shift-last", "tiny-shift-all") for k in (1, 3)
    ]
    assert all(r["equal_scan"] and r["bit_equal"] and r["kernel_ms"] > 0 for r in shift), shift
    assert "| tiny-shift-all | 3 |" in (tmp_path / "persistent_kernel.md").read_text()
    # the bundle's whole training step (`Bundle`, what train_fused steps), backend=persistent against scan
    steps = json.loads((tmp_path / "persistent_kernel.json").read_text())["steps"]
    assert [(r["shape"], r["K"]) for r in steps] == [
        (s, k) for s in ("tiny-addition", "tiny-copy", "tiny-srnn-copy") for k in (1, 3)
    ]
    assert all("error" not in r and "skipped" not in r and r["persistent_step_ms"] > 0 for r in steps), steps
    assert all(r["loss_dev"] < 1e-5 for r in steps)
    assert all(r["loss_dev"] == 0 for r in steps if r["shape"] == "tiny-srnn-copy")
    assert all(r["member0_equal_k1"] for r in steps if r["K"] == 3)
