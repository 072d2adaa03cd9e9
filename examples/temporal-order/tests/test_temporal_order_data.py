"""The data against §5.6: the layout of every sequence, its class, the balance of classes, the seeding,
the config's checks and the random baseline."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from trainers import ConfigError, resolve
from trainers.plugins import installed
from trainers.tasks import get_task, list_tasks

from memsweep_temporal_order import TemporalOrderTask
from memsweep_temporal_order.task import IGNORE, PAD, START, SYMBOLS, TRIGGER, X

CPU = torch.device("cpu")


def make(seed: int = 1, **params: Any) -> TemporalOrderTask:
    task = resolve({"task": "temporal-order", "seed": seed, "task_params": params}).make_task()
    assert isinstance(task, TemporalOrderTask)
    return task


def text(symbols: torch.Tensor) -> str:
    return "".join(SYMBOLS[s] if s < PAD else "_" for s in symbols.tolist())


def test_the_entry_point_registers_the_task() -> None:
    plugin = {(p.kind, p.name): p for p in installed()}[("task", "temporal-order")]
    assert (
        plugin.problem is None
        and plugin.distribution == "memsweep-temporal-order"
        and plugin.version == "0.1.0"
    )
    assert "temporal-order" in list_tasks() and get_task("temporal-order") is TemporalOrderTask


@pytest.mark.parametrize(
    ("variant", "windows"),
    [("6a", [(10, 20), (50, 60)]), ("6b", [(10, 20), (33, 43), (66, 76)])],
)
def test_every_sequence_has_the_papers_layout(variant: str, windows: list[tuple[int, int]]) -> None:
    """E first, B last (the trigger), X/Y only inside their windows (1-based), a-d elsewhere, padding after
    the end; L, every t_i and every class take each of their values."""
    task = make(variant=variant)
    symbols, lengths, classes = task.draw(4000, torch.Generator().manual_seed(0))
    assert set(lengths.tolist()) == set(range(100, 111)) and set(classes.tolist()) == set(
        range(2 ** len(windows))
    )
    seen_positions: list[set[int]] = [set() for _ in windows]
    for row, L, c in zip(symbols, lengths.tolist(), classes.tolist(), strict=True):
        s = text(row)
        assert s[0] == "E" and s[L - 1] == "B" and set(s[L:]) <= {"_"} and len(s) == 110
        relevant = [(i + 1, ch) for i, ch in enumerate(s[:L]) if ch in "XY"]  # 1-based positions
        assert len(relevant) == len(windows)
        for (pos, _), (lo, hi), seen in zip(relevant, windows, seen_positions, strict=True):
            assert lo <= pos <= hi
            seen.add(pos)
        assert set(s[1 : L - 1]) - {"X", "Y"} <= set("abcd")
        order = "".join(ch for _, ch in relevant)
        assert c == int(order.replace("X", "0").replace("Y", "1"), 2)  # XX Q=0, XY R=1, YX S=2, YY U=3
    assert all(seen == set(range(lo, hi + 1)) for seen, (lo, hi) in zip(seen_positions, windows, strict=True))


def test_the_class_is_the_order_of_x_and_y() -> None:
    """The paper's rules: X,X → Q; X,Y → R; Y,X → S; Y,Y → U (classes 0-3), read off the sequences."""
    task = make()
    classes = torch.tensor([0, 1, 2, 3])
    symbols, _, _ = task.draw(4, torch.Generator().manual_seed(5), classes)
    orders = ["".join(ch for ch in text(row) if ch in "XY") for row in symbols]
    assert orders == ["XX", "XY", "YX", "YY"]


def test_encode_one_hot_inputs_and_a_target_only_at_each_last_step() -> None:
    task = make(n_val=64)
    x, y = task.encode(task.val_split().take(slice(0, 64)), CPU)
    symbols, lengths, classes = task.val_split().take(slice(0, 64))
    assert x.shape == (110, 64, 8) and y.shape == (110, 64)  # every batch padded to length_max
    inside = torch.arange(110)[:, None] < lengths[None]  # [T, B]
    assert torch.equal(x.sum(-1), inside.float())  # one unit on at every real step, none on padding
    assert (
        torch.equal(x[0].argmax(-1), torch.full((64,), START))
        and (symbols.long() == x.argmax(-1).T)[inside.T].all()
    )
    assert torch.equal((y != IGNORE).sum(0), torch.ones(64, dtype=torch.long))
    assert torch.equal(y[lengths - 1, torch.arange(64)], classes)
    assert torch.equal(x[lengths - 1, torch.arange(64)].argmax(-1), torch.full((64,), TRIGGER))
    assert SYMBOLS.index("X") == X and PAD == 8


@pytest.mark.parametrize("variant", ["6a", "6b"])
def test_classes_are_balanced(variant: str) -> None:
    """Validation: exactly n_val / C of each class. Training: each class with probability 1/C, each X/Y
    symbol independently (within 5 standard errors on 20,000 sequences)."""
    task = make(variant=variant, data="fixed", n_train=20_000)
    C = task.n_classes
    val_classes = task.val_split().tensors[2]
    assert torch.equal(torch.bincount(val_classes, minlength=C), torch.full((C,), 2560 // C))
    train_classes = task.train_split().tensors[2]
    freq = torch.bincount(train_classes, minlength=C).double() / 20_000
    se = math.sqrt((1 / C) * (1 - 1 / C) / 20_000)
    assert (freq - 1 / C).abs().max() < 5 * se


def test_same_seed_same_data_other_seed_other_data() -> None:
    a, b, c = (
        make(seed=3, data="fixed", n_train=50, n_val=40),
        make(seed=3, data="fixed", n_train=50, n_val=40),
        make(seed=4, data="fixed", n_train=50, n_val=40),
    )
    for split in ("train_split", "val_split"):
        ta, tb, tc = (getattr(t, split)().tensors for t in (a, b, c))
        assert all(torch.equal(p, q) for p, q in zip(ta, tb, strict=True))
        assert not torch.equal(ta[0], tc[0])
    assert not torch.equal(a.train_split().tensors[0][:40], a.val_split().tensors[0])  # streams apart
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    assert all(torch.equal(p, q) for p, q in zip(a.sample(8, g1), a.sample(8, g2), strict=True))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"t3_min": 70}, "t3_min/t3_max are for variant=6b"),
        ({"t2_min": 15}, "window t2"),  # overlaps t1 = [10, 20]
        ({"t1_min": 1}, "window t1"),  # E is element 1
        ({"length_min": 60}, "raise length_min above 60"),  # B could fall inside t2's window
        ({"length_min": 120}, "length_min <= length_max"),
        ({"n_val": 0}, "n_val"),
    ],
)
def test_a_layout_that_cannot_exist_is_refused_where_the_config_resolves(
    params: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        make(**params)


@pytest.mark.parametrize(
    ("variant", "loss", "expected"),
    [
        ("6a", "cross_entropy", math.log(4)),
        ("6b", "cross_entropy", math.log(8)),
        ("6a", "squared_error", 3 / 16),
        ("6b", "squared_error", 7 / 64),
    ],
)
def test_the_baseline_is_the_best_memoryless_predictors_loss(
    variant: str, loss: str, expected: float
) -> None:
    """The baseline, and the validation loss of the best constant output (uniform probabilities: zero
    logits; sigmoid outputs 1/C), on the balanced validation set."""
    task = make(variant=variant, loss=loss, n_val=512)
    assert task.baseline_loss == pytest.approx(expected, rel=1e-12)
    x, y = task.encode(task.val_split().tensors, CPU)
    C = task.n_classes
    constant = torch.full((x.shape[0], x.shape[1], C), 0.0 if loss == "cross_entropy" else -math.log(C - 1))
    assert float(task.loss(constant, y)) == pytest.approx(expected, rel=1e-6)
    other = constant.clone()
    other[..., 0] += 0.1  # any other constant output does worse
    assert float(task.loss(other, y)) > expected
