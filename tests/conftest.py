from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainers.tasks.mnist_files import RAW_FILES, raw_dir, write_idx


def make_tiny_mnist(root: Path, n_train: int = 64, n_test: int = 32) -> Path:
    """Tiny MNIST-format files (real IDX layout) under root/MNIST/raw, for torchvision's loader."""
    gen = torch.Generator().manual_seed(0)
    out = raw_dir(root)
    out.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("test", n_test)):
        labels = torch.arange(n) % 10
        images = torch.randint(0, 256, (n, 28, 28), generator=gen, dtype=torch.uint8)
        images[:, 0, 0] = labels.to(torch.uint8) * 25  # a readable trace of the label
        write_idx(out / RAW_FILES[f"{split}_images"], images)
        write_idx(out / RAW_FILES[f"{split}_labels"], labels.to(torch.uint8))
    return root


@pytest.fixture(scope="session")
def tiny_mnist_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_mnist(tmp_path_factory.mktemp("mnist"))


@pytest.fixture(scope="session")
def tiny_task_params(tiny_mnist_root: Path) -> dict[str, dict]:
    """Small, fast settings of every registered task (keyed by task name)."""
    return {
        "copy": {"seq_len": 30, "n_train": 64, "n_val": 32},
        "addition": {"seq_len": 20, "n_train": 64, "n_val": 32},
        "psmnist": {"root": str(tiny_mnist_root)},
    }
