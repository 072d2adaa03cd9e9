"""The reproductions' readings of a sweep (reproductions/emami2019.py): the tables and the paper's claims
checked against them, on trial records built by hand so that each reading has one right answer."""

from __future__ import annotations

import math
from typing import Any

import pytest

from reproductions import emami2019 as em
from reproductions.studies import budget_marks, failed_lines


def record(
    model: str, hidden: int, teacher: int, r2: float | None, *, history: list[float] | None = None
) -> dict[str, Any]:
    status = "failed" if r2 is None else "done"
    return {
        "model": model,
        "params": {"hidden": hidden, "teacher_seed": teacher},
        "config": {},
        "status": status,
        "reason": "loss is not finite" if r2 is None else None,
        "final_val_loss": None,
        "final_metric": r2,
        "metric_name": "r2",
        "baseline_loss": 1.0,
        "steps": 700,
        "history": [
            {"step": 70 * (i + 1), "epoch": i + 1.0, "metric": v} for i, v in enumerate(history or [])
        ],
    }


def test_r2_by_size_means_over_teachers_and_leaves_out_failed_trials() -> None:
    rows = [
        record("rnn", 4, 1, 0.90),
        record("rnn", 4, 2, 0.94),
        record("rnn", 4, 3, None),
        record("urnn", 8, 1, 0.97),
    ]
    r2 = em.kept_means(em.r2_by_size(rows))
    assert r2["rnn"][4].mean == pytest.approx(0.92)
    assert r2["rnn"][4].n == 2
    assert r2["rnn"][4].sem == pytest.approx(math.sqrt(0.02**2 * 2) / math.sqrt(2))  # stdev(0.90, 0.94) / √2
    assert r2["urnn"][8].sem is None  # one teacher: no error to state
    assert r2["urnn"][8].text() == "0.9700"
    assert em.r2_by_size(rows)["rnn"][4].text() == "0.9200 ± 0.0200 (2 of 3; 1 failed)"


def test_near_optimal_lists_each_size_within_reach_of_the_optimum() -> None:
    means = {n: em.Mean(v, None, 1) for n, v in {2: 0.80, 4: 0.985, 6: 0.95, 8: 0.982, 10: 0.99}.items()}
    assert em.near_optimal(means, 0.99, near=0.01) == [4, 8, 10]
    assert em.near_optimal(means, 0.999, near=0.01) == [10]
    assert em.near_optimal({2: em.Mean(0.5, None, 1)}, 0.99) == []


def test_a_cell_leaves_out_of_its_mean_the_runs_no_better_than_the_memoryless_predictor() -> None:
    """A diverged run that ends finite sits at R² −10²⁷: in the mean it is the whole mean."""
    rows = [record("rnn", 8, 1, 0.98), record("rnn", 8, 2, -3.5e26), record("rnn", 8, 3, None)]
    cell = em.r2_by_size(rows)["rnn"][8]
    assert cell.kept is not None and cell.kept.mean == 0.98 and (cell.below, cell.failed) == (1, 1)
    assert cell.text() == "0.9800 (1 of 3; 1 failed, 1 at R² ≤ 0)"
    assert em.r2_by_size([record("rnn", 2, 1, None)])["rnn"][2].text() == "– (0 of 1; 1 failed)"


def test_doubling_gaps_pair_urnn_at_2n_with_rnn_at_n() -> None:
    r2 = {
        "rnn": {2: em.Mean(0.80, 0.03, 3), 4: em.Mean(0.95, 0.04, 3), 8: em.Mean(0.98, None, 1)},
        "urnn": {4: em.Mean(0.82, 0.04, 3), 8: em.Mean(0.90, None, 1), 14: em.Mean(0.97, 0.01, 3)},
    }
    gaps = em.doubling_gaps(r2)
    assert [n for n, _, _ in gaps] == [2, 4]  # no URNN of 16 states was run
    assert gaps[0][1] == pytest.approx(0.02)
    assert gaps[0][2] == pytest.approx(0.05)  # √(0.03² + 0.04²)
    assert gaps[1][2] is None


def test_r2_against_budget_reads_each_trials_history_at_the_shared_steps() -> None:
    rows = [
        record("rnn", 4, 1, 0.9, history=[0.1, 0.5, 0.9]),
        record("rnn", 4, 2, 0.7, history=[0.3, 0.5, 0.7, 0.8]),  # one evaluation more than the other
    ]
    steps = em.evaluation_steps(rows)
    assert steps == [70, 140, 210]
    at = em.r2_at(rows, steps)
    assert at[("rnn", 4)][70].kept.mean == pytest.approx(0.2)
    assert at[("rnn", 4)][210].kept.mean == pytest.approx(0.8)
    # a run that failed after its first evaluation: counted there, and as failed after
    at = em.r2_at([*rows, record("rnn", 4, 3, None, history=[0.4])], steps)
    assert at[("rnn", 4)][70].kept.n == 3 and at[("rnn", 4)][70].failed == 0
    assert at[("rnn", 4)][140].text() == "0.5000 ± 0.0000 (2 of 3; 1 failed)"


def test_report_states_each_claim_beside_the_run() -> None:
    shortfall = {"rnn": (0.2, 0.0), "urnn": (0.5, 0.0), "lstm": (0.5, 0.01)}  # R² = 0.99 − a/n + b + t/1000
    rows = [
        record(model, n, t, 0.99 - a / n + b + 0.001 * t, history=[0.5, 0.9])
        for model, (a, b) in shortfall.items()
        for n in (2, 4, 8)
        for t in (1, 2)
    ] + [record("lstm", 8, 3, None)]
    part = {
        "records": rows,
        "spec": {"base": {"epochs": 2}, "dims": {"teacher_seed": [1, 2, 3]}},
        "trials": len(rows),
        "seconds": 60.0,
        "summary": {"trainer_version": "10"},
        "numerics": {"modes": ["portable"], "machines": ["a CPU"]},
        "failed": [r for r in rows if r["status"] == "failed"],
        "mlflow_url": "http://127.0.0.1:5005/#/x",
    }
    run = {"figure": 2, "command": "python reproductions/emami2019.py", "seconds": 120.0, "cores": 2}
    text = em.report({"parts": {"fig2": part}, "optimal_r2": {1: 0.99, 2: 0.99}, "run": run}, None)
    assert "Command: `python reproductions/emami2019.py` — 2 min on a machine of 2 cores (CPU)" in text
    assert "| 2 | 0.8915 ± 0.0005 | 0.7415 ± 0.0005 | 0.7515 ± 0.0005 |" in text
    # the RNN at n = 8: 0.99 − 0.025 + 0.0015 = 0.9665, more than 0.01 below the optimum
    assert "within 0.01 of the optimum at no n run (of n = 2, 4, 8)" in text
    assert "n = 2: -0.0250 ± 0.0007; n = 4: -0.0125 ± 0.0007." in text  # URNN(4) − RNN(2), URNN(8) − RNN(4)
    assert "R²(LSTM) − R²(URNN) over n = 2…8: +0.0100 to +0.0100" in text
    assert "Failed: 1 of 19 (left out of the means above, counted in their cells)" in text
    assert "| 8 | 0.9665 ± 0.0005 | 0.9290 ± 0.0005 | 0.9390 ± 0.0005 (2 of 3; 1 failed) |" in text
    assert "Runs at R² ≤ 0 or failed: rnn 0 of 6, urnn 0 of 6, lstm 1 of 7." in text
    assert "| student | n | epoch 1 | epoch 2 |" in text
    assert "| rnn | 2 | 0.5000 ± 0.0000 | 0.9000 ± 0.0000 |" in text


def test_shared_report_helpers() -> None:
    assert budget_marks([70, 140, 210, 280, 350, 420]) == [140, 280, 420]
    assert budget_marks([70]) == [70]
    assert failed_lines([], 3, "why") == []
    lines = failed_lines(
        [{"model": "rnn", "params": {"hidden": 2}, "reason": "NaN"}], 3, "counted as failures"
    )
    assert lines[1] == "Failed: 1 of 3 (counted as failures):"
    assert lines[3] == "- rnn hidden=2: NaN"
