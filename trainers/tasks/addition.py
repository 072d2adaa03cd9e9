"""Addition task (Hochreiter & Schmidhuber 1997; Orhan & Pitkow 2020 §3.1.1).

Two channels over T steps: values u_t ~ U[0, 1) and a mask with exactly two 1s, the first at
i1 ~ U{0 .. T//2−1}, the second at i2 ~ U{T//2 .. T−1}. Target: u[i1] + u[i2], read from the
last step's output (one linear unit), MSE loss.
Channel order is a field: `mask_first` = [mask, value] (Orhan's `generate_data.py`), `value_first`
= [value, mask] (SRNN, nnRNN, SGORNN). Data: Orhan's fixed 60,000 / 10,000 sets, or fresh batches.
Random baseline: always predict E[y] = 1, MSE = Var(u1 + u2) = 2/12 = 1/6.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from trainers.seeding import generator
from trainers.tasks.base import Split, Task, Tensors


@dataclass(frozen=True)
class AdditionConfig:
    seq_len: int = 750
    channels: Literal["mask_first", "value_first"] = "mask_first"
    data: Literal["fixed", "fresh"] = "fixed"
    n_train: int = 60_000
    n_val: int = 10_000


class AdditionTask(Task):
    name = "addition"
    Config = AdditionConfig
    output = "last"
    default_nonlinearity = "relu"
    metric_name = None
    supports_fresh = True
    config: AdditionConfig

    def __init__(self, config: AdditionConfig, seed: int) -> None:
        super().__init__(config, seed)
        if config.seq_len < 2:
            raise ValueError("addition: seq_len must be at least 2")

    @property
    def seq_len(self) -> int:
        return self.config.seq_len

    @property
    def input_dim(self) -> int:
        return 2

    @property
    def output_dim(self) -> int:
        return 1

    @property
    def baseline_loss(self) -> float:
        return 1.0 / 6.0

    def sample(self, n: int, gen: torch.Generator) -> Tensors:
        T = self.seq_len
        values = torch.rand(n, T, generator=gen)  # [n, T]
        i1 = torch.randint(0, T // 2, (n,), generator=gen)
        i2 = torch.randint(T // 2, T, (n,), generator=gen)
        return values, torch.stack([i1, i2], 1)  # [n, T], [n, 2]

    def train_split(self) -> Split:
        return Split(self.sample(self.config.n_train, generator(self.seed, "addition/train")))

    def val_split(self) -> Split:
        return Split(self.sample(self.config.n_val, generator(self.seed, "addition/val")))

    def encode(self, batch: Tensors, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        values, idx = (t.to(device) for t in batch)
        mask = torch.zeros_like(values).scatter_(1, idx, 1.0)  # [B, T]
        target = values.gather(1, idx).sum(1, keepdim=True)  # [B, 1]
        pair = (mask, values) if self.config.channels == "mask_first" else (values, mask)
        return torch.stack(pair, -1).transpose(0, 1).contiguous(), target  # x [T, B, 2]

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(out, y)  # out [B, 1]
