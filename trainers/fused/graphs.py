"""A fused bundle's training step captured as one CUDA graph (issue 26, item 2): GPU only.

On a GPU a bundle's step is bound by kernel launches until the bundle is large: the scan launches a
few small kernels per timestep, each member's projection, readout, loss and gradients a few more,
and the host issues them one by one through Python. Captured once (`torch.cuda.graph`), the step
replays with one call and no Python in between (what that saves, measured: docs/gpu.md).

What is captured, with static shapes and addresses: the forward of `FusedModel`, each member's
loss, the backward and `FusedOptimizer.step` (clip and RMSprop / Adam, the optimiser inside).
What stays outside: fetching and encoding each seed's batch (copied into fixed input buffers before
each replay), the cell's `after_step` hook (urnn's and crnn's projections take an SVD per member
and read a singular value on the host), and the loop's bookkeeping (losses, evaluation, members
leaving). A member that leaves changes every stacked tensor's shape: the caller makes a new
`GraphedStep`. A batch of another shape (an epoch's last, partial batch) starts the step over: it
is the first warm-up of a new capture.

`trainers.fused.train_fused` trains a bundle this way on a GPU (`cuda_graphs`, on by default, for
the fused cells marked `graphable`); `trainers.fused.bundle.Bundle` is the step alone, for the benchmarks.
A step that cannot be held stays eager in `train_fused` (`fallback=True`): one that synchronises with
the host (found at the last warm-up, before the optimiser has changed anything, and redone eagerly),
or batches whose shape changes every step or two (`FRUITLESS_RESTARTS`).
Whether a graphed member's numbers equal its eager run's is measured, not assumed:
`benchmarks/gpu_check/graphs.py` compares every member, per step and over whole `train_fused` runs, on CUDA
(its results: docs/gpu.md).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

Batch = dict[int, tuple[torch.Tensor, torch.Tensor]]  # seed → (x, y) on the bundle's device

log = logging.getLogger(__name__)

#: eager steps a graphed bundle takes before its capture (each restart too)
GRAPH_WARMUP = 3
#: restarts in a row that replayed nothing (the batch shape changes every step or two, e.g. varcopy's
#: lags) after which a step trains eagerly for good
FRUITLESS_RESTARTS = 3


class GraphUnsupported(RuntimeError):
    """This bundle's step cannot be captured as a CUDA graph here (the CPU, or a host sync in the step)."""


class StepOptimizer(Protocol):
    """What a captured step needs of `trainers.fused.FusedOptimizer`."""

    step_count: int
    static_factors: tuple[torch.Tensor, ...] | None

    @property
    def varies(self) -> bool: ...

    def factors(self, n: int, device: torch.device) -> tuple[torch.Tensor, ...]: ...


class StepModel(Protocol):
    params: list[torch.Tensor]

    def after_step(self) -> None: ...


class Steppable(Protocol):
    """A bundle whose step can be captured: its model, optimiser and device, its cell's name, the
    number of members, the step's graphable part (`forward_backward`: forward, losses, backward,
    optimiser; the losses [K]) and each seed's next batch."""

    @property
    def model(self) -> StepModel: ...
    @property
    def optimizer(self) -> StepOptimizer: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def cell(self) -> str: ...
    @property
    def size(self) -> int: ...

    def forward_backward(self, batch: Batch) -> torch.Tensor: ...

    def next_batch(self) -> Batch: ...


def graphs_available(device: torch.device) -> str | None:
    """None where a step on `device` can be captured, else why not (one line)."""
    if device.type != "cuda":
        return (
            f"CUDA graphs need a CUDA device; this bundle is on {device}: run its eager step "
            "(trainers.fused.Bundle.step, or trainers.fused.train_fused)"
        )
    if not torch.cuda.is_available():
        return "CUDA graphs need CUDA, and torch sees no CUDA device here"
    return None


class Replayable(Protocol):
    def replay(self) -> None: ...


def record_graph(fn: Callable[[], torch.Tensor]) -> tuple[Replayable, torch.Tensor]:
    """`fn`'s kernels captured as a CUDA graph (not run: `replay` runs them), and its output, a tensor
    of the graph's own memory that every replay overwrites."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


@contextlib.contextmanager
def side_stream(step: GraphedStep) -> Iterator[None]:
    """Run the body on the step's side stream, ordered after the current stream's work and before
    its next (torch's recipe for the warm-up steps before a capture)."""
    if step.side is None:
        step.side = torch.cuda.Stream(device=step.bundle.device)  # type: ignore[no-untyped-call]
    current = torch.cuda.current_stream(step.bundle.device)
    step.side.wait_stream(current)
    try:
        with torch.cuda.stream(step.side):
            yield
    finally:  # also after a refused step: what it queued there comes before anything after it
        current.wait_stream(step.side)


@contextlib.contextmanager
def sync_errors(on: bool) -> Iterator[None]:
    """With `on`, any operation that synchronises with the host raises (torch's sync debug mode)."""
    if not on:
        yield
        return
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(before)


class GraphedStep:
    """`bundle`'s training step as one CUDA graph: `step(batch)` trains one step and returns the
    losses [K] (a fresh tensor). The first `warmup` calls run eagerly on a side stream (they are
    real training steps: the run is the same run), the next captures and replays; every later call
    copies the batch into the fixed input buffers and replays. A batch of another shape than the
    captured one drops the graph and starts over (it is the first warm-up of the next capture). The
    optimiser's `step_count` counts the steps taken, replays included.

    Refusals: on the CPU, `GraphUnsupported` at construction. A step that synchronises with the host
    is found at the last warm-up, before any capture: with `fallback`, that step is redone eagerly
    (the optimiser had not run: nothing changed but gradients, which the step recomputes) and every
    later step is eager; without, `GraphUnsupported` (the benchmarks' refusal). With `fallback`, too,
    a batch shape that changes before any replay `FRUITLESS_RESTARTS` times in a row makes the steps
    eager for good. `close` lets the graph's memory go at once (the caller's references may hold
    this object in a cycle)."""

    def __init__(self, bundle: Steppable, warmup: int = GRAPH_WARMUP, fallback: bool = False) -> None:
        reason = graphs_available(bundle.device)
        if reason is not None:
            raise GraphUnsupported(reason)
        if warmup < 1:
            raise ValueError("warmup must be at least 1: the first step allocates what the graph reuses")
        self.bundle = bundle
        self.warmup = warmup
        self.fallback = fallback
        self.eager = False  # True once the step cannot be held (fallback): every step eager
        self.calls = 0  # steps since the last start (a new shape starts over)
        self.replays = 0  # replays since the last start
        self.fruitless = 0  # starts in a row after which nothing was replayed
        self.captures = 0
        self.graph: Replayable | None = None
        self.inputs: Batch = {}
        self.losses: torch.Tensor | None = None
        self.side: Any = None  # torch.cuda.Stream, made at the first warm-up
        opt = bundle.optimizer
        if opt.varies:  # its per-step factors live in device buffers, filled before each step
            shapes = opt.factors(1, torch.device("cpu"))
            opt.static_factors = tuple(torch.empty_like(f, device=bundle.device) for f in shapes)

    def close(self) -> None:
        """Drop the graph, its buffers and its stream, and the optimiser's device factors (an eager step
        then computes them as it does without a graph)."""
        self.graph, self.losses, self.inputs, self.side = None, None, {}, None
        self.bundle.optimizer.static_factors = None

    def _load(self, batch: Batch) -> Batch:
        """The fixed input buffers, holding `batch`; new ones (and no graph) for a batch of a new shape."""
        same = self.inputs.keys() == batch.keys() and all(
            self.inputs[s][0].shape == x.shape and self.inputs[s][1].shape == y.shape
            for s, (x, y) in batch.items()
        )
        if not same:
            if self.inputs:  # a restart: did the last start replay anything?
                self.fruitless = 0 if self.replays else self.fruitless + 1
            self.graph, self.losses, self.calls, self.replays = None, None, 0, 0  # the old graph's pool goes
            self.inputs = {s: (x.clone(), y.clone()) for s, (x, y) in batch.items()}
            return self.inputs
        for s, (x, y) in batch.items():
            sx, sy = self.inputs[s]
            sx.copy_(x)
            sy.copy_(y)
        return self.inputs

    def _factors(self) -> None:
        """The optimiser's factors for the step about to be taken (Adam's, a moving learning rate),
        into the buffers the step reads."""
        opt = self.bundle.optimizer
        if opt.static_factors is None:
            return
        for buffer, factor in zip(
            opt.static_factors, opt.factors(opt.step_count + 1, torch.device("cpu")), strict=True
        ):
            buffer.copy_(factor)

    def step(self, batch: Batch | None = None) -> torch.Tensor:
        b = self.bundle
        batch = batch if batch is not None else b.next_batch()
        if self.eager:
            losses = b.forward_backward(batch).detach()
            b.model.after_step()
            return losses
        inputs = self._load(batch)
        if self.fallback and self.fruitless >= FRUITLESS_RESTARTS:
            self._go_eager()
            return self.step(batch)
        self._factors()
        self.calls += 1
        if self.calls <= self.warmup:
            warm = self._eager(inputs, probe=self.calls == self.warmup)
            if warm is None:  # the probe found a host sync; the optimiser had not run: redo eagerly
                self._go_eager()
                return self.step(batch)
            losses = warm
        else:
            if self.graph is None:
                self._capture(inputs)
            assert self.graph is not None and self.losses is not None
            self.graph.replay()
            self.replays += 1
            b.optimizer.step_count += 1
            losses = self.losses.clone()
        b.model.after_step()
        return losses

    def _go_eager(self) -> None:
        self.close()
        self.eager = True

    def _eager(self, inputs: Batch, probe: bool) -> torch.Tensor | None:
        """A warm-up step on the side stream; with `probe`, any host synchronisation is refused:
        `GraphUnsupported`, or with `fallback` None when the optimiser had not run yet."""
        taken = self.bundle.optimizer.step_count
        with side_stream(self), sync_errors(probe):
            try:
                return self.bundle.forward_backward(inputs).detach().clone()
            except RuntimeError as exc:
                if probe and "synchroniz" in str(exc):
                    if self.fallback and self.bundle.optimizer.step_count == taken:
                        log.warning(
                            "%s: the step synchronises with the host; it trains eagerly", self.bundle.cell
                        )
                        return None
                    raise GraphUnsupported(
                        f"{self.bundle.cell}: the step synchronises with the host, which a CUDA "
                        f"graph cannot capture ({str(exc).strip().splitlines()[0][:300]}); train it eagerly "
                        "(cuda_graphs=false)"
                    ) from exc
                raise

    def _capture(self, inputs: Batch) -> None:
        b = self.bundle
        for p in b.model.params:  # the backward allocates the gradients in the graph's own pool
            p.grad = None
        taken = b.optimizer.step_count
        self.graph, self.losses = record_graph(lambda: b.forward_backward(inputs).detach())
        self.captures += 1
        b.optimizer.step_count = taken  # the capture ran no kernel: the first replay takes the step
