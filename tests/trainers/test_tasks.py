"""Task layouts and random baselines, checked against each task's own loss function."""

import math

import pytest
import torch
import torch.nn.functional as F

from trainers import HALF_BASELINE
from trainers.tasks import get_task, list_tasks
from trainers.tasks.addition import AdditionConfig, AdditionTask
from trainers.tasks.base import binary_cross_entropy, cross_entropy
from trainers.tasks.copy import CopyConfig, CopyTask

CPU = torch.device("cpu")


def test_copy_total_layout_is_orhans():
    task = CopyTask(CopyConfig(seq_len=50, n_train=4, n_val=4), seed=1)
    (data,) = task.sample(3, torch.Generator().manual_seed(0))
    x, y = task.encode((data,), CPU)
    assert x.shape == (50, 3, 10) and y.shape == (50, 3)
    symbols = x.argmax(-1)  # [L, B]
    assert torch.equal(symbols[:10], data.long().T)
    assert (symbols[:10] >= 1).all() and (symbols[:10] <= 8).all()
    assert (symbols[50 - 11] == 9).all()  # marker one step before the recall
    assert (symbols[10 : 50 - 11] == 0).all() and (symbols[50 - 10 :] == 0).all()
    assert torch.equal(y[-10:], data.long().T) and (y[:-10] == 0).all()


@pytest.mark.parametrize("layout,T,total", [("total", 500, 500), ("delay", 100, 120), ("delay", 500, 520)])
def test_copy_baseline_is_10_ln8_over_total_length(layout, T, total):
    task = CopyTask(CopyConfig(seq_len=T, layout=layout), seed=1)
    assert task.seq_len == total
    assert task.baseline_loss == pytest.approx(10 * math.log(8) / total)


def test_orhan_copy_500_numbers():
    task = CopyTask(CopyConfig(), seed=1)
    assert task.baseline_loss == pytest.approx(0.041589, abs=1e-6)
    assert HALF_BASELINE.threshold_for(task.baseline_loss, task.reference_baselines) == pytest.approx(
        0.020794, abs=1e-6
    )
    assert task.reference_baselines == {"arjovsky": pytest.approx(10 * math.log(8) / 520)}  # Orhan App. C's


def test_copy_baseline_equals_the_loss_of_the_memoryless_predictor():
    task = CopyTask(CopyConfig(seq_len=40, layout="delay"), seed=1)
    _x, y = task.encode(task.sample(8, torch.Generator().manual_seed(0)), CPU)
    logits = torch.full((task.seq_len, 8, 9), -1e9)
    logits[:-10, :, 0] = 0.0  # certain blank before the recall
    logits[-10:, :, 1:] = 0.0  # uniform over the 8 symbols during the recall
    assert task.loss(logits, y).item() == pytest.approx(task.baseline_loss, rel=1e-6)


def test_copy_reads_out_ten_classes_as_srnns_code_does():
    """SRNN's code reads every cell out through `Linear(hidden, 10)`: the marker's class is in the
    softmax's sum, never a target. `classes=10` adds it (the SRNN preset sets it); targets, baseline and
    the memoryless predictor's loss stay, a uniform readout costs ln 10 a step instead of ln 9."""
    nine = CopyTask(CopyConfig(seq_len=40, layout="delay", prob_clip=None), seed=1)
    ten = CopyTask(CopyConfig(seq_len=40, layout="delay", prob_clip=None, classes=10), seed=1)
    assert (nine.output_dim, ten.output_dim) == (9, 10) and ten.baseline_loss == nine.baseline_loss
    _x, y = ten.encode(ten.sample(8, torch.Generator().manual_seed(0)), CPU)
    for task in (nine, ten):
        uniform = torch.zeros(task.seq_len, 8, task.output_dim)
        assert task.loss(uniform, y).item() == pytest.approx(math.log(task.output_dim), rel=1e-6)
        memoryless = torch.full((task.seq_len, 8, task.output_dim), -1e9)
        memoryless[:-10, :, 0] = 0.0
        memoryless[-10:, :, 1:9] = 0.0
        assert task.loss(memoryless, y).item() == pytest.approx(task.baseline_loss, rel=1e-6)


def test_copy_embedded_inputs_are_the_symbols_ids_as_srnns_code_feeds_them():
    """`embed_dim` d: the symbols' ids, which the model embeds into d (SRNN's code: nn.Embedding(10, d)
    before every cell), where the default feeds their one-hot vectors; the targets do not change."""
    one_hot = CopyTask(CopyConfig(seq_len=40, layout="delay"), seed=1)
    ids = CopyTask(CopyConfig(seq_len=40, layout="delay", embed_dim=8), seed=1)
    batch = one_hot.sample(6, torch.Generator().manual_seed(0))
    (x1, y1), (x2, y2) = one_hot.encode(batch, CPU), ids.encode(batch, CPU)
    assert x2.dtype == torch.long and x2.shape == (60, 6) and torch.equal(x1.argmax(-1), x2)
    assert torch.equal(y1, y2)
    assert (one_hot.input_vocab, one_hot.input_dim) == (None, 10) and (ids.input_vocab, ids.input_dim) == (
        10,
        8,
    )
    with pytest.raises(ValueError, match="embed_dim = 0 must be at least 1"):
        CopyTask(CopyConfig(seq_len=40, layout="delay", embed_dim=0), seed=1)


def test_an_embedded_copy_trains_alone_and_a_one_hot_copy_fuses():
    """A fused bundle has no embedding: a copy trial with `embed_dim` is no bundle's member (it trains
    alone, as PTB's do), while one-hot copy (Orhan's) still fuses."""
    from trainers import resolve
    from trainers.fused import fusable_key

    copy = {"task": "copy", "task_params": {"seq_len": 30, "n_train": 32, "n_val": 16}}
    assert fusable_key(resolve(copy)) is not None
    embedded = resolve({**copy, "task_params": {**copy["task_params"], "embed_dim": 8}})
    assert fusable_key(embedded) is None


def test_srnns_copy_model_has_the_parameters_of_srnns_code():
    """SRNN's copy model in their code (`models/SRNN.py`, `main.py` at the preset's settings, hidden 128,
    hyper_size 8, one layer, gated): Embedding(10, 8), f_r = Linear(8, 8) → ReLU → Linear(8, 128), the gate
    Linear(8, 128), end_fc Linear(128, 10)."""
    from search_spaces.srnn2020 import COPY
    from tests.trainers.test_keras_transcription import preset_trial
    from trainers import resolve
    from trainers.model import build_model, count_params

    theirs = 10 * 8 + (8 * 8 + 8) + (8 * 128 + 128) + (8 * 128 + 128) + (128 * 10 + 10)
    resolved = resolve(preset_trial(COPY, "srnn", seq_len=100, n_train=40, n_val=20))
    model = build_model(resolved, resolved.make_task())
    assert model.embedding is not None and tuple(model.embedding.weight.shape) == (10, 8)
    assert count_params(model) == theirs == 3_746


@pytest.mark.parametrize("channels", ["mask_first", "value_first"])
def test_addition_channels_positions_and_target(channels):
    task = AdditionTask(AdditionConfig(seq_len=20, channels=channels), seed=1)
    x, y = task.encode(task.sample(200, torch.Generator().manual_seed(0)), CPU)
    assert x.shape == (20, 200, 2) and y.shape == (200, 1)
    mask, value = (x[..., 0], x[..., 1]) if channels == "mask_first" else (x[..., 1], x[..., 0])
    assert torch.equal(mask.sum(0), torch.full((200,), 2.0))
    first, second = mask[:10].argmax(0), mask[10:].argmax(0) + 10
    assert (mask[:10].sum(0) == 1).all() and (mask[10:].sum(0) == 1).all()
    expected = value.gather(0, first[None]) + value.gather(0, second[None])
    assert torch.allclose(y.squeeze(1), expected.squeeze(0))


def test_addition_baseline_is_the_variance_of_the_sum():
    task = AdditionTask(AdditionConfig(seq_len=10), seed=1)
    assert task.baseline_loss == pytest.approx(1 / 6)
    _, y = task.encode(task.sample(200_000, torch.Generator().manual_seed(0)), CPU)
    assert task.loss(torch.ones_like(y), y).item() == pytest.approx(1 / 6, rel=0.01)


def test_psmnist_baseline_is_ln_10(tiny_task_params):
    task = get_task("psmnist")(get_task("psmnist").Config(**tiny_task_params["psmnist"]), seed=1)
    assert task.baseline_loss == pytest.approx(math.log(10))


@pytest.mark.parametrize("name", list_tasks())
def test_fixed_splits_are_a_function_of_the_seed(name, tiny_task_params):
    cls = get_task(name)
    a = cls(cls.Config(**tiny_task_params[name]), seed=3)
    b = cls(cls.Config(**tiny_task_params[name]), seed=3)
    x1, y1 = a.encode(a.val_split().take(slice(0, 8)), CPU)
    x2, y2 = b.encode(b.val_split().take(slice(0, 8)), CPU)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert x1.shape[0] == a.seq_len
    assert x1.dim() == 2 if a.input_vocab is not None else x1.shape[2] == a.input_dim  # token ids or vectors


@pytest.mark.parametrize("classes", [9, 50])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_without_a_clip_is_torchs_over_every_step(classes, reduction):
    g = torch.Generator().manual_seed(classes)
    out = torch.randn(7, 5, classes, generator=g, dtype=torch.double, requires_grad=True)
    y = torch.randint(0, classes, (7, 5), generator=g)
    y[0, :2] = -100  # ignored steps (varcopy's padding)
    ours = cross_entropy(out, y, ignore_index=-100, reduction=reduction)
    ref = F.cross_entropy(out.reshape(-1, classes), y.reshape(-1), ignore_index=-100, reduction=reduction)
    assert ours.shape == (() if reduction == "mean" else y.shape)
    assert torch.allclose(ours.reshape(-1), ref.reshape(-1), rtol=1e-12, atol=1e-12)
    (g_ours,) = torch.autograd.grad(ours.sum(), out)
    (g_ref,) = torch.autograd.grad(ref.sum(), out)
    assert torch.allclose(g_ours, g_ref, rtol=1e-12, atol=1e-12)


# ----- Keras 2's losses, where the authors used Keras (docs/protocol.md §1.6) ----------------------------
def keras_categorical_crossentropy(target, output):
    """Keras 2.2.4's TensorFlow backend, `categorical_crossentropy(target, output, from_logits=False)`,
    transcribed line by line: output /= reduce_sum(output); clip_by_value(output, ε, 1 − ε) (no gradient
    outside); −reduce_sum(target · log(output)). `output` is the model's softmax output."""
    output = output / output.sum(-1, keepdim=True)
    output = torch.clamp(output, 1e-7, 1.0 - 1e-7)
    return -(target * torch.log(output)).sum(-1)


def keras_binary_crossentropy(target, output):
    """Keras 2.2.4's TensorFlow backend, `binary_crossentropy(target, output, from_logits=False)`:
    clip the sigmoid output, back to a logit, then sigmoid cross-entropy with logits."""
    output = torch.clamp(output, 1e-7, 1.0 - 1e-7)
    logits = torch.log(output / (1 - output))
    return torch.clamp(logits, min=0) - logits * target + torch.log1p(torch.exp(-logits.abs()))


# copy's steps, psMNIST's last step, many classes
@pytest.mark.parametrize("shape", [(7, 5, 9), (6, 10), (4, 3, 50)])
def test_the_clipped_cross_entropy_is_keras_formula_in_value_and_gradient(shape):
    g = torch.Generator().manual_seed(sum(shape))
    out = (6 * torch.randn(*shape, generator=g, dtype=torch.double)).requires_grad_()
    out.data.view(-1, shape[-1])[0] = torch.tensor([40.0] + [0.0] * (shape[-1] - 1))  # saturated: p_y ≈ 1
    y = torch.randint(0, shape[-1], shape[:-1], generator=g)
    y.view(-1)[0] = 0
    ours = cross_entropy(out, y, prob_clip=1e-7, reduction="none")
    ref = keras_categorical_crossentropy(F.one_hot(y, shape[-1]).double(), torch.softmax(out, -1))
    assert ours.shape == y.shape and torch.allclose(ours, ref, rtol=1e-12, atol=1e-12)
    (g_ours,) = torch.autograd.grad(ours.sum(), out)
    (g_ref,) = torch.autograd.grad(ref.sum(), out)
    assert torch.allclose(g_ours, g_ref, rtol=1e-10, atol=1e-12)
    mean = cross_entropy(out, y, prob_clip=1e-7)
    assert torch.allclose(mean, ref.mean(), rtol=1e-12)  # Keras averages over every step and example
    assert ours.view(-1)[0].item() == pytest.approx(-math.log(1 - 1e-7))  # the upper clip: a floor of ~1e-7


def test_past_the_clip_a_step_costs_16_12_nats_and_gets_no_gradient():
    out = torch.zeros(3, 2, 9, dtype=torch.float32)
    out[..., 1] = 60.0  # every step predicts class 1 with p ≈ 1; the targets say class 0: p_y ≈ e^-60
    out.requires_grad_()
    y = torch.zeros(3, 2, dtype=torch.long)
    loss = cross_entropy(out, y, prob_clip=1e-7)
    assert loss.item() == pytest.approx(-math.log(1e-7), rel=1e-6) and loss.item() < 16.12  # the cap
    (grad,) = torch.autograd.grad(loss, out)
    assert torch.count_nonzero(grad) == 0  # tf.clip_by_value passes no gradient outside [ε, 1 − ε]
    unclipped = cross_entropy(out, y)
    assert unclipped.item() == pytest.approx(60.0, rel=1e-4)  # log-softmax: 60 nats and a full gradient
    assert torch.count_nonzero(torch.autograd.grad(unclipped, out)[0]) > 0


def test_the_clipped_binary_cross_entropy_is_keras_formula():
    g = torch.Generator().manual_seed(0)
    out = (8 * torch.randn(12, 1, generator=g, dtype=torch.double)).requires_grad_()
    out.data[0] = 40.0  # saturated
    y = (torch.rand(12, 1, generator=g) < 0.5).double()
    y[0] = 0.0
    ours = binary_cross_entropy(out, y, prob_clip=1e-7)
    ref = keras_binary_crossentropy(y, torch.sigmoid(out)).mean()
    assert torch.allclose(ours, ref, rtol=1e-12)
    assert torch.allclose(
        torch.autograd.grad(ours, out)[0], torch.autograd.grad(ref, out)[0], rtol=1e-10, atol=1e-14
    )
    assert torch.autograd.grad(binary_cross_entropy(out, y, 1e-7), out)[0][0] == 0  # past the clip
    assert torch.allclose(binary_cross_entropy(out, y), F.binary_cross_entropy_with_logits(out, y))


def test_orhans_tasks_use_keras_loss_by_default_and_the_pytorch_papers_tasks_do_not():
    # HAR-2's Keras 2.3.1 on TF 1.15 took the sigmoid's logits: no clip (docs/protocol.md §5)
    keras = {"copy": 1e-7, "psmnist": 1e-7, "smnist": 1e-7}
    for name in ("copy", "psmnist", "smnist", "har2", "varcopy", "denoise", "bigpsmnist", "ptb"):
        assert get_task(name).Config().prob_clip == keras.get(name), name


@pytest.mark.parametrize("name", list_tasks())
def test_every_task_declares_the_reference_baselines_it_reports(name, tiny_task_params):
    """A study's criteria are checked at the door against `reference_baseline_names` (no task built
    there): the names must be those `reference_baselines` reports once the task is built."""
    cls = get_task(name)
    task = cls(cls.Config(**tiny_task_params[name]), seed=1)
    assert set(task.reference_baselines) == set(cls.reference_baseline_names)
