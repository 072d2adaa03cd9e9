"""Big permuted MNIST (Rotman & Wolf, SRNN §5; `rotmanmi/SRNN:datasets/bigmnist.py`, `main.py:316-356`;
docs/protocol.md §1.3).

Each 28×28 image is zero-padded by `pad` = 14 pixels on every side to 56×56 = 3,136 pixels, which enter
one per step (input_dim 1) in a fixed random order over all 3,136 positions; the label is read from
the last step (10 classes, cross-entropy); baseline ln 10. Everything else is psMNIST (`psmnist.py`).
SRNN's choices are the defaults: the permutation is drawn from the run's seed (SRNN: `np.random.seed(seed)`,
then `np.random.permutation(784 * 4)`), pixels standardised with (0.1307, 0.3081), train on the first
50k training images and validate on the last 10k (its test set is scored only at the best validation
epoch, outside this task).
Padding happens on the raw image, so a padded pixel is a raw 0 like the image's own background and
gets the same normalisation. (SRNN's code passes the already-normalised tensor through
`to_pil_image`, which multiplies by 255 and casts to bytes, so negative and large values wrap:
background −0.424·255 becomes byte 148, while the padding is 0. That is a bug we do not reproduce.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from trainers.seeding import generator
from trainers.tasks.base import Tensors
from trainers.tasks.psmnist import PSMNISTConfig, PSMNISTTask

SIDE = 28


def padded_pixels(pad: int) -> int:
    return (SIDE + 2 * pad) ** 2  # pad 14: 56 × 56 = 3,136


@dataclass(frozen=True)
class BigPSMNISTConfig(PSMNISTConfig):
    pad: int = 14  # zero border in pixels on every side (SRNN: 14 → 56×56)
    normalization: Literal["unit", "standard", "symmetric"] = "standard"  # SRNN: Normalize(0.1307, 0.3081)
    split: Literal["train_test", "train_val"] = "train_val"  # SRNN: train 0:50k, validate 50k:60k
    prob_clip: float | None = None  # SRNN (PyTorch): log-softmax


class BigPSMNISTTask(PSMNISTTask):
    name = "bigpsmnist"
    Config = BigPSMNISTConfig

    config: BigPSMNISTConfig

    def __init__(self, config: BigPSMNISTConfig, seed: int) -> None:
        if config.pad < 0:
            raise ValueError("bigpsmnist: pad must be at least 0")
        if config.permutation_rng != "torch" or config.trailing_zero_step or config.batch_order != "trial":
            raise ValueError(
                "bigpsmnist: permutation_rng 'nru', trailing_zero_step and batch_order 'nru' are NRU's psMNIST "
                "(psmnist); leave them at their defaults here (permutation_rng 'torch', trailing_zero_step "
                "false, batch_order 'trial')"
            )
        super().__init__(config, seed)
        gen = (
            generator(seed, "bigpsmnist/permutation")
            if config.permutation_seed is None
            else torch.Generator().manual_seed(config.permutation_seed)
        )
        self.permutation = torch.randperm(padded_pixels(config.pad), generator=gen)  # over the padded image

    @property
    def seq_len(self) -> int:
        return padded_pixels(self.config.pad)

    def encode(self, batch: Tensors, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = batch  # [B, 784] uint8
        p = self.config.pad
        padded = F.pad(images.view(-1, SIDE, SIDE), (p, p, p, p))  # [B, 56, 56], zeros around
        return super().encode((padded.reshape(len(images), -1), labels), device)  # x [3136, B, 1]
