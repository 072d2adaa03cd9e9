"""ms per training iteration for every registered cell, beside torch's native nn.LSTM, nn.GRU, nn.RNN(relu).

Each iteration is a whole training step as `trainers.loop` runs it — forward through the cell and a
linear readout at every step, cross-entropy, backward, global-norm clip 10, RMSprop, the cell's
`after_step` hook — on a copy-like shape: N=100, B=16, T=500, input d=10, 9 outputs at every step.
Every registered cell (`trainers.cells.list_cells()`) is built from its Config's defaults, so a cell
registered later is measured without editing this file; a cell that cannot be built that way is
skipped with the reason. The candidates are timed interleaved, one iteration each per round, so
machine noise hits them alike; the figures are the median (and quartiles) over rounds, and each
ratio is the median over rounds of the ratio within a round (robust when the machine's load moves).

    python benchmarks/cells.py [--reps 10] [--threads 1] [--cells nru janet gru]

`--cells` times only those registered cells (beside the three torch references, always timed).

`--fused` then measures each cell that fuses (`trainers.fused.FUSED_CELLS`) as a grid runs it:
a bundle of K=32 members in each of two processes against one trial per process ×2 (the real
`train_fused` and `train`, members differing in learning rate and seed, `benchmarks/fused.py`'s
harness), at the copy-like shape above and at N=32; the two run side by side in every round and the
ratio is the median over rounds of the ratio within a round (min–max beside it).

    python benchmarks/cells.py --fused [--fused-steps 10] [--fused-rounds 3] [--cells srnn sgornn]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainers.cells import get_cell, list_cells
from trainers.config import resolve
from trainers.model import SequenceModel
from trainers.numerics import default_mode
from trainers.optim import make_optimizer
from trainers.runtime import configure_process
from trainers.tasks import get_task

N, B, T, D, OUT = 100, 16, 500, 10, 9


class NativeModel(nn.Module):
    """torch's nn.LSTM, nn.GRU or nn.RNN(relu) + a linear readout at every step: the references."""

    def __init__(self, rnn: nn.Module) -> None:
        super().__init__()
        self.rnn = rnn
        self.readout = nn.Linear(N, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hs, _ = self.rnn(x)
        out: torch.Tensor = self.readout(hs)
        return out


def step_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    """One training iteration of `model`: a memsweep model steps with a trial's optimiser (its numerics
    mode's: `trainers.optim.make_optimizer`), torch's references with torch's own RMSprop."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt: Any
    if isinstance(model, SequenceModel):
        opt = make_optimizer(resolve({"lr": 1e-5}).config, params)  # RMSprop, ρ 0.9, ε 1e-7
    else:
        opt = torch.optim.RMSprop(params, lr=1e-5, alpha=0.9, eps=1e-7)
    after_step = model.cell.after_step if isinstance(model, SequenceModel) else (lambda: None)

    def step() -> None:
        out = model(x)  # [T, B, OUT]
        loss = F.cross_entropy(out.reshape(-1, OUT), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(params, 10.0)
        opt.step()
        after_step()

    return step


def python_loops(step: Callable[[], None]) -> Callable[[], None]:
    """`step` with the NRU's step loops in Python (`trainers.kernels_nru.PythonSteps`)."""

    def run() -> None:
        os.environ["MEMSWEEP_NRU_STEPS"] = "python"
        try:
            step()
        finally:
            del os.environ["MEMSWEEP_NRU_STEPS"]

    return run


def fused_grid(cell: str, hidden: int, n: int, steps: int, offset: int = 0) -> list[dict[str, Any]]:
    """n trials of `cell` at the copy-like shape (hidden N): learning rate and seed vary."""
    return [
        {
            "task": "copy",
            "cell": cell,
            "hidden": hidden,
            "task_params": {"seq_len": T, "n_train": 256, "n_val": 16},
            "seed": offset + i + 1,
            "lr": 1e-4 * (1 + (offset + i) % 7),
            "steps": steps,
            "eval_every": steps,
            "early_stop_loss": None,
            "batch_size": B,
            "threads": 1,
            "device": "cpu",
        }
        for i in range(n)
    ]


def fused_figures(cells: list[str], steps: int, rounds: int, k: int = 32) -> None:
    """Bundle K ×2 against one trial per process ×2, per fused cell and hidden size, side by side."""
    from fused import measure  # benchmarks/fused.py (run as a script from the repo)

    print(f"\nfused bundles: K={k} ×2 against 1 trial/process ×2, {steps} steps per trial, {rounds} rounds")
    print(f"{'cell':<10}{'N':>5}{'solo ts/s':>12}{'fused ts/s':>12}{'× (median)':>12}{'min–max':>14}")
    for cell in cells:
        for hidden in (N, 32):
            ratios, solo, fused = [], [], []
            for _ in range(rounds):  # side by side: the machine's load hits both alike
                s_wall, _ = measure(
                    "solo", [fused_grid(cell, hidden, 2, steps), fused_grid(cell, hidden, 2, steps, 2)], T
                )
                f_wall, _ = measure(
                    "fused", [fused_grid(cell, hidden, k, steps), fused_grid(cell, hidden, k, steps, k)], T
                )
                ratios.append(f_wall / s_wall)
                solo.append(s_wall)
                fused.append(f_wall)
            print(
                f"{cell:<10}{hidden:>5}{statistics.median(solo):>12,.0f}{statistics.median(fused):>12,.0f}"
                f"{statistics.median(ratios):>11.2f}×{f'{min(ratios):.2f}–{max(ratios):.2f}':>14}",
                flush=True,
            )


def candidates(names: list[str]) -> tuple[dict[str, Callable[[], None]], dict[str, str]]:
    """(label → one training iteration, skipped cell → why): torch's three references, then each
    named registered cell at the copy-like shape (the NRU also with its Python loops)."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(T, B, D, generator=g)
    y = torch.randint(0, OUT, (T, B), generator=g)

    torch.manual_seed(0)  # the native modules draw from the global generator
    cands: dict[str, Callable[[], None]] = {
        "torch nn.LSTM": step_fn(NativeModel(nn.LSTM(D, N)), x, y),
        "torch nn.GRU": step_fn(NativeModel(nn.GRU(D, N)), x, y),
        "torch nn.RNN(relu)": step_fn(NativeModel(nn.RNN(D, N, nonlinearity="relu")), x, y),
    }
    skipped: dict[str, str] = {}
    nonlinearity = get_task("copy").default_nonlinearity
    for name in names:
        cls = get_cell(name)
        try:
            config = cls.resolve(cls.Config(), nonlinearity)
            cell = cls(config, D, N, g)  # type: ignore[call-arg]
            model = SequenceModel(cell, OUT, "sequence", g)
            step = step_fn(model, x, y)
            step()  # a cell that fails on this shape is skipped, not timed
        except Exception as exc:
            skipped[name] = f"{type(exc).__name__}: {exc}"
            continue
        cands[f"memsweep {name}"] = step
        if name == "rnn" and config.nonlinearity != "relu":  # torch's nn.RNN(relu), on the same sums
            relu = cls(cls.resolve(cls.Config(), "relu"), D, N, g)  # type: ignore[call-arg]
            cands["memsweep rnn (relu)"] = step_fn(SequenceModel(relu, OUT, "sequence", g), x, y)
        if name == "nru":  # its step loops compiled (what trials run) and in Python (the fallback)
            cands["memsweep nru, Python loops"] = python_loops(step)

    return cands, skipped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cells", nargs="+", choices=list_cells(), help="only these cells (default: every one)")
    ap.add_argument("--fused", action="store_true", help="also bundles of every fused cell (see above)")
    ap.add_argument("--fused-only", action="store_true", help="only the bundles, not the per-step table")
    ap.add_argument("--fused-steps", type=int, default=10, help="training steps per trial in --fused")
    ap.add_argument("--fused-rounds", type=int, default=3)
    args = ap.parse_args()
    if args.fused or args.fused_only:
        from trainers.fused import FUSED_CELLS

        selected = [c for c in (args.cells or list_cells()) if c in FUSED_CELLS]
        if args.fused_only:
            fused_figures(selected, args.fused_steps, args.fused_rounds)
            return
    configure_process(
        torch.device("cpu"), args.threads, default_mode()
    )  # as the trainers set a CPU process up
    cands, skipped = candidates(args.cells or list_cells())
    times: dict[str, list[float]] = {k: [] for k in cands}
    for fn in cands.values():  # warm-up
        fn()
    for _ in range(args.reps):
        for label, fn in cands.items():
            t0 = time.perf_counter()
            fn()
            times[label].append(1000 * (time.perf_counter() - t0))

    print(f"torch {torch.__version__}, CPU, {args.threads} thread(s), {args.reps} rounds")
    print(f"copy-like shape: N={N}, B={B}, T={T}, d={D}, {OUT} outputs at every step")
    print(
        "ms/iter: median and quartiles over rounds; × ref: median over rounds of the ratio within a round\n"
    )
    refs = ("LSTM", "GRU", "RNN(relu)")
    print(
        f"{'candidate':<28}{'ms/iter':>9}{'p25–p75':>15}"
        + "".join(f"{'× nn.' + r:>11}" for r in refs[:2])
        + f"{'× nn.RNN':>10}"
    )
    for label, ts in times.items():
        q1, med, q3 = statistics.quantiles(ts, n=4)
        ratios = [
            statistics.median(a / b for a, b in zip(ts, times[f"torch nn.{r}"], strict=True)) for r in refs
        ]
        print(f"{label:<28}{med:>9.1f}{f'{q1:.1f}–{q3:.1f}':>15}" + "".join(f"{x:>10.2f}×" for x in ratios))
    for name, reason in skipped.items():
        print(f"skipped {name}: {reason}")
    if args.fused:
        fused_figures(selected, args.fused_steps, args.fused_rounds)


if __name__ == "__main__":
    main()
