"""Sequential MNIST, unpermuted (Le et al. 2015; docs/protocol.md §1.3 without the permutation).

psMNIST (`psmnist.py`) with the pixels in raster order: row by row, one pixel per step (784 steps,
input_dim 1); the label is read from the last step (10 classes, cross-entropy); baseline ln 10.
Normalisation, split, subset sizes and the data folder are psMNIST's fields with psMNIST's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainers.tasks.psmnist import PSMNISTConfig, PSMNISTTask


@dataclass(frozen=True)
class SMNISTConfig(PSMNISTConfig):
    """psMNIST's fields and defaults; `permutation_seed` must stay None (there is no permutation)."""


class SMNISTTask(PSMNISTTask):
    name = "smnist"
    seeded_data = False
    Config = SMNISTConfig
    permuted = False  # psmnist.py then uses the identity order

    def __init__(self, config: SMNISTConfig, seed: int) -> None:
        if config.permutation_seed is not None:
            raise ValueError(
                "smnist: the pixels are not permuted; leave permutation_seed unset (use psmnist)"
            )
        super().__init__(config, seed)
