"""Denoise task (Jing et al. 2017, GORU; as run by Chandar et al. 2019, NRU §5.1; docs/protocol.md §4).

After myTorch's `DenoisingData` (`apsarath/myTorch:myTorch/task/denoising.py:34-85`, configs
`memnets/config/baselines/100_lag/denoise/*.yaml`: T = 100, batch 10, online).
Symbols as in `copy.py`: noise/blank 0, data 1..8, marker 9; one-hot over 10 inputs, 9 output classes.
Layout (0-based), L = T + 11:  x[0:T] = noise 0, with the 10 data symbols written at 10 positions
drawn without replacement from 0..T−1 and **sorted** (so they keep their order); x[T] = 9 (marker);
x[T+1:] = 0 (10 blanks). y[0:T+1] = 0, y[T+1:] = the 10 data symbols in order.
Loss: myTorch's mask is 1 only on the last 10 steps, so the loss is the mean cross-entropy over the
10 recall steps (and over examples); the outputs before the recall are not scored.
Random baseline (uniform over the 8 symbols at each recall step): ln 8 per step.
Data: fresh batches (NRU trains online) by default, or fixed train / validation sets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from trainers.seeding import generator
from trainers.tasks.base import Split, Task, Tensors, cross_entropy
from trainers.tasks.copy import MARKER, N_DATA, N_SYMBOLS


@dataclass(frozen=True)
class DenoiseConfig:
    seq_len: int = 100  # T: noise steps that hold the 10 data symbols (myTorch's time_lag)
    data: Literal["fixed", "fresh"] = "fresh"
    n_train: int = 10_000  # fixed training set; with fresh batches, the examples in one epoch
    n_val: int = 1_000
    prob_clip: float | None = None  # None: log-softmax (the NRU authors' PyTorch); ε: Keras 2's clipped loss


class DenoiseTask(Task):
    name = "denoise"
    Config = DenoiseConfig
    output = "sequence"
    default_nonlinearity = "elu"  # as for copy
    metric_name = "recall_accuracy"
    supports_fresh = True
    config: DenoiseConfig

    def __init__(self, config: DenoiseConfig, seed: int) -> None:
        super().__init__(config, seed)
        if config.seq_len < N_DATA:
            raise ValueError(f"denoise: seq_len (T) must be at least {N_DATA} to hold the data symbols")

    @property
    def seq_len(self) -> int:
        return self.config.seq_len + N_DATA + 1

    @property
    def input_dim(self) -> int:
        return MARKER + 1

    @property
    def output_dim(self) -> int:
        return N_SYMBOLS + 1

    @property
    def baseline_loss(self) -> float:
        return math.log(N_SYMBOLS)

    # A data set is its [n, 10] data symbols and their [n, 10] sorted positions; `encode` lays them out.
    def sample(self, n: int, gen: torch.Generator) -> Tensors:
        T = self.config.seq_len
        data = torch.randint(1, N_SYMBOLS + 1, (n, N_DATA), generator=gen, dtype=torch.uint8)
        # 10 distinct positions in 0..T−1 (the top 10 of T uniform keys is a uniform subset), sorted
        positions = torch.rand(n, T, generator=gen).topk(N_DATA, dim=1).indices.sort(dim=1).values
        return data, positions.to(torch.int32)

    def train_split(self) -> Split:
        return Split(self.sample(self.config.n_train, generator(self.seed, "denoise/train")))

    def val_split(self) -> Split:
        return Split(self.sample(self.config.n_val, generator(self.seed, "denoise/val")))

    def encode(self, batch: Tensors, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        data, positions = (t.to(device=device, dtype=torch.long) for t in batch)  # [B, 10] each
        T, B = self.config.seq_len, data.shape[0]
        x = torch.zeros(self.seq_len, B, dtype=torch.long, device=device)
        x.scatter_(0, positions.T, data.T)  # the data symbols among the noise
        x[T] = MARKER
        y = torch.zeros(self.seq_len, B, dtype=torch.long, device=device)
        y[T + 1 :] = data.T
        return F.one_hot(x, MARKER + 1).float(), y  # x [T+11, B, 10], y [T+11, B]

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # out [T+11, B, 9]; only the last 10 steps are scored (myTorch's mask)
        recall = out[-N_DATA:]
        return cross_entropy(recall, y[-N_DATA:], self.config.prob_clip)

    def metric_sum(self, out: torch.Tensor, y: torch.Tensor) -> float:
        hit = out[-N_DATA:].argmax(-1) == y[-N_DATA:]  # [10, B]
        return float(hit.float().mean(0).sum())
