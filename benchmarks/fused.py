"""Fused trial bundles against one trial per process: trial-timesteps per second, side by side.

Every candidate runs the real trainers — `trainers.train` for one trial per process and
`trainers.fused.train_fused` for a bundle of K — on the same grid: members differ in learning
rate, initialiser (chain / orthogonal / identity / fbchain) and seed (so each has its own data
stream), as a paper grid's points do. One thread per process; evaluation on a tiny validation set
once at the end, so the figures are training throughput. Each trial also pays its set-up (data,
model) once; a real trial's thousands of steps dwarf it, and the default 30 steps keep it a small
share.

- baseline: two processes on the two cores, each training its trials one after another;
- fused ×1: one process training a bundle of K (the other core idle);
- fused ×2: two processes, each training a bundle of K (the machine's whole throughput).

Each bundle member is bit for bit its solo run. Candidates run interleaved for `--rounds` rounds;
the table shows medians.

Shapes: psMNIST-like (the psmnist task on synthetic MNIST files: N=25, B=16, T=784, d=1, elu) and
copy-like (copy-500: N=100, B=16, T=500, d=10, elu). Figures are wall-clock throughput; the
`per CPU-s` column divides by the processes' CPU time instead, which is steadier on a shared machine.

    python benchmarks/fused.py [--steps 30] [--ks 16,32] [--rounds 3] [--shapes psmnist,copy]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

INITS = (
    ("chain", 1.0),
    ("orthogonal", 1.0),
    ("identity", 1.0),
    ("fbchain", 0.1),
)  # (init, scale); β=1 explodes


def synthetic_mnist(root: Path, n: int = 256) -> Path:
    """Random images in MNIST's IDX layout under root/MNIST/raw (the psmnist task's real loader reads them)."""
    from trainers.tasks.mnist_files import RAW_FILES, raw_dir, write_idx

    gen = torch.Generator().manual_seed(0)
    out = raw_dir(root)
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        labels = (torch.arange(n) % 10).to(torch.uint8)
        write_idx(
            out / RAW_FILES[f"{split}_images"],
            torch.randint(0, 256, (n, 28, 28), generator=gen, dtype=torch.uint8),
        )
        write_idx(out / RAW_FILES[f"{split}_labels"], labels)
    return root


def shapes(mnist_root: Path) -> dict[str, tuple[dict[str, Any], int]]:
    """name: (base config, T)."""
    return {
        "psmnist": (
            {
                "task": "psmnist",
                "hidden": 25,
                "task_params": {"root": str(mnist_root), "n_train": 256, "n_val": 16},
            },
            784,
        ),
        "copy": (
            {"task": "copy", "hidden": 100, "task_params": {"seq_len": 500, "n_train": 256, "n_val": 16}},
            500,
        ),
    }


def grid(base: dict[str, Any], n: int, steps: int, offset: int = 0) -> list[dict[str, Any]]:
    """n grid points: learning rate, initialiser and seed vary."""
    return [
        {
            **base,
            "seed": offset + i + 1,
            "lr": 1e-4 * (1 + (offset + i) % 7),
            "cell_params": dict(zip(("init", "scale"), INITS[(offset + i) % len(INITS)], strict=True)),
            "steps": steps,
            "eval_every": steps,
            "early_stop_loss": None,
            "batch_size": 16,
            "threads": 1,
            "device": "cpu",
        }
        for i in range(n)
    ]


def _worker(kind: str, configs: list[dict[str, Any]], barrier: Any, queue: Any) -> None:
    from trainers import train
    from trainers.fused import train_fused

    def run(cfgs: list[dict[str, Any]]) -> list[Any]:
        return train_fused(cfgs) if kind == "fused" else [train(c) for c in cfgs]

    torch.set_num_threads(1)
    run([{**c, "steps": 1, "eval_every": 1} for c in configs[:2]])  # one-time costs (MKL, data files)
    barrier.wait()
    wall, cpu = time.perf_counter(), time.process_time()
    results = run(configs)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    # a trial that failed at its last step did all of its work (a default config diverging at T=500):
    # only one that left before its budget would make the throughput a lie
    failed = [
        r.reason for r, c in zip(results, configs, strict=True) if r.status != "done" and r.steps < c["steps"]
    ]
    queue.put(f"{kind}: a trial stopped early: {failed[0]}" if failed else (wall, cpu))


def measure(kind: str, per_process: list[list[dict[str, Any]]], T: int) -> tuple[float, float]:
    """(trial-timesteps per wall second, per CPU second) of processes running concurrently."""
    ctx = mp.get_context("spawn")  # a fresh interpreter: no thread pools inherited through fork
    barrier, queue = ctx.Barrier(len(per_process)), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(kind, cfgs, barrier, queue)) for cfgs in per_process]
    for p in procs:
        p.start()
    times = [queue.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join()
    errors = [t for t in times if isinstance(t, str)]
    if errors:
        raise RuntimeError(errors[0])
    work = sum(len(cfgs) * cfgs[0]["steps"] * T for cfgs in per_process)
    return work / max(w for w, _ in times), work / sum(c for _, c in times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30, help="training steps per trial")
    ap.add_argument("--ks", default="16,32", help="bundle sizes")
    ap.add_argument("--solo-trials", type=int, default=2, help="trials per baseline process")
    ap.add_argument("--shapes", default="psmnist,copy")
    ap.add_argument("--rounds", type=int, default=3, help="candidates interleaved, median of the rounds")
    ap.add_argument("--no-pair", action="store_true", help="skip fused ×2 (two bundles at once)")
    args = ap.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    root = synthetic_mnist(Path(tempfile.mkdtemp(prefix="memsweep-fused-bench-")))
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, 1 thread per process, {args.steps} steps per trial"
    )
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print(
        f"{'shape':<10}{'candidate':<28}{'trial-timesteps/s':>19}{'× baseline':>12}{'per CPU-s':>12}{'×':>8}"
    )
    for name in args.shapes.split(","):
        base, T = shapes(root)[name]
        n = args.solo_trials
        candidates: dict[str, tuple[str, list[list[dict[str, Any]]]]] = {
            "baseline: 1 trial/process": ("solo", [grid(base, n, args.steps), grid(base, n, args.steps, n)])
        }
        for k in ks:
            candidates[f"fused K={k} ×1"] = ("fused", [grid(base, k, args.steps)])
            if not args.no_pair:
                candidates[f"fused K={k} ×2"] = (
                    "fused",
                    [grid(base, k, args.steps), grid(base, k, args.steps, k)],
                )
        runs: dict[str, list[tuple[float, float]]] = {label: [] for label in candidates}
        for _ in range(args.rounds):  # interleaved, so the shared machine's load hits all alike
            for label, (kind, per_process) in candidates.items():
                runs[label].append(measure(kind, per_process, T))
        solo = tuple(statistics.median(r[i] for r in runs["baseline: 1 trial/process"]) for i in (0, 1))
        for label, rs in runs.items():
            wall, cpu = (statistics.median(r[i] for r in rs) for i in (0, 1))
            print(
                f"{name:<10}{label:<28}{wall:>19,.0f}{wall / solo[0]:>11.2f}×{cpu:>12,.0f}{cpu / solo[1]:>7.2f}×"
            )
        print()
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
