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
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from trainers.cells import get_cell, list_cells
from trainers.model import SequenceModel
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
    params = [p for p in model.parameters() if p.requires_grad]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cells", nargs="+", choices=list_cells(), help="only these cells (default: every one)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
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
    for name in args.cells or list_cells():
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


if __name__ == "__main__":
    main()
