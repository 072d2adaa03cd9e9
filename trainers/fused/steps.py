"""A bundle's training step: each seed's next batch, each member's forward and loss, the backward of
their sum and the stacked optimiser (`forward_backward`, the part a CUDA graph captures), then the
cells' `after_step` hook; eager, or replayed as a CUDA graph (`trainers.fused.graphs`) on a GPU.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import torch

from trainers.config import TrainConfig
from trainers.fused.cells import FUSED_CELLS
from trainers.fused.graphs import GRAPH_WARMUP, Batch, GraphedStep, graphs_available
from trainers.fused.model import FusedModel
from trainers.fused.optim import FusedOptimizer
from trainers.runtime import resolve_device
from trainers.tasks import Task
from trainers.tasks.base import Tensors


def trains_graphed(config: TrainConfig) -> bool:
    """Whether a bundle of this config replays its step as a CUDA graph (`cuda_graphs`, a graphable
    fused cell, a CUDA device that can capture)."""
    spec = FUSED_CELLS.get(config.cell)
    return (
        config.cuda_graphs
        and spec is not None
        and spec.graphable
        and graphs_available(resolve_device(config.device)) is None
    )


def steps_to_pace(config: TrainConfig) -> int:
    """Steps a bundle of this config takes before it trains at its steady pace: the first (its
    allocations), or, graphed, the eager warm-ups and the step that captures. A calibration times
    the steps after these (`service.planning.calibration`)."""
    return GRAPH_WARMUP + 1 if trains_graphed(config) else 1


def forward_backward(
    model: FusedModel, optimizer: FusedOptimizer, members: Sequence[tuple[int, Task]], batch: Batch
) -> torch.Tensor:
    """A bundle's training step but the cells' `after_step` hook: each member's forward (member k:
    (its seed, its task); `batch` holds each seed's (x, y)), its loss (the mean over its batch), the
    backward of their sum and the optimiser. The part of a step a CUDA graph captures
    (`trainers.fused.graphs`). Returns the losses [K]."""
    outs = model.forward([batch[seed][0] for seed, _ in members])
    losses = torch.stack(
        [task.loss(o, batch[seed][1]) for (seed, task), o in zip(members, outs, strict=True)]
    )
    for p in model.params:
        p.grad = None
    losses.sum().backward()  # type: ignore[no-untyped-call]
    optimizer.step(model.params)
    return losses


class BundleSteps:
    """A bundle's training steps: each seed's next batch (`members`: member k's (seed, task), in the
    order of the stacked tensors' rows; members with one seed share its batches), then the step,
    eager or replayed as a CUDA graph (`graphed`: `trainers.fused.graphs.GraphedStep`, the same numbers on
    an H100, docs/gpu.md). `train_fused` makes one again when members leave (the stacked tensors
    change shape); `trainers.fused.bundle.Bundle` steps one for the benchmarks."""

    def __init__(
        self,
        model: FusedModel,
        optimizer: FusedOptimizer,
        members: Sequence[tuple[int, Task]],
        streams: Mapping[int, Iterator[Tensors]],
        cell: str,
        graphed: bool,
    ) -> None:
        self.model, self.optimizer = model, optimizer
        self.device = model.params[0].device
        self.members = list(members)
        self.tasks = dict(self.members)  # seed → task, in the order of first appearance
        self.streams = streams
        self.cell = cell
        self.size = len(self.members)
        self.graph = GraphedStep(self, warmup=GRAPH_WARMUP, fallback=True) if graphed else None
        self.captured = 0  # CUDA graphs captured by the graphs this stepper has closed

    def close(self) -> None:
        """Let a graph's memory go now (it and this object refer to each other)."""
        if self.graph is not None:
            self.captured += self.graph.captures
            self.graph.close()
            self.graph = None

    def next_batch(self) -> Batch:
        """Each seed's next training batch, encoded on the bundle's device."""
        return {seed: task.encode(next(self.streams[seed]), self.device) for seed, task in self.tasks.items()}

    def forward_backward(self, batch: Batch) -> torch.Tensor:
        return forward_backward(self.model, self.optimizer, self.members, batch)

    def step(self, batch: Batch | None = None) -> torch.Tensor:
        """One training step (on `batch`, else each seed's next); the losses [K]."""
        batch = batch if batch is not None else self.next_batch()
        if self.graph is not None:
            return self.graph.step(batch)
        losses = self.forward_backward(batch)
        self.model.after_step()
        return losses
