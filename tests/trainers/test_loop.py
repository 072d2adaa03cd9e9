"""train(config, report): protocol, determinism, budgets, failure handling."""

import math

import pytest
import torch

from trainers import resolve, train
from trainers.tasks.addition import AdditionTask

TINY = {"task": "addition", "hidden": 8, "task_params": {"seq_len": 12, "n_train": 64, "n_val": 32}}


def cfg(**kw):
    return {**TINY, **kw}


def test_same_seed_same_curve_other_seed_other_curve():
    a = train(cfg(steps=12, eval_every=4, lr=1e-3))
    b = train(cfg(steps=12, eval_every=4, lr=1e-3))
    c = train(cfg(steps=12, eval_every=4, lr=1e-3, seed=2))
    assert [e.val_loss for e in a.history] == [e.val_loss for e in b.history]
    assert [e.train_loss for e in a.history] == [e.train_loss for e in b.history]
    assert torch.equal(a.recurrent_matrix, b.recurrent_matrix)
    assert [e.val_loss for e in a.history] != [e.val_loss for e in c.history]


def test_report_gets_every_evaluation_and_the_last_is_at_the_end_of_the_budget():
    seen = []
    r = train(cfg(steps=10, eval_every=4), report=seen.append)
    assert [e.step for e in seen] == [4, 8, 10] == [e.step for e in r.history]
    assert r.final_val_loss == seen[-1].val_loss and r.steps == 10 and r.status == "done"


def test_epoch_budget_and_once_per_epoch_evaluation():
    r = train(cfg(epochs=2, batch_size=16))  # 64 examples / 16 = 4 steps per epoch
    assert r.budget_steps == 8 and [e.step for e in r.history] == [4, 8]
    assert [e.epoch for e in r.history] == [1.0, 2.0]
    config = resolve(cfg(epochs=2, batch_size=16)).to_dict()
    assert config["epochs"] == 2 and config["steps"] is None  # the shortened budget is visible


def test_early_stop_when_validation_loss_is_below_the_threshold():
    r = train(cfg(steps=20, eval_every=2, early_stop_loss=10.0))
    assert r.early_stopped and r.steps == 2 and len(r.history) == 1


def test_success_is_final_loss_below_fraction_of_baseline():
    r = train(cfg(steps=4, eval_every=2, success_fraction=100.0))
    assert r.success and r.success_threshold == pytest.approx(100 / 6)
    r = train(cfg(steps=4, eval_every=2, success_fraction=1e-9))
    assert not r.success and r.status == "done"


def test_divergence_is_a_failed_trial_with_its_reason():
    r = train(cfg(steps=200, eval_every=100, lr=50.0, clip_norm=None))
    assert r.status == "failed" and "diverged" in r.reason and not r.success


def test_nan_loss_is_a_failed_trial(monkeypatch):
    original = AdditionTask.loss
    calls = {"n": 0}

    def loss(self, out, y):
        calls["n"] += 1
        value = original(self, out, y)
        return value * math.nan if calls["n"] == 3 else value

    monkeypatch.setattr(AdditionTask, "loss", loss)
    r = train(cfg(steps=60, eval_every=60))
    assert r.status == "failed" and "nan" in r.reason.lower() and r.steps == 50


def test_an_exception_while_training_is_a_failed_trial(monkeypatch):
    def boom(self, batch, device):
        raise RuntimeError("out of memory (simulated)")

    monkeypatch.setattr(AdditionTask, "encode", boom)
    r = train(cfg(steps=5))
    assert r.status == "failed" and "out of memory (simulated)" in r.reason


def test_returns_the_trained_recurrent_matrix():
    r = train(cfg(steps=3, lr=1e-2, cell_params={"init": "identity"}))
    assert r.recurrent_matrix.shape == (8, 8)
    assert not torch.allclose(r.recurrent_matrix, torch.eye(8))  # it trained


def test_fresh_batches_regime():
    r = train(cfg(steps=6, eval_every=3, task_params={"seq_len": 12, "data": "fresh", "n_val": 16}))
    assert r.status == "done" and len(r.history) == 2


@pytest.mark.slow
def test_chain_rnn_learns_addition_100_below_half_baseline():
    # Orhan's chain initialiser (α = 1, relu, RMSprop, clip 10, batch 16) on addition with T = 100.
    r = train(
        {
            "task": "addition",
            "task_params": {"seq_len": 100, "data": "fresh", "n_val": 1000},
            "cell_params": {"init": "chain", "scale": 1.0},
            "lr": 3e-4,
            "steps": 2500,
            "eval_every": 500,
        }
    )
    assert r.status == "done"
    assert r.final_val_loss < 0.5 * (1 / 6), [e.val_loss for e in r.history]
    assert r.success
