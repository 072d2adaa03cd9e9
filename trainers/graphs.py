"""A fused bundle's whole training step captured as one CUDA graph (issue 26, item 2): opt-in, GPU only.

On a GPU a bundle's step is bound by kernel launches, not arithmetic: the scan launches a few small
kernels per timestep (copy-500: ~11 × 500 for the recurrence alone), each member's projection,
readout, loss and gradients a few more, and the host issues them one by one through Python.
Captured once (`torch.cuda.graph`), the step replays with one call and no Python in between.

What is captured, with static shapes and addresses: the forward of `FusedModel`, each member's
loss, the backward and `FusedOptimizer.step` (clip and RMSprop / Adam, the optimiser inside).
What stays outside: fetching and encoding each seed's batch (copied into fixed input buffers before
each replay), the cell's `after_step` hook (urnn's and crnn's projections take an SVD per member
and read a singular value on the host), and the loop's bookkeeping (losses, evaluation, members
leaving). A member that leaves changes every stacked tensor's shape: the caller captures again.

`Bundle` sets a bundle up as `trainers.fused.train_fused` does (tasks per seed, models, stacked
parameters, optimiser, batch streams) and runs the eager step (`Bundle.step`): the loop body of
`train_fused`, op for op (tested on the CPU: the same weights bit for bit). `GraphedStep` runs the
same step graphed: `warmup` eager steps on a side stream (torch's recipe; they allocate the
workspaces, cuBLAS's handles and the gradients' shapes), the last of them under
`torch.cuda.set_sync_debug_mode("error")`, so that a step that reads a device value on the host
(FastRNN's backward reads its gates with `float`) is refused with the op's name before any capture
(`GraphUnsupported`); then one capture, and replays.

Nothing here changes a default: `train` and `train_fused` never call it, and on the CPU it refuses
(`GraphUnsupported`) with what to run instead. Whether a graphed member's numbers equal its eager
run's is measured, not assumed: `benchmarks/gpu_check.py` compares every member, per step, on CUDA.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from trainers.config import Resolved, TrainConfig, resolve
from trainers.fused import FusedModel, FusedOptimizer, check_fusable
from trainers.fused_cells import FUSED_CELLS
from trainers.loop import configure_process, resolve_device, training_batches
from trainers.model import build_model
from trainers.tasks import Task
from trainers.tasks.base import Tensors

Batch = dict[int, tuple[torch.Tensor, torch.Tensor]]  # seed → (x, y) on the bundle's device


class GraphUnsupported(RuntimeError):
    """This bundle's step cannot be captured as a CUDA graph here (the CPU, or a host sync in the step)."""


@dataclass
class Bundle:
    """A fused bundle set up as `train_fused` sets one up, and its eager training step.

    Members share one layout of their stacked parameters (`train_fused` trains members whose W is
    laid out otherwise, e.g. the orthogonal initialiser's, as another bundle: give such members their
    own `Bundle`). Batches come from each seed's stream (`training_batches`), as in `train_fused`.
    """

    configs: list[TrainConfig]
    model: FusedModel
    optimizer: FusedOptimizer
    tasks: dict[int, Task]  # one per seed, shared by the members with that seed
    streams: dict[int, Iterator[Tensors]]
    device: torch.device

    @classmethod
    def of(cls, configs: Sequence[TrainConfig | Mapping[str, Any] | Resolved]) -> Bundle:
        resolved = [c if isinstance(c, Resolved) else resolve(c) for c in configs]
        if not resolved:
            raise ValueError("a bundle needs at least one config")
        check_fusable(resolved)
        cfg = resolved[0].config  # shared fields only
        device = resolve_device(cfg.device)
        configure_process(device, cfg.threads, cfg.numerics)
        tasks: dict[int, Task] = {}
        for r in resolved:
            if r.config.seed not in tasks:
                tasks[r.config.seed] = r.make_task()
        models = [build_model(r, tasks[r.config.seed]).to(device) for r in resolved]
        task = tasks[cfg.seed]
        model = FusedModel(models, FUSED_CELLS[cfg.cell], task.output)
        optimizer = FusedOptimizer(cfg.optimizer, [r.config for r in resolved], model.params)
        streams = {seed: training_batches(t, cfg.batch_size, seed) for seed, t in tasks.items()}
        return cls([r.config for r in resolved], model, optimizer, tasks, streams, device)

    @property
    def seeds(self) -> list[int]:
        """Member k's seed (its data stream), in the order of the stacked tensors' rows."""
        return [c.seed for c in self.configs]

    def next_batch(self) -> Batch:
        """Each seed's next training batch, encoded on the bundle's device (as `train_fused` draws them)."""
        return {
            seed: self.tasks[seed].encode(next(stream), self.device) for seed, stream in self.streams.items()
        }

    def forward_backward(self, batch: Batch) -> torch.Tensor:
        """Forward, each member's loss, backward and the optimiser: the part a graph captures. Returns
        the losses [K] (member k's mean over its batch)."""
        seeds = self.seeds
        outs = self.model.forward([batch[s][0] for s in seeds])
        losses = torch.stack(
            [self.tasks[s].loss(o, batch[s][1]) for s, o in zip(seeds, outs, strict=True)]
        )  # [K]
        for p in self.model.params:
            p.grad = None
        losses.sum().backward()  # type: ignore[no-untyped-call]
        self.optimizer.step(self.model.params)
        return losses

    def step(self, batch: Batch | None = None) -> torch.Tensor:
        """One eager training step, as `train_fused`'s loop runs it; the losses [K]."""
        losses = self.forward_backward(batch if batch is not None else self.next_batch())
        self.model.after_step()
        return losses.detach()


def graphs_available(device: torch.device) -> str | None:
    """None where a step on `device` can be captured, else why not (one line)."""
    if device.type != "cuda":
        return (
            f"CUDA graphs need a CUDA device; this bundle is on {device}: run its eager step "
            "(Bundle.step, or trainers.fused.train_fused)"
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
    with torch.cuda.stream(step.side):
        yield
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
    copies the batch into the fixed input buffers and replays. The optimiser's `step_count` counts
    the steps taken, replays included. Raises `GraphUnsupported` on the CPU (at construction) and for
    a step that synchronises with the host (at the last warm-up, before any capture; that step is
    then half taken: set the bundle up again to train it)."""

    def __init__(self, bundle: Bundle, warmup: int = 3) -> None:
        reason = graphs_available(bundle.device)
        if reason is not None:
            raise GraphUnsupported(reason)
        if warmup < 1:
            raise ValueError("warmup must be at least 1: the first step allocates what the graph reuses")
        self.bundle = bundle
        self.warmup = warmup
        self.calls = 0
        self.graph: Replayable | None = None
        self.inputs: Batch = {}
        self.losses: torch.Tensor | None = None
        self.side: Any = None  # torch.cuda.Stream, made at the first warm-up
        opt = bundle.optimizer
        if opt.kind == "adam":  # its per-step factors live in device buffers, filled before each step
            K = len(bundle.configs)
            opt.static_factors = (torch.empty(K, device=bundle.device), torch.empty(K, device=bundle.device))

    def _load(self, batch: Batch) -> Batch:
        """The fixed input buffers, holding `batch`."""
        if not self.inputs:
            self.inputs = {s: (x.clone(), y.clone()) for s, (x, y) in batch.items()}
            return self.inputs
        for s, (x, y) in batch.items():
            sx, sy = self.inputs[s]
            if sx.shape != x.shape or sy.shape != y.shape:
                raise GraphUnsupported(
                    f"seed {s}'s batch changed shape ({tuple(sx.shape)} → {tuple(x.shape)}): a graph replays "
                    "static shapes; an epoch's last partial batch needs an eager step (Bundle.step)"
                )
            sx.copy_(x)
            sy.copy_(y)
        return self.inputs

    def _factors(self) -> None:
        """Adam's factors for the step about to be taken, into the buffers the step reads."""
        opt = self.bundle.optimizer
        if opt.static_factors is None:
            return
        neg_step, bc2_sqrt = opt.adam_factors(opt.step_count + 1, torch.device("cpu"))
        opt.static_factors[0].copy_(neg_step)
        opt.static_factors[1].copy_(bc2_sqrt)

    def step(self, batch: Batch | None = None) -> torch.Tensor:
        b = self.bundle
        inputs = self._load(batch if batch is not None else b.next_batch())
        self._factors()
        self.calls += 1
        if self.calls <= self.warmup:
            losses = self._eager(inputs, probe=self.calls == self.warmup)
        else:
            if self.graph is None:
                self._capture(inputs)
            assert self.graph is not None and self.losses is not None
            self.graph.replay()
            b.optimizer.step_count += 1
            losses = self.losses.clone()
        b.model.after_step()
        return losses

    def _eager(self, inputs: Batch, probe: bool) -> torch.Tensor:
        """A warm-up step on the side stream; with `probe`, any host synchronisation is refused."""
        with side_stream(self), sync_errors(probe):
            try:
                return self.bundle.forward_backward(inputs).detach().clone()
            except RuntimeError as exc:
                if probe and "synchroniz" in str(exc):
                    raise GraphUnsupported(
                        f"{self.bundle.configs[0].cell}: the step synchronises with the host, which a CUDA "
                        f"graph cannot capture ({str(exc).strip().splitlines()[0][:300]}); train it eagerly"
                    ) from exc
                raise

    def _capture(self, inputs: Batch) -> None:
        b = self.bundle
        for p in b.model.params:  # the backward allocates the gradients in the graph's own pool
            p.grad = None
        taken = b.optimizer.step_count
        self.graph, self.losses = record_graph(lambda: b.forward_backward(inputs).detach())
        b.optimizer.step_count = taken  # the capture ran no kernel: the first replay takes the step
