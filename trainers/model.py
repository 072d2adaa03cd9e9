"""A cell plus the task's readout: hidden states → per-step outputs or the last step's output."""

from __future__ import annotations

import torch
from torch import nn

from trainers.cells import Cell
from trainers.config import Resolved
from trainers.initializers import glorot_uniform, torch_default_linear
from trainers.seeding import generator
from trainers.tasks import Task


class SequenceModel(nn.Module):
    def __init__(
        self,
        cell: Cell,
        output_dim: int,
        output: str,
        gen: torch.Generator,
        input_vocab: int | None = None,
        readout_init: str = "glorot",
    ) -> None:
        super().__init__()
        self.cell = cell
        self.output = output
        # token tasks (e.g. PTB): ids [T, B] → embeddings [T, B, input_dim]
        self.embedding = nn.Embedding(input_vocab, cell.input_size) if input_vocab else None
        if self.embedding is not None:
            with torch.no_grad():
                self.embedding.weight.normal_(0.0, 1.0, generator=gen)
        self.readout = readout(cell.hidden_size, output_dim, readout_init, gen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)  # [T, B] ids → [T, B, d]
        hs: torch.Tensor = self.cell(x)  # [T, B, N]
        out: torch.Tensor = self.readout(hs[-1] if self.output == "last" else hs)  # [B, C] or [T, B, C]
        return out


def readout(n: int, c: int, init: str, gen: torch.Generator) -> nn.Linear:
    """The readout Linear(n, c) as a paper's code drew it (`TrainConfig.readout_init`): Keras' Dense, a
    Glorot-uniform kernel and a zero bias (Orhan's train.py, the default); myTorch's, Xavier-normal and a
    zero bias (the NRU code's `_W_h2o`, gain 1 for its linear output); torch's nn.Linear (SRNN's `end_fc`)."""
    if init == "plain":
        return torch_default_linear(n, c, gen)
    layer = nn.Linear(n, c)
    with torch.no_grad():
        if init == "glorot":
            layer.weight.copy_(glorot_uniform(c, n, gen))
        elif init == "xavier_normal":
            nn.init.xavier_normal_(layer.weight, generator=gen)  # std √(2/(n + c))
        else:
            raise ValueError(f"readout_init {init!r}: choose glorot, xavier_normal or plain")
        layer.bias.zero_()
    return layer


def build_model(resolved: Resolved, task: Task) -> SequenceModel:
    """The trial's model, its weights drawn from the trial seed's `init` stream."""
    gen = generator(resolved.config.seed, "init")
    cell = resolved.cell_cls(resolved.cell_config, task.input_dim, resolved.config.hidden, gen)
    readout_init = resolved.config.readout_init
    return SequenceModel(cell, task.output_dim, task.output, gen, task.input_vocab, readout_init)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
