"""Variable copy task (Chandar et al. 2019, NRU §5.1; docs/protocol.md §4).

The copy task of `copy.py` (same symbols: data 1..8, blank 0, marker 9; one-hot over 10 inputs,
9 output classes) with a lag drawn **once per batch** from [lag_min, lag_max], as myTorch's
`CopyingMemoryData` does when `time_lag_min < time_lag_max` (`apsarath/myTorch:
myTorch/task/copying_memory.py:44`, configs `memnets/config/baselines/100_lag/copy_v2/*.yaml`:
lag ∈ [1, 100], batch 10, trained online on fresh batches).
Layout for lag ℓ (0-based), L = ℓ + 20:  x[0:10] = data, x[ℓ+9] = x[L−11] = 9 (marker), rest 0;
y[L−10:] = data, rest 0. (So ℓ−1 blanks sit between the data and the marker: myTorch puts the
marker at `seq_len + time_lag − 1`; this is copy.py's `delay` layout with T = ℓ.)
Loss: mean cross-entropy over every step of the sequence (myTorch's mask is all ones).

Lengths. A training batch has one lag, hence its own length L ≤ `seq_len` = lag_max + 20. The
validation set is fixed and covers every lag equally: example i has lag lag_max − (i mod n_lags), so
the first example is the longest. An evaluation batch may mix lags: `encode` right-pads it to its
longest sequence, the padded steps get no input and no target, and `loss` averages each example over
its own L steps, then over examples. Padding after a sequence's end cannot change a causal model's
outputs on that sequence, so every example is scored exactly as if alone, for any batch size, and the
validation loss is the mean over examples of their per-step loss (the average of myTorch's per-batch
training losses). Random baseline (blanks certain, uniform over 8 symbols at the recall steps): the
mean over the validation set of 10·ln 8 / (ℓ_i + 20), which equals the expectation over the uniform
lag distribution whenever n_val is a multiple of the number of lags (the default 1,000 is, for
lag_max − lag_min + 1 = 100 or 200).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from trainers.seeding import generator
from trainers.tasks.base import Split, Task, Tensors, copy_baseline, cross_entropy
from trainers.tasks.copy import MARKER, N_DATA, N_SYMBOLS

IGNORE = -100  # target of a padded step (F.cross_entropy's ignore_index)


@dataclass(frozen=True)
class VarCopyConfig:
    lag_min: int = 1  # myTorch copy_v2: time_lag_min 1
    lag_max: int = 100  # time_lag_max 100 (or 200)
    n_train: int = 10_000  # examples in one nominal epoch of fresh batches (steps per evaluation)
    n_val: int = 1_000  # fixed validation set, every lag equally often
    prob_clip: float | None = None  # None: log-softmax (the NRU authors' PyTorch); ε: Keras 2's clipped loss


class VarCopyTask(Task):
    name = "varcopy"
    Config = VarCopyConfig
    output = "sequence"
    default_nonlinearity = "elu"  # as for copy
    metric_name = "recall_accuracy"
    supports_fresh = True
    batch_length_varies = True  # one lag per batch: members of different seeds cannot share a step
    config: VarCopyConfig

    def __init__(self, config: VarCopyConfig, seed: int) -> None:
        super().__init__(config, seed)
        if config.lag_min < 1 or config.lag_max < config.lag_min:
            raise ValueError(
                f"varcopy: need 1 <= lag_min <= lag_max (got lag_min={config.lag_min}, lag_max={config.lag_max})"
            )

    @property
    def seq_len(self) -> int:
        return self.config.lag_max + 2 * N_DATA  # the longest sequence

    @property
    def input_dim(self) -> int:
        return MARKER + 1

    @property
    def output_dim(self) -> int:
        return N_SYMBOLS + 1

    @property
    def data_regime(self) -> Literal["fixed", "fresh"]:
        return "fresh"  # one lag per batch: only fresh batches keep that (NRU trains online)

    def val_lags(self) -> torch.Tensor:
        """The validation set's lags [n_val]: lag_max, lag_max − 1, …, lag_min, lag_max, …"""
        c = self.config
        n_lags = c.lag_max - c.lag_min + 1
        return c.lag_max - torch.arange(c.n_val) % n_lags

    @property
    def baseline_loss(self) -> float:
        lengths = self.val_lags() + 2 * N_DATA
        return sum(copy_baseline(int(L), N_SYMBOLS, N_DATA) for L in lengths) / len(lengths)

    # A data set is its [n, 10] data symbols and [n] lags; `encode` lays them out.
    def sample(self, n: int, gen: torch.Generator) -> Tensors:
        c = self.config
        lag = int(torch.randint(c.lag_min, c.lag_max + 1, (1,), generator=gen))  # once per batch
        data = torch.randint(1, N_SYMBOLS + 1, (n, N_DATA), generator=gen, dtype=torch.uint8)
        return data, torch.full((n,), lag, dtype=torch.int32)

    def train_split(self) -> Split:
        raise NotImplementedError("varcopy trains on fresh batches only (one lag per batch)")

    def val_split(self) -> Split:
        gen = generator(self.seed, "varcopy/val")
        data = torch.randint(1, N_SYMBOLS + 1, (self.config.n_val, N_DATA), generator=gen, dtype=torch.uint8)
        return Split((data, self.val_lags().to(torch.int32)))

    def encode(self, batch: Tensors, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        data, lags = batch  # [B, 10], [B]
        data = data.to(device=device, dtype=torch.long)
        lengths = lags.to(device=device, dtype=torch.long) + 2 * N_DATA  # [B]
        L, B = int(lengths.max()), data.shape[0]
        t = torch.arange(L, device=device)[:, None]  # [L, 1]
        inside = t < lengths[None]  # [L, B]: False on the padding after a sequence's end
        x = torch.zeros(L, B, dtype=torch.long, device=device)
        x[:N_DATA] = data.T
        x.scatter_(0, (lengths - N_DATA - 1)[None], MARKER)  # marker one step before the recall
        y = torch.where(inside, 0, IGNORE)
        recall = lengths[None] - N_DATA + torch.arange(N_DATA, device=device)[:, None]  # [10, B]
        y.scatter_(0, recall, data.T)
        x_hot = F.one_hot(x, MARKER + 1).float() * inside[..., None]  # padding: no input
        return x_hot, y  # x [L, B, 10], y [L, B]

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # out [L, B, 9]; each example's mean over its own steps, then the mean over examples
        ce = cross_entropy(out, y, self.config.prob_clip, ignore_index=IGNORE, reduction="none")  # [L, B]
        steps = (y != IGNORE).sum(0)  # [B]
        return (ce.sum(0) / steps).mean()

    def metric_sum(self, out: torch.Tensor, y: torch.Tensor) -> float:
        lengths = (y != IGNORE).sum(0)  # [B]
        t = torch.arange(y.shape[0], device=y.device)[:, None]
        recall = (t >= lengths[None] - N_DATA) & (t < lengths[None])  # [L, B], 10 steps per example
        hit = (out.argmax(-1) == y) & recall
        return float(hit.sum(0).float().div(N_DATA).sum())
