"""The cost of the portable numerics mode against the native one, per cell and for fused bundles.

A process computes with one numerics mode (trainers/numerics.py), so each round runs one child
process per mode, one after the other (their order alternates between rounds), on one thread:

- per cell: a whole training iteration at the copy-like shape (N=100, B=16, T=500, d=10, 9 outputs
  at every step; `benchmarks/cells.py`'s candidates: every registered cell, the rnn also with relu,
  and torch's nn.LSTM, nn.GRU, nn.RNN(relu)), median over `--reps` interleaved iterations;
- per bundle: `train_fused` of K members of `rnn` and `fastrnn` at that shape (members differ in
  learning rate and seed), ms per bundle step over `--steps` steps after a warm-up bundle. Portable
  bundles run one GEMM per member where MKL's COMPATIBLE branch rounds a batched GEMM otherwise.

The table gives each mode's median ms and the portable/native ratio: the median over rounds of the
ratio within a round, with its min–max (the machine's noise). A second table sets the default mode's
memsweep cells beside torch's own kernels as a torch user runs them (native), on the same shapes and
activation: what choosing the portable default costs (issue 33).

    python benchmarks/numerics.py [--rounds 3] [--reps 5] [--cells rnn lstm] [--k 8] [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODES = ("native", "portable")
BUNDLED = ("rnn", "fastrnn")
#: (memsweep's candidate, torch's on the same shapes and activation): what a portable trial costs
#: beside the kernel a torch user would run (issue 33 asks the default mode to stay within 1.5×)
AGAINST_TORCH = (
    ("memsweep rnn (relu)", "torch nn.RNN(relu)"),
    ("memsweep lstm", "torch nn.LSTM"),
    ("memsweep gru", "torch nn.GRU"),
)


def child(reps: int, cells: list[str] | None, k: int, steps: int) -> dict[str, float]:
    """In a process of one mode ($MEMSWEEP_NUMERICS): label → median ms."""
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from cells import candidates, fused_grid

    from trainers.cells import list_cells
    from trainers.fused import train_fused
    from trainers.numerics import current, default_mode
    from trainers.runtime import configure_process

    configure_process(torch.device("cpu"), 1, default_mode())
    cands, _ = candidates(cells or list_cells())
    times: dict[str, list[float]] = {label: [] for label in cands}
    for fn in cands.values():  # warm-up
        fn()
    for _ in range(reps):
        for label, fn in cands.items():
            t0 = time.perf_counter()
            fn()
            times[label].append(1000 * (time.perf_counter() - t0))
    out = {label: statistics.median(ts) for label, ts in times.items()}
    for cell in BUNDLED:
        if cells and cell not in cells:
            continue
        train_fused(fused_grid(cell, 100, k, 1))  # warm-up: data, workspace
        t0 = time.perf_counter()
        results = train_fused(fused_grid(cell, 100, k, steps, offset=k))
        wall = time.perf_counter() - t0
        if any(r.status != "done" and r.steps < steps for r in results):
            raise RuntimeError(f"a {cell} bundle member stopped early: {results[0].reason}")
        out[f"bundle of {k} {cell} (per step)"] = 1000 * wall / steps
    out["_mode"] = current()  # type: ignore[assignment]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5, help="timed iterations per cell per process")
    ap.add_argument("--cells", nargs="+", help="only these registered cells (default: every one)")
    ap.add_argument("--k", type=int, default=8, help="members per timed bundle")
    ap.add_argument("--steps", type=int, default=3, help="timed bundle steps")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.reps, args.cells, args.k, args.steps)))
        return

    import torch

    from trainers.numerics import cpu_model

    figures: dict[str, dict[str, list[float]]] = {m: {} for m in MODES}
    ratios: dict[str, list[float]] = {}
    against_torch: dict[str, list[float]] = {}  # memsweep's cell, portable ÷ torch's kernel, native
    for r in range(args.rounds):
        got: dict[str, dict[str, float]] = {}
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            cmd = [sys.executable, __file__, "--child", mode, "--reps", str(args.reps), "--k", str(args.k)]
            cmd += ["--steps", str(args.steps)] + (["--cells", *args.cells] if args.cells else [])
            env = {**os.environ, "MEMSWEEP_NUMERICS": mode}
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"the {mode} child failed:\n{done.stderr[-3000:]}")
            got[mode] = json.loads(done.stdout.strip().splitlines()[-1])
            if got[mode].pop("_mode") != mode:
                raise SystemExit(f"the {mode} child computed in another mode")
        for label in got["native"]:
            for mode in MODES:
                figures[mode].setdefault(label, []).append(got[mode][label])
            ratios.setdefault(label, []).append(got["portable"][label] / got["native"][label])
        for ours, theirs in AGAINST_TORCH:
            if ours in got["portable"]:
                pair = f"{ours} portable ÷ {theirs} native"
                against_torch.setdefault(pair, []).append(got["portable"][ours] / got["native"][theirs])
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    print(
        f"torch {torch.__version__}, {cpu_model()}, 1 thread, {args.rounds} rounds × {args.reps} iterations"
    )
    print("copy-like shape: N=100, B=16, T=500, d=10; ms per training iteration (bundles: per bundle step)")
    print("portable ÷ native: median over rounds of the ratio within a round (min–max)\n")
    print(f"{'candidate':<34}{'native ms':>11}{'portable ms':>13}{'portable ÷ native':>19}{'min–max':>14}")
    for label, rs in ratios.items():
        native, portable = (statistics.median(figures[m][label]) for m in MODES)
        print(
            f"{label:<34}{native:>11.1f}{portable:>13.1f}{statistics.median(rs):>18.2f}×"
            f"{f'{min(rs):.2f}–{max(rs):.2f}':>14}"
        )
    if against_torch:
        print("\nthe default (portable) mode against torch's own kernel in torch's default (native) setting,")
        print("same shapes and activation, side by side in each round: median ratio (min–max)\n")
        for pair, rs in against_torch.items():
            print(f"{pair:<56}{statistics.median(rs):>7.2f}×{f'{min(rs):.2f}–{max(rs):.2f}':>14}")


if __name__ == "__main__":
    main()
