"""The temporal order problem (Hochreiter & Schmidhuber, "Long Short-Term Memory", Neural Computation
9(8):1735-1780, 1997, §5.6 "Experiment 6: Temporal Order") as a memsweep task.

Task 6a (the paper's words, §5.6): "The sequence starts with an E, ends with a B (the 'trigger symbol')
and otherwise consists of randomly chosen symbols from the set {a, b, c, d} except for two elements at
positions t1 and t2 that are either X or Y. The sequence length is randomly chosen between 100 and
110, t1 is randomly chosen between 10 and 20, and t2 is randomly chosen between 50 and 60. There are
4 sequence classes Q, R, S, U which depend on the temporal order of X and Y": XX → Q, XY → R, YX → S,
YY → U. Task 6b: three relevant symbols, t1 ∈ [10, 20], t2 ∈ [33, 43], t3 ∈ [66, 76], 8 classes
XXX → Q … YYY → C. Inputs and targets are local (one-hot); "error signals occur only at the end of a
sequence". (E opens and B closes a sequence, as in the paper: not the other way round.)

Layout. Positions are 1-based as in the paper: element 1 is E, element L is B, the relevant symbols
sit at t1, t2 (, t3), each drawn uniformly from its window (bounds included), the other elements
uniformly from {a, b, c, d}; L is uniform on [length_min, length_max]. Each X/Y is X or Y with
probability 1/2, independently: class = the X/Y string read as a binary number, X = 0, first symbol
most significant (XX = 0 = Q, XY = 1 = R, YX = 2 = S, YY = 3 = U). Inputs: one-hot over the 8 symbols
(a, b, c, d, X, Y, E, B); the windows are config fields (None: the variant's paper values).

Lengths vary per example, and each example is scored exactly as if alone, for any batch size: every
batch is right-padded to `length_max` (the padded steps get a zero input and no target), the task's
output is the whole sequence (`output = "sequence"`), and the target sits only at each example's own
last step (elsewhere the ignore index, as varcopy does). Padding after a sequence's end cannot change
a causal model's output at that end. Padding every batch to one length (rather than to its longest
example) costs at most (length_max − length_min) / length_min = 10 % more steps and keeps every batch
the same length, so trials of different seeds can share a fused bundle's steps. The alternative —
one length per batch — would tie the lengths of a batch's examples together, which the paper's
on-line training (one sequence at a time) never does.

Loss, at each example's last step: cross-entropy over the classes (default), or `squared_error`, the
paper's: logistic output units against the one-hot target, the mean squared error over units and
examples. Random baseline (a memoryless predictor, which cannot know the class): ln C with
cross-entropy (ln 4 for 6a), (C − 1) / C² with squared error (the best constant output, 1/C per
unit); exact on the validation set, whose classes are balanced (example i has class i mod C). Metric:
accuracy, the fraction of sequences whose largest output is their class's (H&S count a sequence
correct when every output unit is within 0.3 of its target, a stricter rule).

Data: fresh batches by default — the paper generates training sequences on-line (Table 11, "t3") —
or a fixed training set (`data=fixed`, drawn from the trial seed's "temporal-order/train" stream).
`n_val` = 2560: the paper's test set ("a test set consisting of 2560 randomly chosen sequences"),
drawn from the seed's "temporal-order/val" stream. `n_train` = 10,000: the paper has no training set
(it trains until a stopping criterion); this is the nominal epoch between evaluations with fresh
batches, and the training set's size with fixed data (memsweep's varcopy uses the same), about a third
of the 31,390 sequences the paper's LSTM needed on average for 6a (Table 9).

Departures: cross-entropy by default (H&S: squared error on logistic units, offered as `loss`);
memsweep's optimiser, batches and model (H&S: on-line gradient descent, learning rate 0.5 for 6a and
0.1 for 6b, an LSTM of 2 (3) blocks of 2 cells); the stopping rule is the study's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from trainers.params import ConfigError
from trainers.seeding import generator
from trainers.tasks.base import Split, Task, Tensors

SYMBOLS = ("a", "b", "c", "d", "X", "Y", "E", "B")  # the 8 input units, in this order
N_DISTRACTORS = 4  # a, b, c, d
X, START, TRIGGER = 4, 6, 7  # X (Y = X + 1), E, B
PAD = len(SYMBOLS)  # a padded step: one-hot over 8 symbols leaves it all zero
IGNORE = -100  # target of an unscored step (F.cross_entropy's ignore_index)
#: the windows of the relevant symbols, 1-based and inclusive (§5.6)
PAPER_WINDOWS = {"6a": ((10, 20), (50, 60)), "6b": ((10, 20), (33, 43), (66, 76))}


@dataclass(frozen=True)
class TemporalOrderConfig:
    variant: Literal["6a", "6b"] = "6a"  # two relevant symbols, 4 classes; or three, 8 classes
    length_min: int = 100  # L uniform on [length_min, length_max] (§5.6)
    length_max: int = 110
    # the relevant symbols' windows, 1-based, bounds included; None: the variant's (6a: 10-20, 50-60;
    # 6b: 10-20, 33-43, 66-76)
    t1_min: int | None = None
    t1_max: int | None = None
    t2_min: int | None = None
    t2_max: int | None = None
    t3_min: int | None = None  # 6b only
    t3_max: int | None = None
    loss: Literal["cross_entropy", "squared_error"] = "cross_entropy"  # squared_error: H&S's
    data: Literal["fixed", "fresh"] = "fresh"  # fresh: generated on-line, as H&S trained
    n_train: int = 10_000  # nominal epoch (fresh) or training-set size (fixed)
    n_val: int = 2_560  # H&S's test set

    def __post_init__(self) -> None:
        self.windows()  # every check is there
        for name in ("n_train", "n_val"):
            if getattr(self, name) < 1:
                raise ConfigError(f"temporal-order: {name} = {getattr(self, name)} must be at least 1")

    def windows(self) -> tuple[tuple[int, int], ...]:
        """The relevant symbols' windows (t_min, t_max), 1-based, after checking they fit a sequence."""
        paper = PAPER_WINDOWS[self.variant]
        if self.variant == "6a" and (self.t3_min is not None or self.t3_max is not None):
            raise ConfigError("temporal-order: 6a has two relevant symbols; t3_min/t3_max are for variant=6b")
        given = ((self.t1_min, self.t1_max), (self.t2_min, self.t2_max), (self.t3_min, self.t3_max))
        windows = tuple(
            (lo if lo is not None else p_lo, hi if hi is not None else p_hi)
            for (lo, hi), (p_lo, p_hi) in zip(given, paper, strict=False)
        )
        if not 3 <= self.length_min <= self.length_max:
            raise ConfigError(
                f"temporal-order: need 3 <= length_min <= length_max (got {self.length_min}, {self.length_max})"
            )
        previous = 1  # position 1 holds E
        for i, (lo, hi) in enumerate(windows, start=1):
            if not previous < lo <= hi:
                raise ConfigError(
                    f"temporal-order: window t{i} = [{lo}, {hi}] must lie after position {previous} "
                    "(E is element 1, and windows come in order without overlapping): set "
                    f"t{i}_min and t{i}_max, e.g. t{i}_min={previous + 1}"
                )
            previous = hi
        if previous >= self.length_min:
            raise ConfigError(
                f"temporal-order: the last window ends at {previous}, but a sequence may end at "
                f"length_min = {self.length_min} (B is its last element): raise length_min above {previous}"
            )
        return windows


class TemporalOrderTask(Task):
    name = "temporal-order"
    Config = TemporalOrderConfig
    output = "sequence"  # each example is read at its own last step (padding follows it)
    metric_name = "accuracy"
    supports_fresh = True
    check_params: ClassVar[dict[str, Any]] = {
        "length_min": 24,
        "length_max": 28,
        "t1_min": 3,
        "t1_max": 6,
        "t2_min": 12,
        "t2_max": 15,
        "n_train": 64,
        "n_val": 32,
    }
    config: TemporalOrderConfig

    def __init__(self, config: TemporalOrderConfig, seed: int) -> None:
        super().__init__(config, seed)
        self.windows = config.windows()

    @property
    def n_classes(self) -> int:
        return 1 << len(self.windows)  # 2^k

    @property
    def seq_len(self) -> int:
        return self.config.length_max  # every batch is padded to it

    @property
    def input_dim(self) -> int:
        return len(SYMBOLS)

    @property
    def output_dim(self) -> int:
        return self.n_classes

    @property
    def baseline_loss(self) -> float:
        C = self.n_classes
        return math.log(C) if self.config.loss == "cross_entropy" else (C - 1) / C**2

    # ----- data: symbols [n, length_max] uint8 (PAD after the end), lengths [n], classes [n] -------
    def draw(self, n: int, gen: torch.Generator, classes: torch.Tensor | None = None) -> Tensors:
        """n sequences; their classes drawn uniformly, or the given ones."""
        c, k = self.config, len(self.windows)
        lengths = torch.randint(c.length_min, c.length_max + 1, (n,), generator=gen)
        if classes is None:
            classes = torch.randint(0, self.n_classes, (n,), generator=gen)
        positions = torch.stack(
            [torch.randint(lo, hi + 1, (n,), generator=gen) for lo, hi in self.windows], 1
        )
        symbols = torch.randint(0, N_DISTRACTORS, (n, c.length_max), generator=gen, dtype=torch.uint8)
        bits = (classes[:, None] >> torch.arange(k - 1, -1, -1)) & 1  # [n, k]: 0 = X, 1 = Y, first first
        symbols.scatter_(1, positions - 1, (X + bits).to(torch.uint8))
        symbols[:, 0] = START
        symbols[torch.arange(n), lengths - 1] = TRIGGER
        symbols[torch.arange(c.length_max)[None] >= lengths[:, None]] = PAD
        return symbols, lengths, classes

    def sample(self, n: int, gen: torch.Generator) -> Tensors:
        return self.draw(n, gen)

    def train_split(self) -> Split:
        return Split(self.draw(self.config.n_train, generator(self.seed, "temporal-order/train")))

    def val_split(self) -> Split:
        balanced = torch.arange(self.config.n_val) % self.n_classes  # every class equally often
        return Split(self.draw(self.config.n_val, generator(self.seed, "temporal-order/val"), balanced))

    def encode(self, batch: Tensors, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        symbols, lengths, classes = (t.to(device) for t in batch)
        x = F.one_hot(symbols.long().T, PAD + 1)[..., :PAD].float()  # [T, B, 8]; padding all zero
        y = torch.full(x.shape[:2], IGNORE, dtype=torch.long, device=device)  # [T, B]
        y[lengths - 1, torch.arange(len(lengths), device=device)] = classes  # at each one's last step
        return x, y

    # ----- the criterion, at each example's last step ---------------------------------------------
    def _ends(self, out: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(outputs [B, C], classes [B]) at each example's scored step."""
        ends = (y != IGNORE).long().argmax(0)  # [B]: the one scored step of each column
        columns = torch.arange(y.shape[1], device=y.device)
        return out[ends, columns], y[ends, columns]

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits, target = self._ends(out, y)  # [B, C], [B]
        if self.config.loss == "cross_entropy":
            return F.cross_entropy(logits, target)
        one_hot = F.one_hot(target, self.n_classes).to(logits.dtype)
        return F.mse_loss(torch.sigmoid(logits), one_hot)  # H&S: logistic output units, squared error

    def metric_sum(self, out: torch.Tensor, y: torch.Tensor) -> float:
        logits, target = self._ends(out, y)
        return float((logits.argmax(-1) == target).sum())
