"""The task contract: what the training loop needs from a task, and nothing about cells or models.

A task owns its data (a fixed train / validation set, or fresh batches), its loss, its random-baseline
loss and its metric. Tensors are time-major: inputs x are [T, B, input_dim]. The model's output is
[T, B, output_dim] for `output = "sequence"` tasks and [B, output_dim] for `output = "last"` tasks.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F

Tensors = tuple[torch.Tensor, ...]

#: below this many classes, `cross_entropy` puts the classes on dim 1 of a [1, C, T·B] view
FEW_CLASSES = 32
#: Keras 2's `K.epsilon()`: its cross-entropies clip probabilities to [ε, 1 − ε] before the log
KERAS_EPSILON = 1e-7


def cross_entropy(
    out: torch.Tensor,
    y: torch.Tensor,
    prob_clip: float | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    """Cross-entropy of logits out [..., C] against class ids y [...]: the mean over every position
    (step and example) whose target is not `ignore_index`, or one value per position with
    reduction="none".

    `prob_clip` None: PyTorch's `F.cross_entropy` (log-softmax), as the PyTorch papers' code ran it.
    `prob_clip` ε: Keras 2's `categorical_crossentropy` on a softmax output (`from_logits=False`, the
    TensorFlow backend of Keras 2.2.4 that Orhan & Pitkow's code ran): p = softmax(out), rescaled to
    sum to 1, clipped to [ε, 1 − ε] (`keras_clip`), loss −ln p_y. A position's loss is then at most
    −ln ε (16.12 nats at Keras' ε = 1e-7) and an output saturated past the clip gets no gradient
    through it.

    With few classes (the copy family's 9) the classes go on dim 1 of a [1, C, positions] view, so
    torch's (log-)softmax runs along memory across the positions instead of along rows of C, several
    times faster on the CPU (docs/speed.md; the same loss, the sums round in another order). With many (char-PTB's 50) rows are faster and are kept.
    """
    C = out.shape[-1]
    if out.dim() == 2 and prob_clip is None:  # [B, C]: one position per example
        return F.cross_entropy(out, y, ignore_index=ignore_index, reduction=reduction)
    few = C < FEW_CLASSES
    logits = out.reshape(-1, C).t().unsqueeze(0) if few else out.reshape(-1, C)  # [1, C, P] or [P, C]
    target = y.reshape(1, -1) if few else y.reshape(-1)  # [1, P] or [P]
    if prob_clip is None:
        ce = F.cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction)
    else:
        ce = _keras_cross_entropy(logits, target, prob_clip, ignore_index, reduction)
    return ce.view(y.shape) if reduction == "none" else ce


def _keras_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, eps: float, ignore_index: int, reduction: str
) -> torch.Tensor:
    """Keras 2's categorical cross-entropy of softmax(logits) along dim 1 ([1, C, P] or [P, C])."""
    p = torch.softmax(logits, dim=1)  # the model's softmax output
    keep = target != ignore_index
    index = torch.where(keep, target, 0).unsqueeze(1)  # [1, 1, P] or [P, 1]
    # output /= sum(output); clip(output, ε, 1 − ε); −Σ_j t_j ln output_j = −ln output_y
    p_y = (torch.gather(p, 1, index) / p.sum(dim=1, keepdim=True)).squeeze(1)  # [1, P] or [P]
    nll = -torch.log(keras_clip(p_y, eps)) * keep
    if reduction == "none":
        return nll
    if reduction == "sum":
        return nll.sum()
    return nll.sum() / keep.sum()


def keras_clip(p: torch.Tensor, eps: float) -> torch.Tensor:
    """Keras 2's `tf.clip_by_value(p, ε, 1 − ε)`, gradient included: TF 1's clip is Minimum then
    Maximum, whose gradients pass on a tie (`x <= y`, `x >= y`), so a probability lying exactly on a
    bound keeps its gradient, and only one strictly outside gets none. `torch.clamp` passes none on a
    bound under torch 2.14.1 (2.11's passed it), and a confident softmax output often lies exactly on
    1 − ε in float32 (0.99999988). The value is `torch.clamp`'s. The bounds are TF's: ε rounded to p's
    dtype (`_to_tensor(ε)`) and 1 − ε computed in it (`1. - _epsilon`)."""
    lo, hi = _clip_bounds(eps, p.dtype)
    inside = (p >= lo) & (p <= hi)
    return torch.where(inside, p, p.detach().clamp(lo, hi))


@functools.cache
def _clip_bounds(eps: float, dtype: torch.dtype) -> tuple[float, float]:
    """(ε, 1 − ε) as TF computes them for a tensor of `dtype`: ε rounded to it, then 1 − ε in it
    (1e-7: 1.0000000117e-07 and 0.99999988 in float32, which rounding 1 − 1e-7 from double also gives;
    other ε may part by an ulp)."""
    lo = torch.tensor(eps, dtype=dtype)
    return float(lo), float(torch.tensor(1.0, dtype=dtype) - lo)


def binary_cross_entropy(out: torch.Tensor, y: torch.Tensor, prob_clip: float | None = None) -> torch.Tensor:
    """Mean binary cross-entropy of logits `out` against 0/1 targets `y` (same shape).

    `prob_clip` None: `F.binary_cross_entropy_with_logits`, which is also what Keras 2.3.1 on TF 1.15
    computes for a sigmoid output (SGORNN's HAR-2: TF's `binary_crossentropy` takes the Sigmoid op's
    input). `prob_clip` ε: Keras 2.2.4's `binary_crossentropy` (TF backend) on a sigmoid output:
    p = sigmoid(out) clipped to [ε, 1 − ε] (`keras_clip`), turned back into a logit ln(p / (1 − p)),
    then sigmoid cross-entropy with logits."""
    if prob_clip is None:
        return F.binary_cross_entropy_with_logits(out, y)
    p = keras_clip(torch.sigmoid(out), prob_clip)
    return F.binary_cross_entropy_with_logits(torch.log(p / (1 - p)), y)


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
    #: the names of `reference_baselines` (known before a task is built: a study's criteria are checked
    #: against them at the door)
    reference_baseline_names: ClassVar[tuple[str, ...]] = ()

    #: small settings under which `trainers.contract` (and `memsweep plugins check`) builds the task in a
    #: second or two: fewer examples, shorter sequences; {} when its defaults are already small
    check_params: ClassVar[dict[str, Any]] = {}

    #: Token inputs: when not None, `encode` returns x as int64 ids [T, B] and the model embeds them
    #: (nn.Embedding(input_vocab, input_dim)) before the cell; `input_dim` is then the embedding size.
    #: A task whose config chooses it (copy's `embed_dim`) says so in `embeds_inputs` too.
    input_vocab: int | None = None

    #: False when the data come from files and do not change with the trial seed (sMNIST, HAR, PTB)
    seeded_data: ClassVar[bool] = True
    #: True when a training batch's length depends on the batch (varcopy: one lag per batch), so that
    #: trials of different seeds see batches of different lengths at the same step and cannot share a
    #: fused bundle's step (`trainers.fused.fusable_key` then keys bundles by seed)
    batch_length_varies: ClassVar[bool] = False

    def __init__(self, config: Any, seed: int) -> None:
        self.config = config
        self.seed = seed

    @classmethod
    def embeds_inputs(cls, config: Any) -> bool:
        """Whether a task of this config has token inputs (`input_vocab`), known before it is built: a
        fused bundle has no embedding, so such a trial trains alone (`trainers.fused.fusable_key`)."""
        return getattr(cls, "input_vocab", None) is not None

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

    @property
    def reference_baselines(self) -> dict[str, float]:
        """Other baselines the papers quote for this task, by name (a success criterion may use one)."""
        return {}

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

    def epoch_orders(self) -> Iterator[torch.Tensor] | None:
        """The training split's order in each epoch, one index tensor per epoch, where the task's data
        code fixes it (NRU's psMNIST iterator); None: a fresh shuffle per epoch from the trial's seed
        (`trainers.runtime.training_batches`). Fixed regime only."""
        return None

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
