"""The persistent kernels (`trainers/kernels_persistent.py`, issue 37) against today's scans, both
captured as CUDA graphs: the Elman kernel against `trainers.kernels.FusedElmanScan` at Orhan & Pitkow's
three shapes, SRNN's shift kernel against `FusedShiftScan` at psMNIST's length.

THE DEVICE CALL (one command, a few minutes on an H100 or H200, Triton's compilation included; no
carry: the working tree is enough, and the lent image's torch 2.11 / Triton 3.6 run it):

    run(command="set -o pipefail; PYTHONUNBUFFERED=1 PYTHONPATH=. python3 benchmarks/persistent_kernel.py --out $OUT 2>&1 | tee $OUT/persistent_kernel.log",
        timeout_s=420)

Then read $OUT's persistent_kernel.md (the table), persistent_kernel.json (every number) and the log.
CPU smoke run, under Triton's interpreter (seconds; tests/trainers/test_persistent_kernel.py runs it):

    python benchmarks/persistent_kernel.py --device cpu --quick --out /tmp/persistent_kernel

What it measures, per shape (addition-750: T 750, N 100, d 2, relu, read at the last step; copy-500:
T 500, N 100, d 10, elu, read at every step; psMNIST: T 784, N 25, d 1, elu, last step; B = 16) and
bundle size K (1, 8, 64, 462, 594), on random members (W a random orthogonal matrix × 0.99, so that
750 steps neither vanish nor explode), the recurrence's step — forward, and backward from a fixed
random ∂L/∂h to ∂h0, ∂V, ∂W, ∂b, what the bundle's training step asks of it:

- `scan graphed`: today's `fused_elman_rnn` step, one CUDA graph, median ms of --reps replays;
- `kernel graphed`: `persistent_elman_rnn`'s step likewise (the per-member projection and ∂V, ∂b
  included, as `FusedElmanScan` runs them);
- `kernels alone`: its two Triton launches (forward, backward) alone, graphed;
- `bit-equal`: members 0, K/2 and K−1 of the bundle against their K = 1 runs through the kernel —
  states and every gradient compared with torch.equal (the kernel's promise: a member's program
  runs the same operations whatever K is);
- `dev 30 steps`: at K ≤ 64, 30 steps of plain SGD on both paths from the same start, the largest
  max|Δ| / max|ref| of W, V, b and the last step's states (the current tolerance is 1e-3);
- `peak MiB`: peak allocated memory of each graphed step's replay.

Then SRNN's shift recurrence (`persistent_shift_scan` against `FusedShiftScan`), with SHIFT_SHARE
(10 %) of the budget, at srnn-psMNIST (T 784, N 128 as every SRNN preset's hidden, B 16, read at the
last step; the repository has no SRNN psMNIST preset), K as above, on random drives: each path's step
(forward, and backward from a fixed random ∂L/∂h_T to ∂b) graphed, median ms; `equal to scan`: the
kernel's states and ∂b against the scan's (torch.equal: every operation is elementwise, so they should
be the same numbers); `bit-equal`: members 0, K/2, K−1 against their K = 1 runs; peak memory.

Then the bundle's whole training step, as `train_fused` steps it (`trainers.fused.Bundle`: each member's
forward, readout and loss, the backward, clip and RMSprop, after_step), one CUDA graph per bundle, with
backend=scan (today's graphed step) and backend=persistent, at the three shapes (rnn, chain W, one seed,
members differing in learning rate; psMNIST on synthetic images: a step's cost does not depend on the
pixels), and at srnn-psMNIST (SRNN, hidden 128, f_r 3 × 32 as the paper's pMNIST), K = 1, 64, 594
(--step-ks): median ms of --reps steps after the warm-ups and the capture, peak memory, the largest
relative difference of the two backends' losses over those steps (SRNN's: 0, the same numbers), and
member 0's losses against its K = 1 run (persistent, torch.equal). A step the graph cannot hold is a
row saying why (`GraphUnsupported`).

TF32 is off (torch's matmul and cuDNN flags), as training runs. The script keeps itself under
--budget-s (default 330 s on CUDA) and skips a bundle whose predicted cost (from the last one timed:
on a GPU flat up to FLAT_UP_TO members and in proportion beyond, on the CPU in proportion; a check only
one K runs left out) does not fit, saying so in the table. The whole-step section has STEP_SHARE (45 %)
of the budget and what the sections before it leave, shared by its four shapes. What it does not do:
the whole `train_fused` loop with its evaluations and bookkeeping (its step is timed; the loop's
overhead around it is the same for both backends: `benchmarks/gpu_check` measures it), registers /
spills (read them from the compile report: see docs/gpu.md), a sweep of num_warps or batch slices.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch


@dataclass(frozen=True)
class Shape:
    name: str
    T: int
    N: int
    d: int
    nonlinearity: str
    last: bool  # the task reads the last state only (addition, psMNIST) or every state (copy)


SHAPES = (
    Shape("addition-750", 750, 100, 2, "relu", True),
    Shape("copy-500", 500, 100, 10, "elu", False),
    Shape("psMNIST", 784, 25, 1, "elu", True),
)
QUICK_SHAPES = (
    Shape("tiny-relu-last", 6, 12, 2, "relu", True),
    Shape("tiny-elu-all", 5, 10, 3, "elu", False),
)
#: SRNN's shift recurrence (d and nonlinearity unused: the drives are random, the activation is ReLU)
SHIFT_SHAPES = (Shape("srnn-psMNIST", 784, 128, 0, "relu", True),)
QUICK_SHIFT_SHAPES = (
    Shape("tiny-shift-last", 6, 12, 0, "relu", True),
    Shape("tiny-shift-all", 5, 10, 0, "relu", False),
)
B = 16
DEV_LR, DEV_MAX_K = 1e-3, 64

Params = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # h0, V, W, b


def members(shape: Shape, K: int, device: torch.device, seed: int = 0) -> tuple[list[torch.Tensor], Params]:
    """xs (K of [T, B, d]) and the stacked h0 [K, B, N], V [K, N, d], W [K, N, N], b [K, N], random."""
    g = torch.Generator().manual_seed(seed)
    T, N, d = shape.T, shape.N, shape.d
    q, _ = torch.linalg.qr(torch.randn(K, N, N, generator=g))
    w = 0.99 * q  # column-major out of QR, as the orthogonal initialiser's W: read through its strides
    v = 0.9 / d**0.5 * torch.randn(K, N, d, generator=g)
    b = 0.1 * torch.randn(K, N, generator=g)
    h0 = torch.zeros(K, B, N)
    xs = [torch.randn(T, B, d, generator=g).to(device) for _ in range(K)]
    params = tuple(p.to(device).requires_grad_() for p in (h0, v, w, b))
    return xs, params  # type: ignore[return-value]


def out_grads(shape: Shape, K: int, device: torch.device, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    size = (B, shape.N) if shape.last else (shape.T, B, shape.N)
    return [torch.randn(size, generator=g).to(device) for _ in range(K)]


def step_fn(rnn: Callable[..., Sequence[torch.Tensor]], shape: Shape, xs: list[torch.Tensor], params: Params,
            gs: list[torch.Tensor], ws: Any) -> Callable[[], list[torch.Tensor]]:  # fmt: skip
    """The recurrence's forward and backward: [states…, ∂h0, ∂V, ∂W, ∂b]."""
    h0, v, w, b = params

    def step() -> list[torch.Tensor]:
        outs = rnn(xs, h0, v, w, b, shape.nonlinearity, shape.last, ws)
        grads = torch.autograd.grad(outs, params, gs)
        return [*outs, *grads]

    return step


def graphed(
    fn: Callable[[], list[torch.Tensor]], device: torch.device
) -> tuple[Callable[[], None], list[torch.Tensor]]:
    """fn captured as a CUDA graph (after 3 eager warm-ups on a side stream) and its static outputs;
    on the CPU, fn itself run eagerly."""
    if device.type != "cuda":
        box: list[torch.Tensor] = []

        def run() -> None:
            box[:] = fn()

        run()
        return run, box
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = fn()
    return graph.replay, outs


def timed(run: Callable[[], None], reps: int, device: torch.device) -> float:
    """Median ms of `reps` runs (CUDA events on a GPU, synchronised)."""
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            run()
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def peak_mib(run: Callable[[], None], device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(device)
    run()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated(device) / 2**20


def kernels_alone(shape: Shape, xs: list[torch.Tensor], params: Params, gs: list[torch.Tensor], pk: Any,
                  device: torch.device) -> Callable[[], list[torch.Tensor]]:  # fmt: skip
    """The two Triton launches alone, on buffers made once: forward into hs, backward into ∂a."""
    h0, w = params[0].detach(), params[2].detach()
    K, T, N = len(xs), shape.T, shape.N
    xp = torch.randn(K, T, B, N, device=device)
    hs = torch.empty(K, T + 1, B, N, device=device)
    ga = torch.empty_like(xp)
    g = torch.stack(gs).contiguous()

    def run() -> list[torch.Tensor]:
        pk.elman_forward(xp, h0, w, shape.nonlinearity, out=hs)
        return [hs, *pk.elman_backward(hs, w, g, shape.nonlinearity, shape.last, ga)]

    return run


def bit_equal(shape: Shape, K: int, outs: list[torch.Tensor], xs: list[torch.Tensor], params: Params,
              gs: list[torch.Tensor], pk: Any) -> bool:  # fmt: skip
    """Members 0, K/2, K−1 of the bundle's outputs against their K = 1 runs through the kernel."""
    states, grads = outs[:K], outs[K:]
    for k in sorted({0, K // 2, K - 1}):
        one = tuple(p.detach()[k : k + 1].requires_grad_() for p in params)
        solo = step_fn(pk.persistent_elman_rnn, shape, [xs[k]], one, [gs[k]], pk.Workspace())()  # type: ignore[arg-type]
        if not torch.equal(solo[0], states[k]):
            return False
        if not all(torch.equal(s, full[k : k + 1]) for s, full in zip(solo[1:], grads, strict=True)):
            return False
    return True


def deviation(shape: Shape, K: int, device: torch.device, pk: Any, kernels: Any, steps: int) -> float:
    """`steps` (30) SGD steps of the bundle on each path from the same start: the largest max|Δ| / max|ref| of
    W, V, b and the last states, the kernel against the scan."""
    finals = []
    for rnn in (kernels.fused_elman_rnn, pk.persistent_elman_rnn):
        xs, params = members(shape, K, device, seed=2)
        h0, v, w, b = params
        ws = kernels.Workspace()
        for step in range(steps):
            gs = out_grads(shape, K, device, seed=100 + step)
            outs = rnn(xs, h0, v, w, b, shape.nonlinearity, shape.last, ws)
            grads = torch.autograd.grad(outs, (v, w, b), gs)
            with torch.no_grad():
                for p, gr in zip((v, w, b), grads, strict=True):
                    p.sub_(DEV_LR * gr / (gr.norm() + 1e-12))  # a normalised step: finite at any scale
        finals.append([v.detach(), w.detach(), b.detach(), torch.stack([o.detach().clone() for o in outs])])
    return max(
        ((a - r).abs().max() / r.abs().max()).item() for a, r in zip(finals[1], finals[0], strict=True)
    )


def shift_step(scan: Callable[..., Sequence[torch.Tensor]], shape: Shape, bs: list[torch.Tensor],
               gs: list[torch.Tensor], ws: Any) -> Callable[[], list[torch.Tensor]]:  # fmt: skip
    """SRNN's shift recurrence forward and backward: [states…, ∂b_0 … ∂b_{K−1}]."""

    def step() -> list[torch.Tensor]:
        outs = scan(bs, shape.last, ws)
        return [*outs, *torch.autograd.grad(outs, bs, gs)]

    return step


def time_shift(shapes: Sequence[Shape], ks: list[int], reps: int, device: torch.device, pk: Any,
               deadline: float) -> list[dict[str, Any]]:  # fmt: skip
    """Per shape and K: the shift kernel's step against `FusedShiftScan`'s, both graphed; the kernel's
    numbers against the scan's and members 0, K/2, K−1 against their K = 1 runs (torch.equal)."""
    from trainers.cells.srnn import FusedShiftScan

    def fused(bs: list[torch.Tensor], last: bool, ws: Any) -> Sequence[torch.Tensor]:
        return FusedShiftScan.apply(last, ws, *bs)  # type: ignore[no-any-return]

    def measure(shape: Shape, K: int, row: dict[str, Any]) -> None:
        g = torch.Generator().manual_seed(K)
        bs = [torch.randn(shape.T, B, shape.N, generator=g).to(device).requires_grad_() for _ in range(K)]
        size = (B, shape.N) if shape.last else (shape.T, B, shape.N)
        gs = [torch.randn(size, generator=g).to(device) for _ in range(K)]
        results = {}
        for name, scan in (("scan", fused), ("kernel", pk.persistent_shift_scan)):
            run, outs = graphed(shift_step(scan, shape, bs, gs, pk.Workspace()), device)
            row[f"{name}_ms"] = timed(run, reps, device)
            row[f"{name}_peak_mib"] = peak_mib(run, device)
            results[name] = [o.clone() for o in outs]
            del run, outs
            free(device)
        row["equal_scan"] = all(
            torch.equal(a, b) for a, b in zip(results["kernel"], results["scan"], strict=True)
        )
        ours, ok = results["kernel"], True
        for k in sorted({0, K // 2, K - 1}):
            b = bs[k].detach().requires_grad_()
            solo = shift_step(pk.persistent_shift_scan, shape, [b], [gs[k]], pk.Workspace())()
            ok = ok and torch.equal(solo[0], ours[k]) and torch.equal(solo[1], ours[K + k])
        row["bit_equal"] = ok
        del results, ours, bs, gs

    start = time.perf_counter()
    return budgeted_rows(shapes, ks, start, (deadline - start) / len(shapes), device, measure)


#: the bundle's whole training step at each Orhan shape (`trainers.fused.Bundle`, what `train_fused` steps):
#: rnn with the task's nonlinearity, N = 100 (psMNIST 25), chain W; members differ in learning rate
STEP_TASKS = {
    "addition-750": {"task": "addition", "task_params": {"seq_len": 750}},
    "copy-500": {"task": "copy", "task_params": {"seq_len": 500}},
    "psMNIST": {"task": "psmnist", "hidden": 25, "task_params": {}},
    # SRNN at psMNIST's length: hidden 128 as every SRNN preset, f_r 3 × 32 as the paper's pMNIST (§4)
    "srnn-psMNIST": {
        "task": "psmnist",
        "hidden": 128,
        "task_params": {},
        "cell": "srnn",
        "cell_params": {"hyper_size": 32, "n_layers": 3},
    },
}
QUICK_STEP_TASKS = {
    "tiny-addition": {"task": "addition", "hidden": 12, "task_params": {"seq_len": 8}},
    "tiny-copy": {"task": "copy", "hidden": 10, "task_params": {"seq_len": 21}},
    "tiny-srnn-copy": {
        "task": "copy",
        "hidden": 10,
        "task_params": {"seq_len": 21},
        "cell": "srnn",
        "cell_params": {"hyper_size": 4},
    },
}
#: the step section's part of the budget, and the shift section's (the Elman recurrence's has the rest)
STEP_SHARE, SHIFT_SHARE = 0.45, 0.10


def step_configs(task: dict[str, Any], K: int, backend: str, device: torch.device, mnist: Path | None
                 ) -> list[dict[str, Any]]:  # fmt: skip
    """K members of one shape and seed (one batch stream), lr 1e-4 · 0.99^k: member 0 is the same in every K.
    The cell is rnn with a chain W unless the shape names another (and its fields)."""
    params = {**task["task_params"], "n_train": 256, "n_val": 16}
    if task["task"] == "psmnist":
        params["root"] = str(mnist)
    cell_params = {**task.get("cell_params", {"init": "chain"}), "backend": backend}
    base = {**task, "cell": task.get("cell", "rnn"), "seed": 1, "device": str(device), "steps": 10**6,
            "eval_every": 10**6, "early_stop_loss": None, "task_params": params, "cell_params": cell_params}  # fmt: skip
    return [{**base, "lr": 1e-4 * 0.99**k} for k in range(K)]


def bundle_steps(
    configs: list[dict[str, Any]], reps: int, device: torch.device
) -> tuple[float, torch.Tensor, bool]:
    """A bundle's training step (forward, losses, backward, clip and RMSprop, after_step) as `train_fused`
    runs it — one CUDA graph where the device can capture, else eager: (median ms of `reps` steps after
    the warm-ups and the capture, every step's losses [steps, K], graphed)."""
    from benchmarks.gpu_check.device import run_steps
    from trainers.fused import Bundle, GraphedStep, graphs_available
    from trainers.fused.graphs import GRAPH_WARMUP

    bundle = Bundle.of(configs)
    graphed = graphs_available(device) is None
    runner = GraphedStep(bundle, warmup=GRAPH_WARMUP).step if graphed else bundle.step
    warm = GRAPH_WARMUP + 1 if graphed else 1
    times, losses = run_steps(runner, warm + reps, device)
    return 1e3 * statistics.median(times[warm:]), losses, graphed


def time_steps(shapes: dict[str, dict[str, Any]], ks: list[int], reps: int, device: torch.device,
               mnist: Path | None, started: float, budget: float) -> list[dict[str, Any]]:  # fmt: skip
    """Per shape and K: the bundle's whole step with backend=scan (today's, graphed) and =persistent; the
    largest relative difference of their losses over the steps; member 0's losses against its K = 1 run
    (persistent, torch.equal: a member's numbers should not depend on its bundle)."""
    alone: dict[str, torch.Tensor] = {}  # per shape, member 0's losses at K = 1, persistent

    def measure(shape: StepShape, K: int, row: dict[str, Any]) -> None:
        losses = {}
        for backend in ("scan", "persistent"):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            ms, losses[backend], row["graphed"] = bundle_steps(
                step_configs(shape.task, K, backend, device, mnist), reps, device
            )
            row[f"{backend}_step_ms"] = ms
            if device.type == "cuda":
                row[f"{backend}_peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
            free(device)
        p, s = losses["persistent"], losses["scan"]
        row["loss_dev"] = ((p - s).abs() / s.abs()).max().item()
        if K == 1:
            alone.setdefault(shape.name, p[:, 0].clone())
        elif shape.name in alone:
            row["member0_equal_k1"] = torch.equal(p[:, 0], alone[shape.name])

    start = time.perf_counter()
    steps = [StepShape(name, task) for name, task in shapes.items()]
    return budgeted_rows(steps, ks, start, (started + budget - start) / len(steps), device, measure)


@dataclass(frozen=True)
class StepShape:
    """A whole-step measurement's task (`step_configs`'s spec), by its shape's name."""

    name: str
    task: dict[str, Any]


#: on a GPU a bundle's step costs about the same from one member to about this many and grows in
#: proportion beyond (docs/gpu.md's graphed steps, K = 64 → 594: ×3.9 addition-750, ×5.1 copy-500, ×3.2
#: psMNIST, where K would say ×9.3); on the CPU a bundle's cost is in proportion to K from one member
FLAT_UP_TO = {"cuda": 128, "cpu": 1}


def predicted_cost(last_cost: tuple[int, float], K: int, flat_up_to: int) -> float:
    """Seconds a bundle of K should take, from the last one timed (K, seconds): flat up to `flat_up_to`
    members, in proportion beyond, never less than the last."""
    last_k, seconds = last_cost
    return seconds * max(1.0, max(K, flat_up_to) / max(last_k, flat_up_to))


def over_budget(
    last_cost: tuple[int, float] | None, K: int, deadline: float, flat_up_to: int = 1
) -> str | None:
    """Why a bundle of K is skipped (its cost predicted from the last one timed), or None."""
    if last_cost is None:
        return None
    predicted = predicted_cost(last_cost, K, flat_up_to)
    left = deadline - time.perf_counter()
    return f"predicted {predicted:.0f} s, {left:.0f} s left" if predicted > left else None


class Named(Protocol):
    @property
    def name(self) -> str: ...


S = TypeVar("S", bound=Named)


def budgeted_rows(
    shapes: Sequence[S],
    ks: list[int],
    start: float,
    share: float,
    device: torch.device,
    measure: Callable[[S, int, dict[str, Any]], None],
) -> list[dict[str, Any]]:
    """One row per shape and K, each shape within its `share` of seconds from `start`: `measure` fills a
    row; a K whose cost (predicted from the last one) would not fit is skipped and says why, and a
    bundle's failure (out of memory, a compile error) is its row's error."""
    rows: list[dict[str, Any]] = []
    for i, shape in enumerate(shapes):
        deadline = start + share * (i + 1)
        last_cost: tuple[int, float] | None = None
        for K in ks:
            row: dict[str, Any] = {"shape": shape.name, "K": K}
            rows.append(row)
            skip = over_budget(last_cost, K, deadline, FLAT_UP_TO.get(device.type, 1))
            if skip:
                row["skipped"] = skip
                print(f"{shape.name} K={K}: skipped ({skip})")
                continue
            t0 = time.perf_counter()
            try:
                measure(shape, K, row)
            except Exception as e:  # one bundle's failure is a row
                row["error"] = f"{type(e).__name__}: {e}"[:300]
            row["wall_s"] = round(time.perf_counter() - t0, 2)
            # a check that only some K run (the deviation's SGD steps) is not a cost a larger K repeats
            last_cost = (K, row["wall_s"] - row.get("check_wall_s", 0.0))
            print(json.dumps(row), flush=True)
            free(device)
    return rows


def free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (Triton's interpreter)")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, K = 1, 3: a smoke run")
    ap.add_argument("--out", type=Path, required=True, help="folder for persistent_kernel.json and .md")
    ap.add_argument("--ks", help="bundle sizes, comma-separated (default 1,8,64,462,594; --quick 1,3)")
    ap.add_argument("--reps", type=int, help="timed replays per measurement (default 10; --quick 2)")
    ap.add_argument("--dev-steps", type=int, help="SGD steps of the deviation check (default 30; --quick 3)")
    ap.add_argument(
        "--step-ks", help="bundle sizes of the whole-step section (default 1,64,594; --quick 1,3)"
    )
    ap.add_argument("--budget-s", type=float, help="wall-clock budget (default 330 on CUDA, 120 on the CPU)")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":  # before Triton decorates the kernels (trainers.kernels_persistent)
        os.environ["TRITON_INTERPRET"] = "1"
    import triton

    from benchmarks.gpu_check.cli import set_numerics
    from trainers import kernels
    from trainers import kernels_persistent as pk

    set_numerics(device)  # one numerics mode a process, before its first computation (the bundles' configs')

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ks = [int(k) for k in (args.ks or ("1,3" if args.quick else "1,8,64,462,594")).split(",")]
    reps = args.reps or (2 if args.quick else 10)
    dev_steps = args.dev_steps or (3 if args.quick else 30)
    dev_k = max((k for k in ks if k <= DEV_MAX_K), default=None)
    budget = args.budget_s or (330.0 if device.type == "cuda" else 120.0)
    started = time.perf_counter()
    shapes = QUICK_SHAPES if args.quick else SHAPES
    share = budget * (1 - STEP_SHARE - SHIFT_SHARE) / len(shapes)
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(
        f"device {card}; torch {torch.__version__}, triton {triton.__version__}, interpreted {pk.INTERPRETED}"
    )

    def measure(shape: Shape, K: int, row: dict[str, Any]) -> None:
        xs, params = members(shape, K, device)
        gs = out_grads(shape, K, device)
        for name, rnn in (("scan", kernels.fused_elman_rnn), ("kernel", pk.persistent_elman_rnn)):
            run, outs = graphed(step_fn(rnn, shape, xs, params, gs, kernels.Workspace()), device)
            row[f"{name}_ms"] = timed(run, reps, device)
            row[f"{name}_peak_mib"] = peak_mib(run, device)
            if name == "kernel":
                row["bit_equal"] = bit_equal(shape, K, outs, xs, params, gs, pk)
            del run, outs
        run, _ = graphed(kernels_alone(shape, xs, params, gs, pk, device), device)
        row["kernels_ms"] = timed(run, reps, device)
        del run
        if dev_k == K:  # the largest K ≤ DEV_MAX_K
            t0 = time.perf_counter()
            row["dev_steps"] = deviation(shape, K, device, pk, kernels, dev_steps)
            row["check_wall_s"] = round(time.perf_counter() - t0, 2)

    rows = budgeted_rows(shapes, ks, started, share, device, measure)
    shift_rows = time_shift(QUICK_SHIFT_SHAPES if args.quick else SHIFT_SHAPES, ks, reps, device, pk,
                            started + budget * (1 - STEP_SHARE))  # fmt: skip
    mnist = None
    if not args.quick:  # psMNIST's shape with synthetic images: a step's cost does not depend on the pixels
        from benchmarks.gpu_check.mnist import mnist_root

        mnist = mnist_root(args.out / "work", True, None)[0]
    step_ks = [int(k) for k in (args.step_ks or ("1,3" if args.quick else "1,64,594")).split(",")]
    step_rows = time_steps(QUICK_STEP_TASKS if args.quick else STEP_TASKS, step_ks, reps, device, mnist,
                           started, budget)  # fmt: skip
    meta = {
        "date": dt.date.today().isoformat(), "device": card, "torch": torch.__version__,
        "triton": triton.__version__, "python": sys.version.split()[0], "interpreted": pk.INTERPRETED,
        "B": B, "reps": reps, "dev_steps": dev_steps, "budget_s": budget, "wall_s": round(time.perf_counter() - started, 1),
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "persistent_kernel.json").write_text(
        json.dumps({"meta": meta, "rows": rows, "shift": shift_rows, "steps": step_rows}, indent=1)
    )
    table = (
        markdown(meta, rows) + "\n" + shift_markdown(meta, shift_rows) + "\n" + step_markdown(meta, step_rows)
    )
    (args.out / "persistent_kernel.md").write_text(table)
    print(table)


def fmt(v: Any, spec: str = "{:.2f}") -> str:
    return "" if v is None else spec.format(v)


def markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    f = fmt
    lines = [
        f"# Persistent Elman kernel against the graphed scan ({meta['device']}, {meta['date']})",
        "",
        f"torch {meta['torch']}, Triton {meta['triton']}, B = {meta['B']}, median of {meta['reps']} replays; "
        f"{meta['wall_s']} s in all.",
        "",
        "| shape | K | scan graphed ms | kernel graphed ms | speed-up | kernels alone ms | kernel µs / member-step "
        f"| bit-equal to K=1 | dev {meta['dev_steps']} steps | scan peak MiB | kernel peak MiB | note |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for r in rows:
        s, k = r.get("scan_ms"), r.get("kernel_ms")
        lines.append(
            f"| {r['shape']} | {r['K']} | {f(s)} | {f(k)} | {f(s / k if s and k else None, '{:.1f}×')} "
            f"| {f(r.get('kernels_ms'))} | {f(1e3 * k / r['K'] if k else None, '{:.1f}')} "
            f"| {'' if 'bit_equal' not in r else ('yes' if r['bit_equal'] else '**NO**')} "
            f"| {f(r.get('dev_steps'), '{:.1e}')} | {f(r.get('scan_peak_mib'), '{:.0f}')} "
            f"| {f(r.get('kernel_peak_mib'), '{:.0f}')} | {r.get('skipped') or r.get('error') or ''} |"
        )
    return "\n".join(lines) + "\n"


def shift_markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [
        "## SRNN's shift recurrence: the persistent kernel against `FusedShiftScan`, both graphed",
        "",
        f"Forward, and backward to ∂b; median of {meta['reps']} replays.",
        "",
        "| shape | K | scan graphed ms | kernel graphed ms | speed-up | kernel µs / member-step "
        "| equal to scan | bit-equal to K=1 | scan peak MiB | kernel peak MiB | note |",
        "|---|---:|---:|---:|---:|---:|---|---|---:|---:|---|",
    ]
    yes = {None: "", True: "yes", False: "**NO**"}
    for r in rows:
        s, k = r.get("scan_ms"), r.get("kernel_ms")
        lines.append(
            f"| {r['shape']} | {r['K']} | {fmt(s)} | {fmt(k)} | {fmt(s / k if s and k else None, '{:.1f}×')} "
            f"| {fmt(1e3 * k / r['K'] if k else None, '{:.1f}')} | {yes[r.get('equal_scan')]} "
            f"| {yes[r.get('bit_equal')]} | {fmt(r.get('scan_peak_mib'), '{:.0f}')} "
            f"| {fmt(r.get('kernel_peak_mib'), '{:.0f}')} | {r.get('skipped') or r.get('error') or ''} |"
        )
    return "\n".join(lines) + "\n"


def step_markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [
        "## The bundle's whole training step, backend=persistent against backend=scan (`train_fused`'s step)",
        "",
        f"Forward, losses, backward, clip and RMSprop, after_step; median of {meta['reps']} steps after the "
        "warm-ups and the capture.",
        "",
        "| shape | K | graphed | scan step ms | persistent step ms | speed-up | persistent µs / member-step "
        "| loss max rel Δ | member 0 = its K=1 run | scan peak MiB | persistent peak MiB | note |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for r in rows:
        s, k, eq, g = (
            r.get("scan_step_ms"),
            r.get("persistent_step_ms"),
            r.get("member0_equal_k1"),
            r.get("graphed"),
        )
        lines.append(
            f"| {r['shape']} | {r['K']} | {'' if g is None else ('yes' if g else 'no')} | {fmt(s)} | {fmt(k)} "
            f"| {fmt(s / k if s and k else None, '{:.1f}×')} | {fmt(1e3 * k / r['K'] if k else None, '{:.1f}')} "
            f"| {fmt(r.get('loss_dev'), '{:.1e}')} | {'' if eq is None else ('yes' if eq else '**NO**')} "
            f"| {fmt(r.get('scan_peak_mib'), '{:.0f}')} | {fmt(r.get('persistent_peak_mib'), '{:.0f}')} "
            f"| {r.get('skipped') or r.get('error') or ''} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
