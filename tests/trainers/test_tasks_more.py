"""The NRU, SRNN, Emami, SGORNN and language tasks: layouts, baselines (checked against each task's own
loss), metrics, file formats and the errors for missing files."""

import dataclasses
import math

import pytest
import torch

from trainers import resolve, train
from trainers.model import build_model
from trainers.tasks import get_task, list_tasks
from trainers.tasks.bigpsmnist import BigPSMNISTConfig, BigPSMNISTTask
from trainers.tasks.copy import CopyConfig, CopyTask
from trainers.tasks.denoise import DenoiseConfig, DenoiseTask
from trainers.tasks.har2 import CHANNELS, DATASET_DIR, HAR2Config, HAR2Task
from trainers.tasks.ptb import FILES, PTBConfig, PTBTask, load_ptb
from trainers.tasks.smnist import SMNISTConfig, SMNISTTask
from trainers.tasks.teacher import TeacherConfig, TeacherTask, recurrent_matrix
from trainers.tasks.varcopy import IGNORE, VarCopyConfig, VarCopyTask

CPU = torch.device("cpu")
NEW = ["varcopy", "denoise", "smnist", "bigpsmnist", "teacher", "har2", "ptb"]


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_all_registered():
    assert set(NEW) <= set(list_tasks())


# ----- varcopy ---------------------------------------------------------------------------------------
def test_varcopy_draws_one_lag_per_batch_and_each_batch_has_its_own_length():
    task = VarCopyTask(VarCopyConfig(lag_min=1, lag_max=30), seed=1)
    g, lengths = gen(), set()
    for _ in range(20):
        data, lags = task.sample(5, g)
        assert data.shape == (5, 10) and (lags == lags[0]).all()  # one lag for the whole batch
        x, y = task.encode((data, lags), CPU)
        assert x.shape[0] == y.shape[0] == int(lags[0]) + 20 <= task.seq_len
        assert (y != IGNORE).all()  # a training batch has no padding
        lengths.add(x.shape[0])
    assert len(lengths) > 5 and max(lengths) <= 50


@pytest.mark.parametrize("lag", [1, 7, 30])
def test_varcopy_layout_is_copy_with_delay_layout(lag):
    task = VarCopyTask(VarCopyConfig(lag_min=1, lag_max=30), seed=1)
    data = torch.randint(1, 9, (3, 10), generator=gen(), dtype=torch.uint8)
    x, y = task.encode((data, torch.full((3,), lag, dtype=torch.int32)), CPU)
    x_copy, y_copy = CopyTask(CopyConfig(seq_len=lag, layout="delay"), seed=1).encode((data,), CPU)
    assert torch.equal(x, x_copy) and torch.equal(y, y_copy)
    assert (x.argmax(-1)[lag + 9] == 9).all()  # myTorch: marker at seq_len + time_lag − 1


def test_varcopy_validation_covers_every_lag_and_starts_with_the_longest():
    task = VarCopyTask(VarCopyConfig(lag_min=3, lag_max=12, n_val=25), seed=1)
    lags = task.val_split().tensors[1]
    assert lags[0] == 12 and lags[:10].tolist() == list(range(12, 2, -1)) and lags[10] == 12
    x, _ = task.encode(task.val_split().take(slice(0, 4)), CPU)
    assert x.shape[0] == task.seq_len == 32


def test_varcopy_padding_does_not_change_an_examples_loss():
    params = {"lag_min": 2, "lag_max": 15, "n_val": 14}
    resolved = resolve({"task": "varcopy", "hidden": 8, "task_params": params})
    task = resolved.make_task()
    model = build_model(resolved, task)
    split = task.val_split()
    x, y = task.encode(split.take(slice(0, 14)), CPU)  # 14 different lags, padded to the longest
    together = task.loss(model(x), y)
    alone = [task.loss(model(xi), yi) for xi, yi in (task.encode(split.take([i]), CPU) for i in range(14))]
    assert together.item() == pytest.approx(torch.stack(alone).mean().item(), rel=1e-5)
    assert task.metric_sum(model(x), y) == pytest.approx(
        sum(
            task.metric_sum(model(xi), yi)
            for xi, yi in (task.encode(split.take([i]), CPU) for i in range(14))
        )
    )


def memoryless_copy_logits(y):
    """Certain blank before each example's recall, uniform over the 8 symbols during it."""
    lengths = (y != IGNORE).sum(0)
    t = torch.arange(y.shape[0])[:, None]
    recall = (t >= lengths - 10) & (t < lengths)
    logits = torch.full((*y.shape, 9), -1e9)
    logits[..., 0] = torch.where(recall, -1e9, 0.0)
    logits[..., 1:] = torch.where(recall, 0.0, -1e9)[..., None]
    return logits


def test_varcopy_baseline_equals_the_loss_of_the_memoryless_predictor():
    task = VarCopyTask(VarCopyConfig(lag_min=1, lag_max=20, n_val=60), seed=1)
    _x, y = task.encode(task.val_split().take(slice(0, 60)), CPU)
    assert task.loss(memoryless_copy_logits(y), y).item() == pytest.approx(task.baseline_loss, rel=1e-6)
    expected = sum(10 * math.log(8) / (lag + 20) for lag in range(1, 21)) / 20  # n_val = 3 × 20 lags
    assert task.baseline_loss == pytest.approx(expected)
    data, lags = task.sample(8, gen())  # a training batch: 10·ln 8 / its own length
    _, yb = task.encode((data, lags), CPU)
    assert task.loss(memoryless_copy_logits(yb), yb).item() == pytest.approx(
        10 * math.log(8) / (int(lags[0]) + 20)
    )


def test_varcopy_is_fresh_only():
    task = VarCopyTask(VarCopyConfig(), seed=1)
    assert task.data_regime == "fresh" and task.seq_len == 120
    with pytest.raises(NotImplementedError, match="fresh"):
        task.train_split()
    with pytest.raises(ValueError, match="lag_min"):
        VarCopyTask(VarCopyConfig(lag_min=5, lag_max=4), seed=1)


# ----- denoise ---------------------------------------------------------------------------------------
def test_denoise_layout():
    T = 30
    task = DenoiseTask(DenoiseConfig(seq_len=T), seed=1)
    data, positions = task.sample(50, gen())
    assert (positions[:, 1:] > positions[:, :-1]).all()  # sorted and distinct
    assert positions.min() >= 0 and positions.max() < T
    x, y = task.encode((data, positions), CPU)
    assert x.shape == (T + 11, 50, 10) and y.shape == (T + 11, 50) and task.seq_len == T + 11
    symbols = x.argmax(-1)  # [L, B]
    noise = symbols[:T]
    assert torch.equal((noise > 0).sum(0), torch.full((50,), 10))  # exactly the 10 data symbols
    assert torch.equal(noise.T[noise.T > 0].view(50, 10), data.long())  # in their original order
    assert (symbols[T] == 9).all() and (symbols[T + 1 :] == 0).all()  # marker, then 10 blanks
    assert (y[: T + 1] == 0).all() and torch.equal(y[T + 1 :], data.long().T)


def test_denoise_positions_cover_the_noise_steps():
    task = DenoiseTask(DenoiseConfig(seq_len=12), seed=1)
    _, positions = task.sample(2000, gen())
    counts = torch.bincount(positions.flatten().long(), minlength=12).float()
    assert counts.min() / counts.max() > 0.9  # 10 of 12 positions: every position equally likely


def test_denoise_scores_only_the_last_10_steps_and_baseline_is_ln8():
    task = DenoiseTask(DenoiseConfig(seq_len=20), seed=1)
    _, y = task.encode(task.sample(16, gen()), CPU)
    logits = torch.zeros(task.seq_len, 16, 9)
    logits[-10:, :, 0] = -1e9  # uniform over the 8 symbols at the recall steps
    assert task.loss(logits, y).item() == pytest.approx(task.baseline_loss) == pytest.approx(math.log(8))
    logits[:-10] = torch.randn(task.seq_len - 10, 16, 9)  # the outputs before the recall are not scored
    assert task.loss(logits, y).item() == pytest.approx(math.log(8))


# ----- smnist / bigpsmnist ---------------------------------------------------------------------------
def test_smnist_keeps_the_raster_order(tiny_mnist_root):
    task = SMNISTTask(SMNISTConfig(root=str(tiny_mnist_root)), seed=1)
    images, labels = task.train_split().take(slice(0, 4))
    x, _y = task.encode((images, labels), CPU)
    assert x.shape == (784, 4, 1) and task.seq_len == 784
    assert torch.allclose(x[:, :, 0].T, images.float() / 255)
    with pytest.raises(ValueError, match="permutation_seed"):
        SMNISTTask(SMNISTConfig(root=str(tiny_mnist_root), permutation_seed=1), seed=1)


def test_bigpsmnist_pads_to_56x56_then_permutes(tiny_mnist_root):
    cfg = BigPSMNISTConfig(root=str(tiny_mnist_root), normalization="unit", split="train_test")
    task = BigPSMNISTTask(cfg, seed=1)
    assert task.seq_len == 3136 and torch.equal(task.permutation.sort().values, torch.arange(3136))
    images, labels = task.val_split().take(slice(0, 3))
    x, _ = task.encode((images, labels), CPU)
    assert x.shape == (3136, 3, 1)
    canvas = torch.empty(3136, 3)
    canvas[task.permutation] = x[:, :, 0]  # undo the permutation
    canvas = canvas.T.reshape(3, 56, 56)
    assert torch.allclose(canvas[:, 14:42, 14:42], images.view(3, 28, 28).float() / 255)
    canvas[:, 14:42, 14:42] = 0
    assert (canvas == 0).all()  # a 14-pixel zero border
    other = BigPSMNISTTask(BigPSMNISTConfig(root=str(tiny_mnist_root)), seed=2)
    assert not torch.equal(task.permutation, other.permutation)


def test_bigpsmnist_defaults_are_srnns():
    c = BigPSMNISTConfig()
    assert c.normalization == "standard" and c.split == "train_val" and c.permutation_seed is None


@pytest.mark.parametrize("name", ["smnist", "bigpsmnist"])
def test_mnist_variants_baseline_is_ln10(name, tiny_task_params):
    cls = get_task(name)
    task = cls(cls.Config(**tiny_task_params[name]), seed=1)
    _, y = task.encode(task.val_split().take(slice(0, 8)), CPU)
    assert (
        task.loss(torch.zeros(8, 10), y).item()
        == pytest.approx(task.baseline_loss)
        == pytest.approx(math.log(10))
    )


# ----- teacher ---------------------------------------------------------------------------------------
SMALL_TEACHER = TeacherConfig(seq_len=200, n_train=20, n_val=40, calibration_sequences=20)


def test_teacher_w_is_contractive_within_epsilon_when_normalised():
    for seed in range(20):
        A = torch.randn(4, 4, generator=gen(seed), dtype=torch.float64)
        s = torch.linalg.svdvals(recurrent_matrix(A, 0.01, normalize=True))
        assert (s > 1 - 0.01).all() and (s < 1).all()
        code = recurrent_matrix(A, 0.01, normalize=False)  # the code's I − 0.01 AᵀA
        assert torch.allclose(code, torch.eye(4, dtype=torch.float64) - 0.01 * A.T @ A)
    task = TeacherTask(SMALL_TEACHER, seed=1)
    s = torch.linalg.svdvals(task.teacher.W)
    assert (s > 0.99).all() and (s < 1).all() and torch.allclose(task.teacher.W, task.teacher.W.T)


def test_teacher_units_are_active_60_percent_of_the_time():
    task = TeacherTask(SMALL_TEACHER, seed=1)
    r = task.realisation
    # on the calibration sequences the procedure converges (the code's 100 iterations)…
    assert r.calibration_activity.shape == (4,) and ((r.calibration_activity - 0.6).abs() < 0.01).all()
    # …and carries over to new sequences up to sampling noise (T = 200 is two time constants here)
    h, _ = task.teacher.run(task.val_split().tensors[0])
    assert ((h > 1e-3).double().mean((0, 1)) - 0.6).abs().max() < 0.1
    assert ((r.activity - 0.6).abs() < 0.1).all()


def test_teacher_noise_and_r2():
    task = TeacherTask(SMALL_TEACHER, seed=1)
    r = task.realisation
    _, y0 = task.teacher.run(r.x)
    assert r.noise_var == pytest.approx(float(y0.pow(2).mean()) * 10 ** (-20 / 10))
    _x, y = task.encode(task.val_split().tensors, CPU)
    n = y.shape[1]
    # a perfect model of the noiseless teacher: R² ≈ the optimal R² at this noise level
    perfect = y0[task.config.n_train :].transpose(0, 1).float()
    assert task.metric_sum(perfect, y) / n == pytest.approx(task.optimal_r2, abs=0.01)
    assert 0.5 < task.optimal_r2 < 1
    # the memoryless predictor (each output's mean): R² = 0 and loss = baseline
    mean = y.double().mean((0, 1)).float().expand_as(y)
    assert task.metric_sum(mean, y) / n == pytest.approx(0.0, abs=1e-5)
    assert task.loss(mean, y).item() == pytest.approx(task.baseline_loss, rel=1e-5)
    d = task.describe()
    assert d["optimal_r2"] == task.optimal_r2 and d["noise_var"] == r.noise_var


def test_teacher_realisation_follows_teacher_seed_else_the_trial_seed():
    small = TeacherConfig(seq_len=20, n_train=4, n_val=4, calibration_sequences=4, calibration_iters=5)
    a, b = TeacherTask(small, seed=1), TeacherTask(small, seed=2)
    assert not torch.equal(a.val_split().tensors[1], b.val_split().tensors[1])
    fixed = dataclasses.replace(small, teacher_seed=7)
    c, d = TeacherTask(fixed, seed=1), TeacherTask(fixed, seed=2)
    assert torch.equal(c.val_split().tensors[1], d.val_split().tensors[1])
    assert torch.equal(c.teacher.W, TeacherTask(small, seed=7).teacher.W)


def test_teacher_sparse_input():
    cfg = TeacherConfig(
        seq_len=500, n_train=10, n_val=10, sparse_in=0.02, calibration_sequences=4, calibration_iters=2
    )
    x = TeacherTask(cfg, seed=1).train_split().tensors[0]
    assert (x != 0).float().mean().item() == pytest.approx(0.02, abs=0.005)


def test_teacher_r2_through_the_loop_is_one_minus_loss_over_baseline():
    task_params = {
        "seq_len": 30,
        "n_train": 20,
        "n_val": 10,
        "calibration_sequences": 5,
        "calibration_iters": 10,
    }
    r = train(
        {
            "task": "teacher",
            "hidden": 6,
            "steps": 3,
            "batch_size": 5,
            "eval_batch_size": 4,
            "task_params": task_params,
        }
    )
    assert r.status == "done" and r.metric_name == "r2"
    assert r.final_metric == pytest.approx(1 - r.final_val_loss / r.baseline_loss, rel=1e-5)


# ----- HAR-2 -----------------------------------------------------------------------------------------
def test_har2_reads_the_uci_layout(tiny_har_root):
    task = HAR2Task(HAR2Config(root=str(tiny_har_root)), seed=1)
    train_split, val_split = task.train_split(), task.val_split()
    assert len(train_split) == 24 and len(val_split) == 12 and task.train_size == 24
    x, y = task.encode(train_split.take(slice(0, 24)), CPU)
    assert x.shape == (128, 24, 9) and y.shape == (24, 1) and task.seq_len == 128 and task.input_dim == 9
    labels = torch.arange(24) % 6 + 1  # what make_tiny_har wrote
    assert torch.equal(y.squeeze(1), torch.isin(labels, torch.tensor([1, 3, 5])).float())
    flat = x.reshape(-1, 9).double()  # standardised with the training mean / population std
    assert torch.allclose(flat.mean(0), torch.zeros(9, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(flat.std(0, unbiased=False), torch.ones(9, dtype=torch.float64), atol=1e-4)


def test_har2_channel_order_is_fixed(tmp_path):
    from tests.conftest import make_tiny_har, uci_number

    root = make_tiny_har(tmp_path)
    signals = root / DATASET_DIR / "test" / "Inertial Signals"
    for k, channel in enumerate(CHANNELS):  # test channel k: constant 10·k
        (signals / f"{channel}_test.txt").write_text(
            (" " + "  ".join([uci_number(10.0 * k)] * 128) + "\n") * 12
        )
    task = HAR2Task(HAR2Config(root=str(root)), seed=1)
    x, _ = task.encode(task.val_split().tensors, CPU)
    # training channel k ~ N(k, 0.1²) (make_tiny_har), so test channel k standardises to ≈ 90·k:
    # increasing along the channel axis only if both splits are read in CHANNELS order
    assert x.shape == (128, 12, 9) and (x[0, 0, 1:] > x[0, 0, :-1]).all()


def test_har2_baseline_equals_the_loss_of_the_memoryless_predictor(tiny_har_root):
    task = HAR2Task(HAR2Config(root=str(tiny_har_root), n_train=20), seed=1)
    _, y = task.encode(task.train_split().tensors, CPU)
    p = y.mean().item()
    logit = torch.full_like(y, math.log(p / (1 - p)))
    assert task.loss(logit, y).item() == pytest.approx(task.baseline_loss, rel=1e-6)
    assert task.metric_sum(torch.where(y > 0, 3.0, -3.0), y) == y.shape[0]  # accuracy: logit > 0 ⇔ 1


def test_har2_loss_is_sgornns_sigmoid_cross_entropy_on_the_logits(tiny_har_root):
    """SGORNN's Keras 2.3.1 hands `binary_crossentropy` to TF 1.15's, which, given the Dense layer's
    Sigmoid output, takes the op's input and calls `sigmoid_cross_entropy_with_logits`, unclipped: a
    confidently wrong window costs its whole logit (not Keras 2.2.4's 16.12 nats) and keeps its gradient.
    Keras 2.2.4's clipped formula is the explicit `prob_clip` ε."""
    out = torch.tensor([[40.0], [-3.0], [0.5], [25.0]], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([[0.0], [1.0], [1.0], [1.0]], dtype=torch.float64)
    tf_logits_loss = (out.clamp(min=0) - out * y + torch.log1p(torch.exp(-out.abs()))).mean()
    task = HAR2Task(HAR2Config(root=str(tiny_har_root)), seed=1)
    loss = task.loss(out, y)
    torch.testing.assert_close(loss, tf_logits_loss, rtol=1e-12, atol=0.0)
    (grad,) = torch.autograd.grad(loss, out)
    assert grad[0, 0] == pytest.approx(0.25) and grad[3, 0] != 0  # 1/B each: σ(40) − 0 and σ(25) − 1
    clipped = HAR2Task(HAR2Config(root=str(tiny_har_root), prob_clip=1e-7), seed=1)
    assert clipped.loss(out, y).item() < loss.item() - 5.0  # the 40-logit window capped near 16.12 nats


def test_har2_missing_files_say_where_they_go_and_where_they_come_from(tmp_path):
    task = HAR2Task(HAR2Config(root=str(tmp_path)), seed=1)
    with pytest.raises(FileNotFoundError) as err:
        task.train_split()
    message = str(err.value)
    assert "Human Activity Recognition Using Smartphones" in message and "archive.ics.uci.edu" in message
    assert str(tmp_path / DATASET_DIR / "train" / "Inertial Signals") in message and "y_train.txt" in message


# ----- PTB -------------------------------------------------------------------------------------------
def ptb(root, **kw):
    return PTBTask(PTBConfig(root=str(root), **kw), seed=1)


def test_ptb_word_vocabulary_and_windows(tiny_ptb_root):
    task = ptb(tiny_ptb_root, bptt=6, embed_dim=8)
    corpus = task.corpus
    assert "<eos>" in corpus.vocab and "<unk>" in corpus.vocab and task.input_vocab == len(corpus.vocab) == 11
    assert task.input_dim == 8 and task.output_dim == 11 and task.seq_len == 6
    first = (tiny_ptb_root / "ptb" / "ptb.train.txt").read_text().splitlines()[0].split()
    assert [corpus.vocab[i] for i in corpus.ids["train"][: len(first) + 1]] == [*first, "<eos>"]
    windows = task.train_split().tensors[0]
    assert windows.shape[1] == 7 and torch.equal(windows[:-1, -1], windows[1:, 0])  # contiguous, no overlap
    assert torch.equal(windows.flatten()[:7], corpus.ids["train"][:7])
    x, y = task.encode(task.train_split().take(slice(0, 5)), CPU)
    assert x.shape == y.shape == (6, 5) and x.dtype == torch.int64
    assert torch.equal(x[1:], y[:-1])  # the target is the next token


def test_ptb_char_level_reads_characters(tiny_ptb_root):
    task = ptb(tiny_ptb_root, level="char")
    assert task.seq_len == 150 and ptb(tiny_ptb_root).seq_len == 35  # the levels' default bptt
    vocab = task.corpus.vocab
    assert "_" in vocab and "<eos>" in vocab and all(len(t) == 1 for t in vocab if t != "<eos>")


@pytest.mark.parametrize("level", ["word", "char"])
def test_ptb_baseline_is_the_unigram_entropy_of_the_training_stream(tiny_ptb_root, level):
    task = ptb(tiny_ptb_root, level=level, bptt=4)
    stream = task.corpus.ids["train"]
    _, y = task.encode(
        (torch.cat([stream[:1], stream])[None],), CPU
    )  # one window: targets = the whole stream
    p = torch.bincount(stream, minlength=task.output_dim).float() / len(stream)
    logits = p.log().expand(y.shape[0], 1, -1)
    assert task.loss(logits, y).item() == pytest.approx(task.baseline_loss, rel=1e-5)


def test_ptb_metric_is_bits_per_token(tiny_ptb_root):
    task = ptb(tiny_ptb_root, bptt=5)
    _x, y = task.encode(task.val_split().tensors, CPU)
    uniform = torch.zeros(*y.shape, task.output_dim)
    assert task.metric_sum(uniform, y) / y.shape[1] == pytest.approx(math.log2(task.output_dim))


def test_ptb_trains_through_the_embedding(tiny_ptb_root):
    params = {"root": str(tiny_ptb_root), "bptt": 5, "embed_dim": 4}
    r = train({"task": "ptb", "hidden": 6, "steps": 2, "batch_size": 4, "task_params": params})
    assert r.status == "done" and r.final_metric == pytest.approx(r.final_val_loss / math.log(2), rel=1e-5)


def test_ptb_missing_files_name_the_folder_and_the_files(tmp_path):
    for level in ("word", "char"):
        with pytest.raises(FileNotFoundError) as err:
            _ = ptb(tmp_path, level=level).input_vocab
        message = str(err.value)
        assert str(tmp_path / "ptb") in message and "simple-examples" in message
        assert all(name in message for name in FILES[level].values())


def test_ptb_validation_token_outside_the_vocabulary_is_an_error(tmp_path):
    (tmp_path / "ptb").mkdir()
    for role, text in (("train", " a b \n"), ("valid", " a c \n"), ("test", " a \n")):
        (tmp_path / "ptb" / FILES["word"][role]).write_text(text)
    with pytest.raises(ValueError, match="'c'"):
        load_ptb(str(tmp_path), "word")


@pytest.mark.parametrize("name", NEW)
def test_trains_through_the_loop(name, tiny_task_params):
    r = train({"task": name, "hidden": 6, "steps": 2, "batch_size": 4, "task_params": tiny_task_params[name]})
    assert r.status == "done", r.reason
    assert r.steps == 2 and math.isfinite(r.final_val_loss) and r.final_metric is not None
