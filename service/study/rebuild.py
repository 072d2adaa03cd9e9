"""A study's MLflow runs made whole from the ledger, the source of truth: at the end of each run
(`finish_in_mlflow`) and whenever MLflow lost writes to an outage (`Engine.sync_tracking`, the
server's repair loop). Every finished trial gets one complete child run, the parent run the summary,
figures and final status; with MLflow down nothing is written, and the study says so
(`tracking_error`) until a rebuild succeeds."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from service.core.states import FINISHED
from service.reports.study_summary import summarise
from service.store.ledger import Ledger
from service.study.recorder import run_id_setter
from service.tracking.child_run import is_complete
from service.tracking.context import StudyContext
from service.tracking.server import server_healthy
from service.tracking.tracker import Tracker

log = logging.getLogger(__name__)


def finish_in_mlflow(
    ledger: Ledger,
    study_id: str,
    tracker: Tracker,
    mlflow: StudyContext,
    state: str,
    marks: list[float],
) -> tuple[dict[str, Any], list[str]]:
    """The end of a run, in MLflow: every finished trial's child run complete and once, then the
    summary, figures and final status on the parent run. (summary, MLflow errors). With MLflow
    down, nothing is written (the study ends now; the runs are rebuilt when it answers). `marks`
    gets the time after each phase (`Engine.run_study`'s RUN_PHASES)."""
    study = ledger.study(study_id)
    if tracker.uri.startswith("http") and not server_healthy(tracker.uri):
        marks.extend([time.perf_counter()] * 3)
        down = f"MLflow at {tracker.uri} did not answer at the end of the study"
        return {**summarise(ledger, study), "state": state}, tracker.abandon(down)
    unreconciled = []
    try:
        reconcile_children(ledger, study_id, tracker, mlflow)
    except Exception as exc:  # MLflow unreachable: recorded, repaired by a later sync
        log.warning("study %s: MLflow child runs not reconciled: %s", study_id, exc)
        unreconciled.append(f"{type(exc).__name__}: {exc}")
    marks.append(time.perf_counter())
    trials = ledger.trials(study_id)  # once: the summary and the figures read the same rows
    # the state it ends in (the ledger's row says so only once this has written: summary.json said
    # "running" for every study)
    summary = {**summarise(ledger, study, trials=trials), "state": state}
    try:
        from service.reports.plots import study_figures

        figures = study_figures(trials, summary, mlflow.criterion)
    except Exception as exc:  # a plot never fails a finished study
        log.warning("study %s: plots failed: %s", study_id, exc)
        figures = {}
    marks.append(time.perf_counter())
    tracker.log_summary(mlflow.parent_run_id, summary, figures, "FINISHED" if state == "done" else "KILLED")
    errors = unreconciled + list(tracker.flush())
    marks.append(time.perf_counter())
    tracker.close()
    return summary, errors


def reconcile_children(ledger: Ledger, study_id: str, tracker: Tracker, mlflow: StudyContext) -> None:
    """Every finished trial gets one complete child run (reused trials included): a run whose status
    or `memsweep.status` is not its trial's in the ledger now (one an outage left incomplete, or a
    cancelled run's of a trial that took another study's result since) is made again, and a child run
    no trial owns is deleted."""
    tracker.flush()  # child runs still queued have not recorded their run id yet
    children = tracker.child_statuses(mlflow.experiment_id, mlflow.parent_run_id)
    owned = set()
    for t in ledger.trials(study_id, FINISHED):
        run = children.get(t.mlflow_run_id) if t.mlflow_run_id else None
        if run is not None and is_complete(t, *run):
            owned.add(t.mlflow_run_id)
            continue
        # made whole again; the run it had, if any, is deleted then (`Tracker.log_trial`)
        tracker.log_trial(mlflow, t, ledger.matrices(t.id), run_id_setter(ledger, t.id))
    tracker.flush()
    owned |= {t.mlflow_run_id for t in ledger.trials(study_id) if t.mlflow_run_id}
    for run_id in set(children) - owned:  # a duplicate, or one whose ledger write was lost
        tracker.delete_run(run_id)


def tracking_error(study_id: str, errors: Sequence[str]) -> str | None:
    """The study's note about MLflow writes that failed (None when none did): the ledger holds every
    result, and a sync rebuilds the runs from it."""
    if not errors:
        return None
    return (
        f"MLflow: {len(errors)} writes failed ({errors[0][:300]}); the ledger has every result — "
        f"`memsweep sync {study_id}` (or the server, once MLflow answers) rebuilds the runs"
    )
