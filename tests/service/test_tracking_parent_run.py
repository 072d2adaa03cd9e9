"""A study's parent run against a real MLflow server: its curve of successes against budget as the UI
draws it, through an extension of the study (`service.tracking.parent_run`)."""

from __future__ import annotations

import contextlib
import csv
import io
from pathlib import Path
from typing import Any

import trainers
from service.core.spec import StudySpec
from service.reports.plots import study_figures
from service.reports.study_summary import summarise
from service.store.ledger import Ledger
from service.study.search import grid_trials
from service.tracking.parent_run import write_summary
from service.tracking.tracker import Tracker
from trainers import Criterion


def spec(seeds: list[int]) -> StudySpec:
    return StudySpec.model_validate(
        {"space": {"dims": {"lr": [1e-3]}}, "base": {"task": "addition", "seq_len": 20}, "seeds": seeds}
    )


def finish_all(ledger: Ledger, study_id: str) -> None:
    """Every unfinished trial done, evaluated at steps 10 and 20; seed 1 succeeds by step 10, seed 2 by 20."""
    for t in ledger.trials(study_id):
        if t.status == "done":
            continue
        late = t.config["seed"] == 2
        history = [
            trainers.Evaluation(10, 1.0, 0.5, 0.5 if late else 0.01, None, 1.0),
            trainers.Evaluation(20, 2.0, 0.5, 0.01, None, 2.0),
        ]
        ledger.start_trial(study_id, t.config_hash)
        ledger.finish_trial(
            t.id, trainers.TrialResult(final_val_loss=0.01, baseline_loss=1 / 6, history=history)
        )


def test_an_extended_studys_curve_is_drawn_once_and_its_table_is_the_current_one(tmp_path: Path, mlflow_uri):
    """The curve was written again after an extension (a seed more) where its counts moved, and MLflow
    keeps and draws every point: its chart held 1 and 2 at step 20. The metric is the study as it first
    ended done, one point a budget; the table and figure follow the extension."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    study = ledger.create_study("extended", spec([1]).model_dump(mode="json"))
    ledger.add_trials(study.id, grid_trials(spec([1]).search_space(), {}))
    finish_all(ledger, study.id)
    tracker = Tracker(mlflow_uri, "parent-run-tests")
    client = tracker.client
    try:
        _, parent = tracker.start_study(study.id, study.name, {}, None)
        first = summarise(ledger, ledger.study(study.id))
        write_summary(client, parent, first, {}, "FINISHED")
        ledger.add_trials(study.id, grid_trials(spec([1, 2]).search_space(), {}))  # the extension
        finish_all(ledger, study.id)
        tracker.start_study(study.id, study.name, {}, parent)
        extended = summarise(ledger, ledger.study(study.id))
        figures = study_figures(ledger.trials(study.id), extended, Criterion())
        write_summary(client, parent, extended, figures, "FINISHED")

        (key,) = [k for k in client.get_run(parent).data.metrics if k.startswith("success_vs_budget.")]
        drawn = sorted((m.step, m.value) for m in client.get_metric_history(parent, key))
        assert drawn == [(10, 1.0), (20, 1.0)]  # one point a budget: the study as it first ended done
        table = client.download_artifacts(parent, "success_vs_budget.csv", str(tmp_path))
        rows = list(csv.DictReader(io.StringIO(Path(table).read_text())))
        plots = {a.path for a in client.list_artifacts(parent, "plots")}
    finally:
        tracker.close()
    ((model, cells),) = extended["success_vs_budget"]["by_model"].items()
    assert (
        [(r["model"], int(r["step"]), int(r["succeeded"]), int(r["finished"])) for r in rows]
        == [(model, c["step"], c["succeeded"], c["finished"]) for c in cells]
        == [(model, 10, 1, 2), (model, 20, 2, 2)]
    )
    assert float(rows[1]["ci95_low"]) == cells[1]["ci95"][0]
    assert "plots/success_vs_budget.png" in plots


class CutOff:
    """A real MLflow client whose `cut`-th LogBatch request fails (the tracking server went away
    mid-write); every other request goes through."""

    def __init__(self, client: Any, cut: int) -> None:
        self.client, self.cut, self.sent = client, cut, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def log_batch(self, *args: Any, **kwargs: Any) -> None:
        self.sent += 1
        if self.sent == self.cut:
            raise ConnectionError("the tracking server went away")
        self.client.log_batch(*args, **kwargs)


def test_a_curve_cut_off_by_a_fault_is_drawn_whole_by_the_next_write(tmp_path: Path, mlflow_uri):
    """A first write of the curve that a fault cut after some of its points (MLflow takes at most 1,000
    metrics a request) left the parent run holding the model's metric, so no later write sent the
    points it lacked, not even a sync's: the UI drew a curve that stopped short of the budget."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    study = ledger.create_study("cut", spec([1, 2]).model_dump(mode="json"))
    ledger.add_trials(study.id, grid_trials(spec([1, 2]).search_space(), {}))
    for t in ledger.trials(study.id):  # evaluated at 1,200 budgets: more points than one request takes
        history = [trainers.Evaluation(10 * s, float(s), 0.5, 0.01, None, float(s)) for s in range(1, 1201)]
        ledger.start_trial(study.id, t.config_hash)
        ledger.finish_trial(
            t.id, trainers.TrialResult(final_val_loss=0.01, baseline_loss=1 / 6, history=history)
        )
    summary = summarise(ledger, ledger.study(study.id))
    ((_, cells),) = summary["success_vs_budget"]["by_model"].items()
    assert len(cells) == 1200
    tracker = Tracker(mlflow_uri, "parent-run-tests")
    try:
        _, parent = tracker.start_study(study.id, study.name, {}, None)
        with contextlib.suppress(ConnectionError):
            write_summary(CutOff(tracker.client, cut=2), parent, summary, {}, "FINISHED")
        write_summary(tracker.client, parent, summary, {}, "FINISHED")  # the write again (a sync)
        (key,) = [
            k for k in tracker.client.get_run(parent).data.metrics if k.startswith("success_vs_budget.")
        ]
        drawn = sorted(m.step for m in tracker.client.get_metric_history(parent, key))
    finally:
        tracker.close()
    assert drawn == [c["step"] for c in cells]  # every budget, each once
