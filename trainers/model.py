"""A cell plus the task's readout: hidden states → per-step outputs or the last step's output."""

from __future__ import annotations

import torch
from torch import nn

from trainers.cells import Cell
from trainers.config import Resolved
from trainers.initializers import glorot_uniform
from trainers.seeding import generator
from trainers.tasks import Task


class SequenceModel(nn.Module):
    def __init__(
        self, cell: Cell, output_dim: int, output: str, gen: torch.Generator, input_vocab: int | None = None
    ) -> None:
        super().__init__()
        self.cell = cell
        self.output = output
        # token tasks (e.g. PTB): ids [T, B] → embeddings [T, B, input_dim]
        self.embedding = nn.Embedding(input_vocab, cell.input_size) if input_vocab else None
        if self.embedding is not None:
            with torch.no_grad():
                self.embedding.weight.normal_(0.0, 1.0, generator=gen)
        self.readout = nn.Linear(cell.hidden_size, output_dim)
        # Keras Dense: Glorot-uniform kernel, zero bias (Orhan's train.py)
        with torch.no_grad():
            self.readout.weight.copy_(glorot_uniform(output_dim, cell.hidden_size, gen))
            self.readout.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)  # [T, B] ids → [T, B, d]
        hs: torch.Tensor = self.cell(x)  # [T, B, N]
        out: torch.Tensor = self.readout(hs[-1] if self.output == "last" else hs)  # [B, C] or [T, B, C]
        return out


def build_model(resolved: Resolved, task: Task) -> SequenceModel:
    """The trial's model, its weights drawn from the trial seed's `init` stream."""
    gen = generator(resolved.config.seed, "init")
    cell = resolved.cell_cls(resolved.cell_config, task.input_dim, resolved.config.hidden, gen)
    return SequenceModel(cell, task.output_dim, task.output, gen, task.input_vocab)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
