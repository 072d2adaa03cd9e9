from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from trainers import numerics, plugins
from trainers.tasks.har2 import CHANNELS, DATASET_DIR
from trainers.tasks.mnist_files import RAW_FILES, raw_dir, write_idx
from trainers.tasks.ptb import FILES as PTB_FILES
from trainers.tasks.ptb import FOLDER as PTB_FOLDER

# The suite tests memsweep's own cells and tasks, whatever plugins are installed beside it (a developer's
# `pip install -e examples/indrnn`); the plugin tests give their child processes the plugins they make.
os.environ[plugins.LOAD_ENV] = "0"

# The test process computes with one numerics mode from its start ($MEMSWEEP_NUMERICS, else portable):
# MKL and ATen fix their kernels at their first use. CI runs the numerics tests under each mode.
numerics.use(numerics.default_mode())


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


def flushes_denormals() -> bool:
    """Whether this thread's CPU flushes denormals to zero (`torch.set_flush_denormal`, which has no getter)."""
    return float(torch.tensor([1e-40], dtype=torch.float32).mul(1.0)) == 0.0


@pytest.fixture(autouse=True)
def process_state_restored():
    """Each test starts at the process's thread count and denormal handling: a trial sets its own
    (`configure_process`: its threads, denormals flushed to zero), and left set, later tests in the same
    worker computed otherwise than in a fresh one — numpy's √ of a subnormal came out 0, and a test of
    subnormals failed or passed by the order xdist gave the tests (MKL's GEMMs, without STRICT, may
    also round by the thread count)."""
    threads, flush = torch.get_num_threads(), flushes_denormals()
    yield
    torch.set_num_threads(threads)
    # this thread's flags: a trial in a test's process runs on one thread (the default), so it set no
    # pool thread's (`trainers.runtime.flush_denormals` reaches the pool only with threads > 1)
    torch.set_flush_denormal(flush)


@pytest.fixture
def one_thread():
    """Small matrices: one intra-op thread is many times faster than several (and deterministic)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_mnist_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_mnist(tmp_path_factory.mktemp("mnist"))


def uci_number(v: float) -> str:
    """A reading as the UCI HAR files write it: ' 1.8085150e-004' (3-digit exponent)."""
    mantissa, exponent = f"{v: .7e}".split("e")
    return f"{mantissa}e{int(exponent):+04d}"


def make_tiny_har(root: Path, n_train: int = 24, n_test: int = 12) -> Path:
    """Tiny UCI HAR files in the public layout: <root>/UCI HAR Dataset/{train,test}/…"""
    gen = torch.Generator().manual_seed(0)
    for split, n in (("train", n_train), ("test", n_test)):
        base = root / DATASET_DIR / split
        (base / "Inertial Signals").mkdir(parents=True, exist_ok=True)
        labels = torch.arange(n) % 6 + 1  # activities 1..6
        (base / f"y_{split}.txt").write_text("".join(f"{int(a)}\n" for a in labels))
        for k, channel in enumerate(CHANNELS):
            values = torch.randn(n, 128, generator=gen) * 0.1 + k  # channel k has mean ≈ k
            lines = ("  ".join(uci_number(float(v)) for v in row) for row in values)
            (base / "Inertial Signals" / f"{channel}_{split}.txt").write_text(
                "".join(f" {ln}\n" for ln in lines)
            )
    return root


def make_tiny_ptb(root: Path) -> Path:
    """Tiny PTB files in Mikolov's format under <root>/ptb/: words (and characters) per line."""
    words = ["the", "cat", "sat", "on", "a", "mat", "<unk>", "N", "dog", "ran"]
    gen = torch.Generator().manual_seed(0)
    folder = root / PTB_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    for role, n_lines in (("train", 30), ("valid", 12), ("test", 12)):
        lines = [words] if role == "train" else []  # every word (and character) occurs in train
        for _ in range(n_lines):
            length = int(torch.randint(3, 9, (1,), generator=gen))
            lines.append([words[int(i)] for i in torch.randint(0, len(words), (length,), generator=gen)])
        (folder / PTB_FILES["word"][role]).write_text("".join(f" {' '.join(ln)} \n" for ln in lines))
        chars = (" ".join("_".join(ln)) for ln in lines)  # Mikolov's char files: '_' between words
        (folder / PTB_FILES["char"][role]).write_text("".join(f" {c}\n" for c in chars))
    return root


@pytest.fixture(scope="session")
def tiny_har_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_har(tmp_path_factory.mktemp("har"))


@pytest.fixture(scope="session")
def tiny_ptb_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_ptb(tmp_path_factory.mktemp("ptb"))


@pytest.fixture(scope="session")
def tiny_task_params(tiny_mnist_root: Path, tiny_har_root: Path, tiny_ptb_root: Path) -> dict[str, dict]:
    """Small, fast settings of every registered task (keyed by task name)."""
    return {
        "copy": {"seq_len": 30, "n_train": 64, "n_val": 32},
        "addition": {"seq_len": 20, "n_train": 64, "n_val": 32},
        "psmnist": {"root": str(tiny_mnist_root)},
        "varcopy": {"lag_min": 2, "lag_max": 12, "n_train": 64, "n_val": 22},
        "denoise": {"seq_len": 20, "n_train": 64, "n_val": 32},
        "smnist": {"root": str(tiny_mnist_root)},
        "bigpsmnist": {"root": str(tiny_mnist_root), "split": "train_test", "pad": 1},  # tiny: 30×30
        "teacher": {"seq_len": 50, "n_train": 16, "n_val": 8, "calibration_sequences": 8},
        "har2": {"root": str(tiny_har_root)},
        "ptb": {"root": str(tiny_ptb_root), "bptt": 6, "embed_dim": 8},
    }
