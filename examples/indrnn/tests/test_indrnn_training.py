"""The cell learns memsweep's addition task (short sequences: one IndRNN layer learns it only in part,
the module docstring says why) below the random baseline, by a margin far beyond rounding."""

from __future__ import annotations

import pytest
from trainers import train

pytestmark = pytest.mark.numerics


def test_learns_the_addition_task_below_the_baseline() -> None:
    """T = 6, 300 Adam steps: the validation MSE ends near 0.11-0.12 (seeds 1-5), against the baseline
    1/6 ≈ 0.167; the test asks for 0.8 of the baseline, 0.133. (A predictor that sees only the last
    input reaches 5/36 ≈ 0.139 here: passing also shows the network holds something over time.)"""
    T = 6
    result = train(
        {
            "task": "addition",
            "cell": "indrnn",
            "hidden": 16,
            "steps": 300,
            "eval_every": 100,
            "early_stop_loss": None,
            "optimizer": "adam",
            "lr": 1e-2,
            "batch_size": 32,
            "task_params": {"seq_len": T, "n_train": 2000, "n_val": 500},
            "cell_params": {"T": T},
        }
    )
    assert result.status == "done", result.reason
    assert result.baseline_loss is not None and result.baseline_loss == pytest.approx(1 / 6)
    assert result.history[-1].val_loss < 0.8 * result.baseline_loss
