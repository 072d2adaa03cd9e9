"""A fused bundle's training step on its own, for the benchmarks (`benchmarks/gpu_check/`): set up as
`trainers.fused.train_fused` sets one up, stepped eagerly (`Bundle.step`) or as a CUDA graph
(`trainers.fused.graphs.GraphedStep(bundle)`), without the loop's evaluations and bookkeeping."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from trainers.config import Resolved, TrainConfig, resolve
from trainers.fused.cells import FUSED_CELLS
from trainers.fused.graphs import Batch
from trainers.fused.keys import check_fusable
from trainers.fused.model import FusedModel
from trainers.fused.optim import FusedOptimizer
from trainers.fused.steps import BundleSteps
from trainers.model import build_model
from trainers.runtime import configure_process, resolve_device, training_batches
from trainers.schedule import Schedule
from trainers.tasks import Task


class Bundle:
    """A fused bundle set up as `train_fused` sets one up, and its eager training step (its
    `BundleSteps`, the loop's own).

    Members share one layout of their stacked parameters (`train_fused` trains members whose W is
    laid out otherwise, e.g. the orthogonal initialiser's, as another bundle: give such members their
    own `Bundle`). Batches come from each seed's stream (`training_batches`), as in `train_fused`.
    """

    def __init__(self, configs: list[TrainConfig], model: FusedModel, optimizer: FusedOptimizer,
                 tasks: dict[int, Task], device: torch.device) -> None:  # fmt: skip
        self.configs, self.model, self.optimizer, self.device = configs, model, optimizer, device
        streams = {seed: training_batches(t, configs[0].batch_size, seed) for seed, t in tasks.items()}
        members = [(c.seed, tasks[c.seed]) for c in configs]
        self.steps = BundleSteps(model, optimizer, members, streams, configs[0].cell, graphed=False)

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
        model = FusedModel(models, FUSED_CELLS[cfg.cell], tasks[cfg.seed].output)
        steps_per_epoch = Schedule.of(cfg, tasks[cfg.seed].train_size).steps_per_epoch
        optimizer = FusedOptimizer(cfg.optimizer, [r.config for r in resolved], model.params, steps_per_epoch)
        return cls([r.config for r in resolved], model, optimizer, tasks, device)

    @property
    def cell(self) -> str:
        return self.steps.cell

    @property
    def size(self) -> int:
        return self.steps.size

    def next_batch(self) -> Batch:
        """Each seed's next training batch, encoded on the bundle's device (as `train_fused` draws them)."""
        return self.steps.next_batch()

    def forward_backward(self, batch: Batch) -> torch.Tensor:
        """Forward, each member's loss, backward and the optimiser (`trainers.fused.steps.forward_backward`,
        the part a graph captures); the losses [K]."""
        return self.steps.forward_backward(batch)

    def step(self, batch: Batch | None = None) -> torch.Tensor:
        """One eager training step, as `train_fused`'s loop runs it; the losses [K]."""
        return self.steps.step(batch).detach()
