"""Copy task (Hochreiter & Schmidhuber 1997; Arjovsky et al. 2016; Orhan & Pitkow 2020 §3.1.1).

Symbols: data 1..8, blank 0, marker 9; inputs one-hot over 10 symbols, or their ids embedded by the
model into `embed_dim` before the cell (SRNN's code: `nn.Embedding(10, d)` before every cell), outputs 9
classes (0..8), or 10 (`classes`: the marker too, never a target, as SRNN's code reads out).
Layout (0-based), L = total length:  x[0:10] = data, x[L-11] = 9 (marker), everything else 0;
                                     y[L-10:] = data, everything else 0.
`layout="total"`: T is the whole sequence, L = T (Orhan's copy-500, their `generate_data.py`).
`layout="delay"`: T blanks between data and recall, L = T + 20 (Arjovsky / SRNN / NRU).
Loss: mean cross-entropy over every step and example (all five reference codes do this); by default
as Keras 2 computes it, probabilities clipped to [1e-7, 1 − 1e-7] (`prob_clip`; Orhan's code).
Random baseline: blanks predicted with certainty, uniform over 8 symbols at the 10 recall steps:
10·ln 8 / L (docs/protocol.md §1.1; Orhan copy-500: 0.041589).
Data: Orhan's fixed 60,000 / 10,000 train / validation sets, or fresh batches every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F

from trainers.params import UNHASHED_DEFAULT
from trainers.seeding import generator
from trainers.tasks.base import KERAS_EPSILON, Split, Task, Tensors, copy_baseline, cross_entropy

N_DATA = 10  # symbols to remember
N_SYMBOLS = 8  # data alphabet 1..8
MARKER = 9


@dataclass(frozen=True)
class CopyConfig:
    seq_len: int = 500  # T: total length (layout "total") or delay (layout "delay")
    layout: Literal["total", "delay"] = "total"
    data: Literal["fixed", "fresh"] = "fixed"
    n_train: int = 60_000  # fixed training set; in the fresh regime, the examples in one epoch
    n_val: int = 10_000
    prob_clip: float | None = (
        KERAS_EPSILON  # Keras 2 clips probabilities (docs/protocol.md §1.6); None: log-softmax
    )
    # the readout's classes: 9 (blank and symbols 1..8, every target); 10 counts the marker too, never a
    # target but in the softmax's sum, as SRNN's code reads out every cell (`Linear(hidden, 10)`)
    classes: Literal[9, 10] = field(default=9, metadata=UNHASHED_DEFAULT)
    # the inputs: None, one-hot over the 10 symbols (Orhan's, the NRU code's); d: the symbols' ids, which
    # the model embeds into d before the cell (SRNN's code embeds them for every cell: nn.Embedding(10, d),
    # weights N(0, 1), trained)
    embed_dim: int | None = field(default=None, metadata=UNHASHED_DEFAULT)


class CopyTask(Task):
    name = "copy"
    Config = CopyConfig
    output = "sequence"
    default_nonlinearity = "elu"
    metric_name = "recall_accuracy"
    supports_fresh = True
    reference_baseline_names = ("arjovsky",)
    config: CopyConfig

    def __init__(self, config: CopyConfig, seed: int) -> None:
        super().__init__(config, seed)
        min_len = 2 * N_DATA + 1 if config.layout == "total" else 1
        if config.seq_len < min_len:
            what = (
                f"the whole sequence: its {N_DATA} symbols, the marker and their {N_DATA}-step recall"
                if config.layout == "total"
                else "the delay between the symbols and their recall"
            )
            raise ValueError(
                f"copy: seq_len = {config.seq_len} is too short for layout {config.layout!r} ({what}): "
                f"give at least {min_len}"
                + (", or layout 'delay' to make seq_len the delay alone" if config.layout == "total" else "")
            )
        if config.embed_dim is not None and config.embed_dim < 1:
            raise ValueError(
                f"copy: embed_dim = {config.embed_dim} must be at least 1 (the embedding's size), or none "
                "(one-hot inputs)"
            )

    @property
    def seq_len(self) -> int:
        c = self.config
        return c.seq_len if c.layout == "total" else c.seq_len + 2 * N_DATA

    @property
    def input_dim(self) -> int:
        return MARKER + 1 if self.config.embed_dim is None else self.config.embed_dim  # one-hot over 0..9

    # token inputs (ids 0..9) when embedded; base.Task declares a plain attribute, hence the ignore
    @property
    def input_vocab(self) -> int | None:  # type: ignore[override]
        return None if self.config.embed_dim is None else MARKER + 1

    @classmethod
    def embeds_inputs(cls, config: CopyConfig) -> bool:
        return config.embed_dim is not None

    @property
    def output_dim(self) -> int:
        return self.config.classes  # classes 0..8 (and the marker, 9, with classes = 10)

    @property
    def baseline_loss(self) -> float:
        return copy_baseline(self.seq_len, N_SYMBOLS, N_DATA)

    @property
    def reference_baselines(self) -> dict[str, float]:
        """`arjovsky`: the baseline of Arjovsky et al.'s layout for this T (T blanks, T + 20 steps),
        which Orhan & Pitkow call identical to theirs (App. C); differs from `baseline_loss` only for
        layout "total" (copy-500: 0.039989 against 0.041589)."""
        return {"arjovsky": copy_baseline(self.config.seq_len + 2 * N_DATA, N_SYMBOLS, N_DATA)}

    # A data set is just its [n, 10] data symbols; `encode` lays them out.
    def sample(self, n: int, gen: torch.Generator) -> Tensors:
        return (torch.randint(1, N_SYMBOLS + 1, (n, N_DATA), generator=gen, dtype=torch.uint8),)

    def train_split(self) -> Split:
        return Split(self.sample(self.config.n_train, generator(self.seed, "copy/train")))

    def val_split(self) -> Split:
        return Split(self.sample(self.config.n_val, generator(self.seed, "copy/val")))

    def encode(self, batch: Tensors, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        (data,) = batch  # [B, 10]
        data = data.to(device=device, dtype=torch.long)
        L, B = self.seq_len, data.shape[0]
        x = torch.zeros(L, B, dtype=torch.long, device=device)
        x[:N_DATA] = data.T
        x[L - N_DATA - 1] = MARKER
        y = torch.zeros(L, B, dtype=torch.long, device=device)
        y[L - N_DATA :] = data.T
        if self.config.embed_dim is not None:
            return x, y  # x [L, B] ids, y [L, B]
        return F.one_hot(x, MARKER + 1).float(), y  # x [L, B, 10], y [L, B]

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # out [L, B, 9] logits; mean over every step and example
        return cross_entropy(out, y, self.config.prob_clip)

    def metric_sum(self, out: torch.Tensor, y: torch.Tensor) -> float:
        hit = out[-N_DATA:].argmax(-1) == y[-N_DATA:]  # [10, B]
        return float(hit.float().mean(0).sum())
