"""HAR-2: binary human-activity recognition from raw inertial signals (Kusupati et al. 2018, FastRNN;
as run by SGORNN, `wtaylor17/sgornn-nn-supplementary:sgornn/experiments/har2.py`, with the data of
`wtaylor17/VPRNN:vprnn/har_data.py`; docs/protocol.md §5).

Data: the UCI "Human Activity Recognition Using Smartphones" data set, which the user provides:
`<root>/UCI HAR Dataset/{train,test}/Inertial Signals/<channel>_{train,test}.txt` (one window of 128
readings per line, 7,352 train / 2,947 test windows) and `<root>/UCI HAR Dataset/{train,test}/y_{train,test}.txt`
(activity labels 1..6). Each window is a sequence of 128 steps × 9 channels.
- Channel order is fixed: CHANNELS below (the sorted file names). VPRNN takes the order of
  `os.listdir`, which depends on the file system, so its order is not reproducible.
- Binary label as in VPRNN: activities {2, 4, 6} → 0, {1, 3, 5} → 1. (Not checked against FastRNN's
  own HAR-2 definition; check before comparing with FastRNN's numbers.)
- Each channel standardised with the training set's mean and (population) standard deviation over
  windows and steps (SGORNN `load_har`); the test set is the validation set (SGORNN).
Output: one unit read at the last step; the readout is linear, so the loss is binary cross-entropy on
logits, which is what SGORNN's sigmoid + `binary_crossentropy` computed: Keras 2.3.1 passes the loss to
TF 1.15's `tf.keras` backend, which, given a Sigmoid op's output, takes that op's input and calls
`sigmoid_cross_entropy_with_logits`, unclipped (docs/protocol.md §5). Metric: accuracy (logit > 0 ⇔
p > 0.5).
Random baseline: the memoryless predictor outputs the training set's label prior p; its loss on the
training set is the entropy H(p) = −p ln p − (1 − p) ln(1 − p) (on the test set it would be the cross
entropy against the test prior, which differs by the small prior shift).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from trainers.tasks.base import Split, Task, Tensors, binary_cross_entropy
from trainers.tasks.mnist_files import default_root

DATASET_DIR = "UCI HAR Dataset"
CHANNELS = (
    "body_acc_x",
    "body_acc_y",
    "body_acc_z",
    "body_gyro_x",
    "body_gyro_y",
    "body_gyro_z",
    "total_acc_x",
    "total_acc_y",
    "total_acc_z",
)
STEPS = 128
POSITIVE = (1, 3, 5)  # → 1; activities 2, 4, 6 → 0
SOURCE = (
    'the UCI Machine Learning Repository page "Human Activity Recognition Using Smartphones" '
    "(https://archive.ics.uci.edu/dataset/240/human+activity+recognition+using+smartphones)"
)


@dataclass(frozen=True)
class HAR2Config:
    root: str | None = (
        None  # folder holding "UCI HAR Dataset/" (default $MEMSWEEP_DATA_DIR or ~/.cache/memsweep)
    )
    n_train: int | None = None  # use only the first n training windows (None: all 7,352)
    n_val: int | None = None  # use only the first n test windows (None: all 2,947)
    # None: sigmoid cross-entropy on the logits, as SGORNN's code ran (Keras 2.3.1 hands
    # `binary_crossentropy` to TF 1.15's, which takes the Sigmoid op's input: no clip). ε: Keras 2.2.4's
    # clip of p to [ε, 1 − ε] and back to a logit, a departure from the authors' code.
    prob_clip: float | None = None


def har_files(root: Path, split: str) -> list[Path]:
    """The 9 channel files in CHANNELS order, then the label file, of one split."""
    base = root / DATASET_DIR / split
    signals = [base / "Inertial Signals" / f"{ch}_{split}.txt" for ch in CHANNELS]
    return [*signals, base / f"y_{split}.txt"]


def read_numbers(path: Path) -> np.ndarray:
    return np.array(path.read_text().split(), dtype=np.float64)


@functools.lru_cache(maxsize=2)
def load_har2(root: str) -> tuple[Tensors, Tensors]:
    """((x_train [n, 128, 9] standardised float32, y_train [n] float32), (x_test, y_test)); cached."""
    files = {split: har_files(Path(root), split) for split in ("train", "test")}
    missing = [p for paths in files.values() for p in paths if not p.exists()]
    if missing:
        raise FileNotFoundError(
            f"HAR-2 data not found: {len(missing)} file(s) missing, e.g. {missing[0]}. Download the data set "
            f"from {SOURCE}, and unzip its 'UCI HAR Dataset.zip' into {root}, so that "
            f"{Path(root) / DATASET_DIR / 'train' / 'Inertial Signals'} holds {CHANNELS[0]}_train.txt … "
            f"{CHANNELS[-1]}_train.txt and {Path(root) / DATASET_DIR / 'train' / 'y_train.txt'} exists "
            "(likewise for test); or set MEMSWEEP_DATA_DIR or the task field `root` to the folder that holds "
            f"'{DATASET_DIR}'."
        )
    raw: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for split, paths in files.items():
        labels = read_numbers(paths[-1]).astype(np.int64)
        channels = [read_numbers(p).reshape(-1, STEPS) for p in paths[:-1]]
        if any(c.shape[0] != len(labels) for c in channels):
            raise ValueError(
                f"HAR-2 {split}: the channel files and y_{split}.txt disagree on the number of windows"
            )
        raw[split] = (np.stack(channels, axis=-1), labels)  # [n, 128, 9], [n]
    mean = raw["train"][0].mean(axis=(0, 1))  # per channel, over windows and steps
    std = raw["train"][0].std(axis=(0, 1))  # population std (numpy's default, as SGORNN)

    def tensors(split: str) -> Tensors:
        x, labels = raw[split]
        y = np.isin(labels, POSITIVE).astype(np.float32)
        return torch.from_numpy(((x - mean) / std).astype(np.float32)), torch.from_numpy(y)

    return tensors("train"), tensors("test")


class HAR2Task(Task):
    name = "har2"
    seeded_data = False
    Config = HAR2Config
    output = "last"
    default_nonlinearity = "relu"  # SGORNN's activation
    metric_name = "accuracy"
    supports_fresh = False
    config: HAR2Config

    def __init__(self, config: HAR2Config, seed: int) -> None:
        super().__init__(config, seed)
        self._root = str(Path(config.root) if config.root else default_root())

    @property
    def seq_len(self) -> int:
        return STEPS

    @property
    def input_dim(self) -> int:
        return len(CHANNELS)

    @property
    def output_dim(self) -> int:
        return 1

    @property
    def data_regime(self) -> Literal["fixed", "fresh"]:
        return "fixed"

    @property
    def train_size(self) -> int:
        return len(self.train_split())

    def train_split(self) -> Split:
        x, y = load_har2(self._root)[0]
        n = min(len(x), self.config.n_train or len(x))
        return Split((x[:n], y[:n]))

    def val_split(self) -> Split:
        x, y = load_har2(self._root)[1]
        n = min(len(x), self.config.n_val or len(x))
        return Split((x[:n], y[:n]))

    @property
    def baseline_loss(self) -> float:
        p = float(self.train_split().tensors[1].mean())  # training label prior
        return -sum(q * math.log(q) for q in (p, 1.0 - p) if q > 0)

    def encode(self, batch: Tensors, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batch  # [B, 128, 9], [B]
        return x.transpose(0, 1).to(device), y.to(device).unsqueeze(1)  # x [128, B, 9], y [B, 1]

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return binary_cross_entropy(out, y, self.config.prob_clip)  # out [B, 1] logits

    def metric_sum(self, out: torch.Tensor, y: torch.Tensor) -> float:
        return float(((out > 0).float() == y).sum())
