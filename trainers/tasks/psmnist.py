"""Permuted sequential MNIST (Le et al. 2015; Orhan & Pitkow 2020 §3.1.1).

The 784 pixels of an image enter one per step (input_dim 1) in a fixed random order; the label is
read from the last step's output (10 classes, cross-entropy). Random baseline ln 10.
Orhan's code (docs/protocol.md §1.3): a permutation drawn from the run's seed (so each seed has its
own), pixels / 255, train on the 60k training set and validate on the 10k test set. Other papers'
choices are fields: a fixed `permutation_seed` (expRNN/Emami: 92916, SRNN: 1234), `normalization`
"standard" (SRNN) or "symmetric" (VPRNN), `split` "train_val" (first 50k train, last 10k validate), and
NRU's data (`nru_project/task/mnist_task.py`, docs/protocol.md §4): `permutation_rng="nru"`, numpy's
RandomState(permutation_seed) drawing first a shuffle of the training images (before the 50k/10k split)
and then the pixels' permutation, and `trailing_zero_step`, a zero input after the last pixel, where the
label is read (their 785th step), and `batch_order="nru"`, each epoch's order of the training images
drawn by that RandomState as their data iterator draws it.
Data come through torchvision's MNIST class (see `mnist_files` for the offline source).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from trainers.params import UNHASHED_DEFAULT
from trainers.seeding import generator
from trainers.tasks.base import KERAS_EPSILON, Split, Task, Tensors, cross_entropy
from trainers.tasks.mnist_files import default_root, load_mnist

PIXELS = 28 * 28
MEAN, STD = 0.1307, 0.3081  # the usual MNIST statistics (SRNN's Normalize)


@dataclass(frozen=True)
class PSMNISTConfig:
    permutation_seed: int | None = None  # None: drawn from the trial's seed (Orhan)
    normalization: Literal["unit", "standard", "symmetric"] = "unit"  # /255 | (x−μ)/σ | [−1, 1]
    split: Literal["train_test", "train_val"] = "train_test"  # Orhan: validate on the test set
    n_train: int | None = None  # use only the first n of the training split (None: all)
    n_val: int | None = None
    root: str | None = None  # data folder (default $MEMSWEEP_DATA_DIR or ~/.cache/memsweep)
    download: bool = False  # allow torchvision's download when no local source exists
    prob_clip: float | None = (
        KERAS_EPSILON  # Keras 2 clips probabilities (docs/protocol.md §1.6); None: log-softmax
    )
    # "torch": the pixels' permutation is torch.randperm from the permutation seed (or the trial's);
    # "nru": NRU's, numpy's RandomState(permutation_seed) drawing a shuffle of the training images
    # (`permutation(60000)`, applied before the split) and then the pixels' (`permutation(784)`)
    permutation_rng: Literal["torch", "nru"] = field(default="torch", metadata=UNHASHED_DEFAULT)
    # a zero input after the last pixel, where the label is read (NRU's 785th step)
    trailing_zero_step: bool = field(default=False, metadata=UNHASHED_DEFAULT)
    # the order of the training images in each epoch: "trial", a fresh shuffle from the trial's seed;
    # "nru", NRU's data iterator's (`reset_iterator`): the same RandomState, after the shuffle and the
    # pixels' permutation, draws one permutation per fold (train, valid, test) at every epoch
    batch_order: Literal["trial", "nru"] = field(default="trial", metadata=UNHASHED_DEFAULT)


class PSMNISTTask(Task):
    name = "psmnist"
    Config = PSMNISTConfig
    output = "last"
    default_nonlinearity = "elu"
    metric_name = "accuracy"
    permuted = True
    config: PSMNISTConfig

    def __init__(self, config: PSMNISTConfig, seed: int) -> None:
        super().__init__(config, seed)
        self._root = str(Path(config.root) if config.root else default_root())
        #: NRU's shuffle of the training images (`permutation_rng="nru"`), else None
        self.image_order: torch.Tensor | None = None
        if config.permutation_rng == "nru":
            if config.permutation_seed is None or not self.permuted:
                raise ValueError(
                    f"{self.name}: permutation_rng 'nru' draws NRU's permutation from numpy's "
                    "RandomState(permutation_seed): set permutation_seed (their configs: 50)"
                    + ("" if self.permuted else "; smnist has no permutation, use psmnist")
                )
            rng = np.random.RandomState(config.permutation_seed)
            self.image_order = torch.from_numpy(rng.permutation(len(self._load(train=True)[0])))
            self.permutation = torch.from_numpy(rng.permutation(PIXELS))
            self._nru_state = rng.get_state()  # where their iterator's first `reset_iterator` draws
        elif self.permuted:
            gen = (
                generator(seed, "psmnist/permutation")
                if config.permutation_seed is None
                else torch.Generator().manual_seed(config.permutation_seed)
            )
            self.permutation = torch.randperm(PIXELS, generator=gen)
        else:
            self.permutation = torch.arange(PIXELS)
        if config.batch_order == "nru" and (config.permutation_rng != "nru" or config.split != "train_val"):
            raise ValueError(
                f"{self.name}: batch_order 'nru' continues NRU's RandomState over their 50,000 training "
                "images: set permutation_rng 'nru' and split 'train_val' with it (nru2019-sensitivity does)"
                if self.permuted
                else f"{self.name}: batch_order 'nru' is NRU's psMNIST's; smnist has no permutation, use psmnist"
            )

    @property
    def seq_len(self) -> int:
        return PIXELS + (1 if self.config.trailing_zero_step else 0)

    @property
    def input_dim(self) -> int:
        return 1

    @property
    def output_dim(self) -> int:
        return 10

    @property
    def baseline_loss(self) -> float:
        return math.log(10)

    @property
    def data_regime(self) -> Literal["fixed", "fresh"]:
        return "fixed"

    @property
    def train_size(self) -> int:
        return len(self.train_split())

    def _load(self, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return load_mnist(self._root, train, self.config.download)

    def _training_set(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The training images and labels, in NRU's shuffled order with `permutation_rng="nru"`."""
        x, y = self._load(train=True)
        return (x, y) if self.image_order is None else (x[self.image_order], y[self.image_order])

    def train_split(self) -> Split:
        x, y = self._training_set()
        if self.config.split == "train_val":
            x, y = x[:50_000], y[:50_000]
        n = min(len(x), self.config.n_train or len(x))
        return Split((x[:n], y[:n]))

    def epoch_orders(self) -> Iterator[torch.Tensor] | None:
        """With `batch_order="nru"`, each epoch's order of the training split as NRU's `PMNISTData`
        draws it: its `reset_iterator` (once before the first epoch and after each) permutes the train,
        valid and test folds in turn (their sizes: the first 50,000 shuffled images, the last 10,000,
        the test set's last 10,000). A training split cut by `n_train` keeps their order of its images."""
        if self.config.batch_order != "nru":
            return None
        return self._nru_orders()

    def _nru_orders(self) -> Iterator[torch.Tensor]:
        rng = np.random.RandomState()
        rng.set_state(self._nru_state)
        n_images, n_test = len(self._load(train=True)[0]), len(self._load(train=False)[0])
        folds = (min(n_images, 50_000), min(n_images, 10_000), min(n_test, 10_000))
        n_train = len(self.train_split())
        while True:
            train, _valid, _test = (rng.permutation(n) for n in folds)
            yield torch.from_numpy(train[train < n_train])

    def val_split(self) -> Split:
        if self.config.split == "train_test":
            x, y = self._load(train=False)
        else:
            x, y = self._training_set()
            x, y = x[50_000:], y[50_000:]
        n = min(len(x), self.config.n_val or len(x))
        return Split((x[:n], y[:n]))

    def encode(self, batch: Tensors, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = batch  # [B, 784] uint8, [B]
        x = images[:, self.permutation].to(device=device, dtype=torch.float32) / 255.0
        if self.config.normalization == "standard":
            x = (x - MEAN) / STD
        elif self.config.normalization == "symmetric":
            x = 2.0 * x - 1.0
        if self.config.trailing_zero_step:  # a zero input after the last pixel (NRU's 785th step)
            x = torch.cat([x, x.new_zeros(len(x), 1)], dim=1)
        return x.T.unsqueeze(-1).contiguous(), labels.to(device)  # x [784 (785), B, 1]

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return cross_entropy(out, y, self.config.prob_clip)  # out [B, 10]

    def metric_sum(self, out: torch.Tensor, y: torch.Tensor) -> float:
        return float((out.argmax(-1) == y).sum())
