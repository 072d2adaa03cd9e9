"""A training trial's live child run against a real MLflow server, over many reports: each point written
about once, and none lost or doubled when a write's answer is lost (`service.tracking.live`)."""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Any

import trainers
from service.study.recorder import StudyRecorder
from service.tracking.context import StudyContext
from service.tracking.tracker import Tracker
from tests.service.test_tracking import two_trials
from trainers import Criterion

N = 120  # reports of one trial


def test_a_live_run_gets_each_point_once_though_a_writes_answer_is_lost(
    tmp_path: Path, mlflow_uri: str
) -> None:
    """Each report brings the trial's whole history (`StudyRecorder.evaluated`); its live run gets only
    the new point, so N reports write O(N) points. A live write whose batch landed but whose answer was
    lost (MLflow restarting after its commit, a timeout) is sent again: stamped again, its points were
    kept twice, and the UI drew them twice."""
    ledger, (trial, _) = two_trials(tmp_path)
    tracker = Tracker(mlflow_uri, "live-tests", live_interval=0.2)
    sent: collections.Counter[tuple[str, int]] = collections.Counter()
    lost: list[int] = []
    real = tracker.client.log_batch

    def answer_lost_once(run_id: str, metrics: Any = (), params: Any = (), tags: Any = ()) -> None:
        real(run_id, metrics=metrics, params=params, tags=tags)
        sent.update((m.key, m.step) for m in metrics)
        if metrics and not lost and run_id != parent:
            lost.append(len(metrics))
            raise ConnectionError("the answer was lost: MLflow restarted after its commit")

    tracker.client.log_batch = answer_lost_once  # type: ignore[method-assign]
    exp_id, parent = tracker.start_study(trial.study_id, "s", {}, None)
    recorder = StudyRecorder(ledger, tracker, trial.study_id, StudyContext(exp_id, parent, Criterion()))
    ledger.start_trial(trial.study_id, trial.config_hash)
    run_ids: list[str] = []
    tracker.trial_started(recorder.mlflow, ledger.trial(trial.id), run_ids.append)
    history: list[trainers.Evaluation] = []
    try:
        for step in range(1, N + 1):
            history.append(
                trainers.Evaluation(step * 300, step / 10, 1.0 / step, 0.5 / step, None, step * 0.1)
            )
            recorder.evaluated(trial.id, trial.config_hash, list(history))
            time.sleep(0.01)  # several live writes over the trial, the lost one among them
        deadline = time.monotonic() + 30
        while not lost and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lost, "no live write went out"
        result = trainers.TrialResult(
            final_val_loss=0.5 / N, steps=N * 300, budget_steps=N * 300, history=list(history)
        )
        row = ledger.finish_trial(trial.id, result)
        tracker.log_trial(recorder.mlflow, row, None, run_ids.append)
        assert len(tracker.flush()) == 1  # the lost answer's
    finally:
        tracker.close()
    (run_id,) = set(run_ids)
    curve = {key: tracker.client.get_metric_history(run_id, key) for key in ("val_loss", "train_loss")}
    ledger_curve = {
        "val_loss": [(e["step"], e["val_loss"]) for e in ledger.trial(trial.id).history],
        "train_loss": [(e["step"], e["train_loss"]) for e in ledger.trial(trial.id).history],
    }
    for key, points in curve.items():
        assert sorted((m.step, m.value) for m in points) == ledger_curve[key]  # each once, none lost
    curve_sent = sum(n for (key, _), n in sent.items() if key in curve)
    assert curve_sent == 2 * N + lost[0]  # O(N): each point once, the lost batch's twice
