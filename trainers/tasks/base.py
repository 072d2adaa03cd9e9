"""The task contract: what the training loop needs from a task, and nothing about cells or models.

A task owns its data (a fixed train / validation set, or fresh batches), its loss, its random-baseline
loss and its metric. Tensors are time-major: inputs x are [T, B, input_dim]. The model's output is
[T, B, output_dim] for `output = "sequence"` tasks and [B, output_dim] for `output = "last"` tasks.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F

Tensors = tuple[torch.Tensor, ...]

#: below this many classes, `step_cross_entropy` puts the classes on dim 1 of a [1, C, T·B] view
FEW_CLASSES = 32


def step_cross_entropy(out: torch.Tensor, y: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """`F.cross_entropy` of per-step logits out [T, B, C] against class ids y [T, B]: the mean over
    every step and example, or [T, B] with reduction="none" (kwargs go to F.cross_entropy).

    With few classes (the copy family's 9) the classes go on dim 1 of a [1, C, T·B] view, so torch's
    log-softmax runs along memory across the T·B positions instead of along rows of C: forward and
    backward at copy-500's [8000, 9] take 0.3 ms instead of 1.9 ms on the CPU (the same loss; the
    sums round in another order). With many (char-PTB's 50) rows are faster and are kept.
    """
    C = out.shape[-1]
    if C < FEW_CLASSES:
        ce = F.cross_entropy(out.reshape(-1, C).t().unsqueeze(0), y.reshape(1, -1), **kwargs)
    else:
        ce = F.cross_entropy(out.reshape(-1, C), y.reshape(-1), **kwargs)
    return ce.view(y.shape) if kwargs.get("reduction") == "none" else ce


@dataclass(frozen=True)
class Split:
    """A fixed data set held compactly on the CPU (e.g. symbols, not one-hot); `encode` expands a batch."""

    tensors: Tensors

    def __len__(self) -> int:
        return int(self.tensors[0].shape[0])

    def take(self, index: torch.Tensor | slice) -> Tensors:
        return tuple(t[index] for t in self.tensors)


class Task(ABC):
    """One supervised sequence task. Subclasses are registered by name in `trainers.tasks`."""

    name: ClassVar[str]
    Config: ClassVar[type]
    #: "sequence": the loss reads every step's output; "last": only the final step's.
    output: ClassVar[Literal["sequence", "last"]]
    #: the nonlinearity Orhan & Pitkow used on this task (a cell's default when the user sets none)
    default_nonlinearity: ClassVar[str] = "tanh"
    #: name of the validation metric reported beside the loss, or None
    metric_name: ClassVar[str | None] = None
    #: True when a fresh-batch regime exists (synthetic tasks); data sets (MNIST) have fixed splits only
    supports_fresh: ClassVar[bool] = False

    #: Token inputs: when not None, `encode` returns x as int64 ids [T, B] and the model embeds them
    #: (nn.Embedding(input_vocab, input_dim)) before the cell; `input_dim` is then the embedding size.
    input_vocab: int | None = None

    #: False when the data come from files and do not change with the trial seed (sMNIST, HAR, PTB)
    seeded_data: ClassVar[bool] = True

    def __init__(self, config: Any, seed: int) -> None:
        self.config = config
        self.seed = seed

    # ----- shape ---------------------------------------------------------------------------------
    @property
    @abstractmethod
    def seq_len(self) -> int:
        """Realised number of time steps of one input sequence."""

    @property
    @abstractmethod
    def input_dim(self) -> int: ...

    @property
    @abstractmethod
    def output_dim(self) -> int: ...

    # ----- the criterion -------------------------------------------------------------------------
    @property
    @abstractmethod
    def baseline_loss(self) -> float:
        """Loss of the best memoryless predictor, computed from the realised layout."""

    def success_threshold(self, fraction: float) -> float:
        return fraction * self.baseline_loss

    @abstractmethod
    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean loss of a batch (a 0-d tensor)."""

    def metric_sum(self, out: torch.Tensor, y: torch.Tensor) -> float:
        """Sum of the metric over the batch's examples (averaged by the loop); 0 without a metric."""
        return 0.0

    # ----- data ----------------------------------------------------------------------------------
    @property
    def data_regime(self) -> Literal["fixed", "fresh"]:
        regime: Literal["fixed", "fresh"] = getattr(self.config, "data", "fixed")
        return regime

    @property
    def train_size(self) -> int:
        """Examples in an epoch: the fixed training set's size, or its nominal size for fresh batches."""
        return int(self.config.n_train)

    @abstractmethod
    def train_split(self) -> Split:
        """The fixed training set (called only in the fixed regime)."""

    @abstractmethod
    def val_split(self) -> Split:
        """The fixed validation set (every regime evaluates on a fixed set)."""

    def sample(self, n: int, gen: torch.Generator) -> Tensors:
        """n fresh training examples (fresh regime only)."""
        raise NotImplementedError(f"task {self.name!r} has no fresh-batch regime")

    @abstractmethod
    def encode(self, batch: Tensors, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Compact batch → (x [T, B, input_dim] float32, target) on `device`."""

    def describe(self) -> dict[str, Any]:
        return {
            "seq_len": self.seq_len,
            "input_dim": self.input_dim,
            "output_dim": self.output_dim,
            "baseline_loss": self.baseline_loss,
            "metric": self.metric_name,
        }


def copy_baseline(total_len: int, n_symbols: int = 8, n_recall: int = 10) -> float:
    """Memoryless copy baseline: certain blanks, then uniform over the symbols at the recall steps."""
    return n_recall * math.log(n_symbols) / total_len
