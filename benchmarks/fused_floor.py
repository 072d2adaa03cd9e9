"""How far can fusing go? A fused step against the arithmetic no bit-exact implementation can skip.

One process, one thread, one shape (psMNIST-like by default: N=25, B=16, T=784, d=1, elu):

- solo: a real training step of `trainers.train`'s model and optimiser (min and median of --steps);
- fused: a real step of a K-member bundle (`FusedModel` and `FusedOptimizer`, as `train_fused` runs
  them), per member;
- floor: per member-timestep, what every member's recurrence must compute however it is
  scheduled if its numbers are to stay its solo run's — its GEMMs as `addmm` runs them (the forward
  and backward recurrence as one batched matmul over K, ∂W as one [N, T·B] × [T·B, N] product per
  member) and exp over its states — then the elementwise passes on [K, B, N] blocks the scan makes
  (f and f' written with clamp, add, subtract, multiply; the copy into the state store);
- a member's own work: what each member computes outside the recurrence, timed with its solo run's
  own ops on one solo model (`member_floor`): the readout, the loss and their gradients, and the
  input side (the projection or SRNN's MLP) and its gradients. A bundle runs these per member with
  the very ops of the solo run (they fix its rounding), so they belong to every member's floor.

The ceilings (solo time per timestep / floor) bound the speed-up a fused bundle could reach with no
dispatch, no Python and no memory stalls at all: the first from the recurrence alone, the last from
the recurrence plus the member's own work (the floor a fused step is compared with; the optimiser,
tens of µs, is left out, so the true bound is lower still).

`--cell` takes any fused cell (`trainers.fused.FUSED_CELLS`; default rnn, the members
differing in initialiser as well, other cells in learning rate and seed). The recurrence's floor
is: the three GEMMs for the cells with a recurrent matrix (exp only for elu), and for
urnn and crnn the float64 SVD that projects each member's W after each step (LAPACK's, one matrix
at a time: what keeps a member bit for bit its solo run), spread over the T timesteps; for srnn,
whose shift has no GEMM, the elementwise passes its scan makes (roll, add, relu forward; roll and a
masked add backward).

    python benchmarks/fused_floor.py [--k 32] [--steps 12] [--shape psmnist|copy] [--cell sgornn] [--hidden 32]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from fused import grid, shapes, synthetic_mnist  # benchmarks/fused.py (run as a script from the repo)

from trainers.config import resolve
from trainers.numerics import default_mode
from trainers.runtime import configure_process


def per_call(fn: Callable[[], Any], n: int) -> float:
    """Min over 3 runs of n calls: seconds per call."""
    fn()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n)
    return best


def step_times(step: Callable[[], Any], n: int) -> tuple[float, float]:
    """(min, median) seconds of n steps after two warm-up steps."""
    step()
    step()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return min(times), statistics.median(times)


def solo_step(configs: list[dict[str, Any]]) -> Callable[[], None]:
    """The first config's training step as `train` runs it (`trainers.loop.Solo`)."""
    import itertools

    from trainers.loop import Solo

    solo = Solo.of(configs[0])
    steps = itertools.count(1)

    def step() -> None:
        solo.step(next(steps))

    return step


def fused_step(configs: list[dict[str, Any]]) -> Callable[[], None]:
    from trainers.config import resolve
    from trainers.fused import FUSED_CELLS, FusedModel, FusedOptimizer
    from trainers.model import build_model
    from trainers.runtime import training_batches
    from trainers.schedule import Schedule

    resolved = [resolve(c) for c in configs]
    tasks = {r.config.seed: r.make_task() for r in resolved}  # one per seed, as train_fused shares them
    models = [build_model(r, tasks[r.config.seed]) for r in resolved]
    seeds = [r.config.seed for r in resolved]
    task = tasks[seeds[0]]
    model = FusedModel(models, FUSED_CELLS[resolved[0].config.cell], task.output)
    per_epoch = Schedule.of(resolved[0].config, task.train_size).steps_per_epoch
    optimizer = FusedOptimizer(
        resolved[0].config.optimizer, [r.config for r in resolved], model.params, per_epoch
    )
    streams = {seed: training_batches(t, 16, seed) for seed, t in tasks.items()}
    cpu = torch.device("cpu")

    def step() -> None:
        batch = {seed: tasks[seed].encode(next(stream), cpu) for seed, stream in streams.items()}
        outs = model.forward([batch[seed][0] for seed in seeds])
        losses = torch.stack(
            [tasks[seed].loss(o, batch[seed][1]) for seed, o in zip(seeds, outs, strict=True)]
        )
        for p in model.params:
            p.grad = None
        losses.sum().backward()  # type: ignore[no-untyped-call]
        optimizer.step(model.params)
        model.after_step()

    return step


def shift_floor(K: int, B: int, N: int) -> tuple[dict[str, float], dict[str, float]]:
    """srnn: seconds per member-timestep of its scan's passes on [K, B, N] blocks (no GEMM at all)."""
    g = torch.Generator().manual_seed(0)
    h, b, m, out = (torch.randn(K, B, N, generator=g) for _ in range(4))
    steps = 2000
    forward = per_call(lambda: torch.add(b, h.roll(1, -1), out=out).relu_(), steps) / K
    backward = per_call(lambda: out.addcmul_(m, h.roll(-1, -1)), steps) / K
    return {"forward: roll, add, relu": forward}, {"backward: roll, masked add": backward}


def floor(K: int, T: int, B: int, N: int) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds per member-timestep: (arithmetic every member must do, the scan's elementwise passes)."""
    g = torch.Generator().manual_seed(0)
    h, w, out, xp = (torch.randn(K, *s, generator=g) for s in ((B, N), (N, N), (B, N), (B, N)))
    wt = w.transpose(1, 2)
    a = torch.randn(K, B, N, generator=g).clamp_max_(0.0)
    s, v, store = torch.empty_like(a), torch.empty_like(a), torch.empty(K, 8, B, N)
    rows = torch.randn(T * B, N, generator=g)
    steps = 2000
    arithmetic = {
        "forward GEMM (baddbmm over K)": per_call(lambda: torch.baddbmm(xp, h, wt, out=out), steps) / K,
        "backward GEMM (bmm over K)": per_call(lambda: torch.bmm(h, w, out=out), steps) / K,
        "∂W GEMM ([N, T·B] × [T·B, N])": per_call(lambda: rows.t() @ rows, 20) / T,
        "exp": per_call(lambda: torch.exp(a, out=s), steps) / K,
    }
    passes = {  # f forward (clamp, −1, clamp, +), the copy into the store, f' backward (+1, clamp, ×)
        "f: clamp_max, sub, clamp_min, add": per_call(
            lambda: (torch.clamp_max(a, 0.0, out=s), s.sub_(1.0), torch.clamp_min(a, 0.0, out=v).add_(s)),
            steps,
        )
        / K,
        "copy into the store": per_call(lambda: store[:, 3].copy_(a), steps) / K,
        "f': add, clamp_max, mul": per_call(lambda: torch.add(a, 1.0, out=s).clamp_max_(1.0).mul_(v), steps)
        / K,
    }
    return arithmetic, passes


def member_floor(config: dict[str, Any], N: int) -> dict[str, float]:
    """Seconds per member-timestep of the work outside the recurrence each member must do as its
    solo run does it (one solo model, its own ops, hot caches): the readout, the loss and their
    gradients; the input side — the projection x W_inᵀ + b (the Elman cells with `ElmanScan`'s ops,
    fastrnn and sgornn through autograd, as `input_projection` runs) or SRNN's MLP and gate — and
    its gradients. A bundle runs each of these per member with the solo ops (they fix its
    rounding), so no fused step can go below the recurrence's floor plus this. Left out: the
    optimiser (tens of µs) and VPRNN's and SGORNN's rotations into W (O(k·N²) elementwise work that
    a bundle does for all members at once; alone, the solo autograd graph's ~10 small ops per
    sublayer cost more than a fused member's whole step)."""
    from trainers.cells.fastrnn import input_projection
    from trainers.kernels import input_grads
    from trainers.model import build_model
    from trainers.runtime import training_batches

    resolved = resolve(config)
    task = resolved.make_task()
    model = build_model(resolved, task)
    cell = model.cell
    x, y = task.encode(next(training_batches(task, 16, resolved.config.seed)), torch.device("cpu"))
    T, B = x.shape[0], x.shape[1]
    g = torch.Generator().manual_seed(0)
    h = torch.randn(T, B, N, generator=g).requires_grad_()
    grad = torch.randn(T, B, N, generator=g)

    def readout() -> None:
        out = model.readout(h[-1] if model.output == "last" else h)
        task.loss(out, y).backward()  # type: ignore[no-untyped-call]

    def elman_input() -> None:
        xp = x @ cell.weight_ih.detach().t()
        if cell.bias is not None:
            xp = xp + cell.bias.detach()
        input_grads(x, grad, True, cell.bias is not None)

    def fastrnn_input() -> None:
        input_projection(x, cell.weight_ih, cell.bias).backward(grad)  # type: ignore[no-untyped-call]

    def srnn_input() -> None:
        b = cell.f_r(x)
        if cell.gate is not None:
            b = b * torch.sigmoid(cell.gate(x))
        b.backward(grad)  # type: ignore[no-untyped-call]

    name = resolved.config.cell
    inputs = {"srnn": srnn_input, "fastrnn": fastrnn_input, "sgornn": fastrnn_input}.get(name, elman_input)
    work = {
        "readout, loss and their gradients": per_call(readout, 20) / T,
        "input side and its gradients": per_call(inputs, 20) / T,
    }
    return work


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=32, help="bundle size")
    ap.add_argument("--steps", type=int, default=12, help="timed training steps")
    ap.add_argument("--shape", default="psmnist", choices=["psmnist", "copy"])
    ap.add_argument("--cell", default="rnn", help="a fused cell (trainers.fused.FUSED_CELLS)")
    ap.add_argument("--hidden", type=int, help="N instead of the shape's (e.g. 32 at the copy shape)")
    args = ap.parse_args()
    configure_process(torch.device("cpu"), 1, default_mode())  # as the trainers set a CPU process up
    base, T = shapes(synthetic_mnist(Path(tempfile.mkdtemp(prefix="memsweep-floor-"))))[args.shape]
    if args.hidden:
        base = {**base, "hidden": args.hidden}
    configs = grid(base, args.k, 10**6)
    for c in configs:
        c.update(optimizer="rmsprop", clip_norm=1.0)
        if args.cell != "rnn":  # lr and seed vary; the cell's own defaults (rotation cells: N even)
            c.update(cell=args.cell, cell_params={}, hidden=base["hidden"] + base["hidden"] % 2)
    base = {**base, "hidden": configs[0]["hidden"]}
    N, B = base["hidden"], 16
    solo_min, solo_med = step_times(solo_step(configs), args.steps)
    fused_min, fused_med = step_times(fused_step(configs), args.steps)
    if args.cell == "srnn":
        arithmetic, passes = shift_floor(args.k, B, N)
    else:
        arithmetic, passes = floor(args.k, T, B, N)
        nonlinearity = resolve(configs[0]).cell_config.nonlinearity
        if nonlinearity != "elu":  # exp only for elu (the default on copy and psMNIST for rnn)
            arithmetic.pop("exp")
        if args.cell in ("urnn", "crnn"):  # each member's W projected after each step, by LAPACK's SVD
            w = torch.randn(N, N, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
            arithmetic["SVD of W after each step (÷ T)"] = per_call(lambda: torch.linalg.svd(w), 50) / T
    print(f"cell {args.cell}")
    us = 1e6 / T
    print(f"torch {torch.__version__}, 1 thread, shape {args.shape}: N={N}, B={B}, T={T}, K={args.k}\n")
    print(
        f"solo step            {solo_min * 1e3:8.2f} ms (median {solo_med * 1e3:.2f})  {solo_min * us:6.2f} µs/timestep"
    )
    per_member = fused_min / args.k
    print(
        f"fused step / member  {per_member * 1e3:8.2f} ms (median {fused_med / args.k * 1e3:.2f})"
        f"  {per_member * us:6.2f} µs/member-timestep   {solo_min / per_member:.2f}× solo"
    )
    own = member_floor(configs[0], N)
    print("\nfloor of the recurrence, µs per member-timestep:")
    for name, sec in {**arithmetic, **passes}.items():
        print(f"  {name:<38}{sec * 1e6:6.3f}")
    must, scan = sum(arithmetic.values()), sum(passes.values())
    print(
        f"  {'arithmetic every member must do':<38}{must * 1e6:6.3f}  → ceiling {solo_min / T / must:.1f}× solo"
    )
    print(
        f"  {'with the elementwise passes':<38}{(must + scan) * 1e6:6.3f}  → ceiling {solo_min / T / (must + scan):.1f}× solo"
    )
    print("\neach member's own work outside the recurrence (its solo ops), µs per member-timestep:")
    for name, sec in own.items():
        print(f"  {name:<38}{sec * 1e6:6.3f}")
    whole = must + scan + sum(own.values())
    print(
        f"  {'floor of a member: all of the above':<38}{whole * 1e6:6.3f}  → ceiling {solo_min / T / whole:.1f}× solo;"
        f" the fused step is {per_member / T / whole:.2f}× this floor"
    )


if __name__ == "__main__":
    main()
