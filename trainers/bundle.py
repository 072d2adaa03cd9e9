"""A fused bundle's training step on its own, for the benchmarks (`benchmarks/gpu_check.py`): set up as
`trainers.fused.train_fused` sets one up, stepped eagerly (`Bundle.step`) or as a CUDA graph
(`trainers.graphs.GraphedStep(bundle)`), without the loop's evaluations and bookkeeping."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trainers.config import Resolved, TrainConfig, resolve
from trainers.fused import FusedModel, FusedOptimizer, check_fusable, forward_backward
from trainers.fused_cells import FUSED_CELLS
from trainers.graphs import Batch
from trainers.loop import configure_process, resolve_device, training_batches
from trainers.model import build_model
from trainers.tasks import Task
from trainers.tasks.base import Tensors


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

    @property
    def cell(self) -> str:
        return self.configs[0].cell

    @property
    def size(self) -> int:
        return len(self.configs)

    def forward_backward(self, batch: Batch) -> torch.Tensor:
        """Forward, each member's loss, backward and the optimiser (`trainers.fused.forward_backward`,
        the part a graph captures); the losses [K]."""
        return forward_backward(self.model, self.optimizer, [(s, self.tasks[s]) for s in self.seeds], batch)

    def step(self, batch: Batch | None = None) -> torch.Tensor:
        """One eager training step, as `train_fused`'s loop runs it; the losses [K]."""
        losses = self.forward_backward(batch if batch is not None else self.next_batch())
        self.model.after_step()
        return losses.detach()
