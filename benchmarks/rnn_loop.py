"""ms per training iteration: memsweep's `rnn` cell against torch's native `nn.RNN(relu)`, side by side.

Each iteration is a whole training step — forward through the recurrence and the readout, the task
loss, backward, global-norm clip 10, RMSprop — on the same shapes, measured in one run with the
candidates interleaved (so machine noise hits them alike). Shapes: copy-500 (N=100, B=16, T=500,
d=10, 9 outputs at every step) and psMNIST (N=25, B=16, T=784, d=1, 10 outputs at the last step).

    python benchmarks/rnn_loop.py [--reps 20] [--threads 1]    # MEMSWEEP_NUMERICS=native: the other mode
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from trainers.cells.rnn import RNNCell, RNNConfig
from trainers.model import SequenceModel
from trainers.numerics import default_mode
from trainers.runtime import configure_process

# label: (hidden N, steps T, input d, outputs, loss on the last step only)
SHAPES = {
    "copy-500   (N=100, T=500)": (100, 500, 10, 9, False),
    "psMNIST    (N=25,  T=784)": (25, 784, 1, 10, True),
}


class NativeModel(nn.Module):
    """torch's nn.RNN(relu) + a linear readout: the reference."""

    def __init__(self, d: int, n: int, out: int, last: bool) -> None:
        super().__init__()
        self.rnn = nn.RNN(d, n, nonlinearity="relu")
        self.readout = nn.Linear(n, out)
        self.last = last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hs, _ = self.rnn(x)
        return self.readout(hs[-1] if self.last else hs)


def step_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor, last: bool) -> Callable[[], None]:
    params = list(model.parameters())
    opt = torch.optim.RMSprop(params, lr=1e-5, alpha=0.9, eps=1e-7)

    def step() -> None:
        out = model(x)
        loss = F.cross_entropy(out if last else out.reshape(-1, out.shape[-1]), y if last else y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 10.0)
        opt.step()

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    mode = default_mode()  # MEMSWEEP_NUMERICS, else portable: set before MKL computes anything
    configure_process(torch.device("cpu"), args.threads, mode)  # as the trainers set a CPU process up
    print(
        f"torch {torch.__version__}, CPU, {args.threads} thread(s), numerics {mode} (torch's own kernels too), "
        f"median of {args.reps} iterations, B=16\n"
    )
    print(f"{'shape':<27}{'candidate':<34}{'ms/iter':>9}{'× native':>10}")
    for label, (n, T, d, out, last) in SHAPES.items():
        cands: dict[str, Callable[[], None]] = {}
        g = torch.Generator().manual_seed(0)
        x = torch.rand(T, 16, d, generator=g)
        y = torch.randint(0, out, (16,) if last else (T, 16), generator=g)
        cands["torch nn.RNN(relu)"] = step_fn(NativeModel(d, n, out, last), x, y, last)
        for nl, backend in (("relu", "auto"), ("relu", "native"), ("elu", "auto")):
            cell = RNNCell(RNNConfig(init="chain", nonlinearity=nl, backend=backend), d, n, g)  # type: ignore[arg-type]
            model = SequenceModel(cell, out, "last" if last else "sequence", g)
            kernel = "scan" if backend == "auto" else backend
            cands[f"memsweep rnn {nl} ({kernel})"] = step_fn(model, x, y, last)
        times: dict[str, list[float]] = {k: [] for k in cands}
        for fn in cands.values():  # warm-up
            fn()
            fn()
        for _ in range(args.reps):
            for name, fn in cands.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(1000 * (time.perf_counter() - t0))
        ref = statistics.median(times["torch nn.RNN(relu)"])
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"{label:<27}{name:<34}{med:>9.1f}{med / ref:>9.2f}×")
        print()


if __name__ == "__main__":
    main()
