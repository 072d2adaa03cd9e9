"""The one MLflow seam: a study is a parent run, each trial a child run (explicit parent id).

All of a study's MLflow writes go through `Tracker`, on background threads (`pool`), so a slow
tracking server never stalls the engine's event loop: a child run's writes go in order in its own
lane (lanes run in parallel); `flush` waits for all of them, and the parent's summary is written after
the flush. A training trial's child run is live while it trains (`live`). What a run holds is written
by `child_run`, `parent_run` and `comparison`; the local tracking server memsweep starts when none is
configured is `server`'s.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from service.tracking.child_run import STATUS_TAG, ChildRuns, is_missing
from service.tracking.comparison import write_comparison
from service.tracking.context import StudyContext
from service.tracking.live import LiveClock
from service.tracking.parent_run import create_parent, write_progress, write_summary
from service.tracking.pool import WriterPool
from trainers.environ import environ_lock

if TYPE_CHECKING:
    from service.store.models import Trial
    from trainers.result import Evaluation

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"  # without it the MLflow 3 UI opens on a GenAI overview

#: MLflow's HTTP retries for memsweep's writes: 3 tries, 1 s backoff, 30 s a request
MLFLOW_FAIL_FAST = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}


def prepare_mlflow_process() -> None:
    """MLflow's settings for this process, set once at its start by every entry point of a process that
    tracks (`memsweep`'s main, the app), before its first request: MLflow's client reads them from the
    environment at each request and takes them no other way (a `Tracker` sets nothing).

    - MLflow is a projection of the ledger, repaired by a sync: a write to a server that is down fails
      within seconds (`MLFLOW_FAIL_FAST`; MLflow's own client would retry each for about 4 minutes
      and hold a finished study "running" meanwhile). Explicit MLFLOW_HTTP_* settings win.
    - MLflow prints no run's URL on stdout (the CLI's output is memsweep's)."""
    with environ_lock:
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        for name, value in MLFLOW_FAIL_FAST.items():
            os.environ.setdefault(name, value)


def is_server(tracking_uri: str) -> bool:
    """Whether the URI names a tracking server (which keeps the artifacts itself), not a store."""
    return urlsplit(tracking_uri).scheme in ("http", "https", "databricks")


class Tracker:
    """Parent/child runs of studies; writes are queued to a small pool of writer threads.

    Lifecycle: `start_study` (synchronous) gives the ids of a study's `StudyContext`; then, from any
    thread, `trial_started` / `trial_evaluated` / `log_trial` per trial and `study_progress`;
    `flush` whenever the writes so far must have landed; `log_summary` at the end (after a flush);
    then once either `close` (every queued write written) or `abandon` (MLflow is down: none is).
    """

    def __init__(
        self,
        tracking_uri: str,
        experiment: str,
        writers: int = 4,
        live_interval: float = 2.0,
        artifacts: Path | None = None,
    ) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = tracking_uri
        #: where a new experiment keeps its artifacts when the URI is a store, not a server: MLflow's
        #: default, `./mlruns`, is relative to the working directory of whichever process creates the
        #: experiment (a Ray worker's session folder, a test's checkout)
        self.artifacts = artifacts if artifacts is not None and not is_server(tracking_uri) else None
        self.client = MlflowClient(tracking_uri)
        self.experiment_name = experiment
        self.children = ChildRuns(self.client, tracking_uri)
        self._pool = WriterPool(writers)
        self._live = LiveClock(self._pool, self.children.write_live, live_interval)

    # ----- synchronous ---------------------------------------------------------------------------
    def experiment_id(self) -> str:
        exp = self.client.get_experiment_by_name(self.experiment_name)
        if exp is not None:
            return str(exp.experiment_id)
        return str(
            self.client.create_experiment(
                self.experiment_name,
                artifact_location=self.artifacts.resolve().as_uri() if self.artifacts else None,
                tags={EXPERIMENT_KIND_TAG: "custom_model_development"},
            )
        )

    def start_study(
        self, study_id: str, name: str, spec: dict[str, Any], parent_run_id: str | None
    ) -> tuple[str, str]:
        """(experiment id, parent run id); an existing parent run is reopened (resume), a lost one
        (MLflow's store was reset, or the run deleted) made again."""
        exp_id = self.experiment_id()
        if parent_run_id and self.run_status(parent_run_id) not in (None, "DELETED"):
            self.client.update_run(parent_run_id, status="RUNNING")
            return exp_id, parent_run_id
        return exp_id, create_parent(self.client, exp_id, study_id, name, spec)

    def run_status(self, run_id: str) -> str | None:
        """A run's status (RUNNING, FINISHED, FAILED, KILLED, or DELETED); None when MLflow has no such run."""
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(run_id)
        except MlflowException as exc:
            if is_missing(exc):
                return None
            raise
        return "DELETED" if run.info.lifecycle_stage == "deleted" else str(run.info.status)

    def child_statuses(self, experiment_id: str, parent_run_id: str) -> dict[str, tuple[str, str | None]]:
        """Every child run of the parent: run id → (its status, its `memsweep.status` tag)."""
        from mlflow.entities import ViewType

        out: dict[str, tuple[str, str | None]] = {}
        token = None
        while True:
            page = self.client.search_runs(
                [experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'",
                run_view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token,
            )  # fmt: skip
            out.update({r.info.run_id: (str(r.info.status), r.data.tags.get(STATUS_TAG)) for r in page})
            token = page.token
            if not token:
                return out

    def delete_run(self, run_id: str) -> None:
        """Delete a run (and forget it, if it was a live child run of this tracker). A run still
        RUNNING (an outage, a killed worker or API came between its first and last request) is ended
        KILLED first: deleted runs can be restored, and MLflow's UI would count it as running."""
        self.children.delete(run_id)
        self._live.forget(run_id)

    def log_comparison(self, comparison: dict[str, Any], table_csv: str, figure: bytes) -> tuple[str, str]:
        """A comparison of studies as its own run (written now, not queued): each study's rate and
        interval per group as metrics, `comparison.csv`, `comparison.json` and `plots/comparison.png`;
        (experiment id, run id)."""
        exp_id = self.experiment_id()
        return exp_id, write_comparison(self.client, exp_id, comparison, table_csv, figure)

    # ----- queued: a trial's child run, live while it trains, finished with it -------------------------
    def trial_started(self, study: StudyContext, trial: Trial, on_run_id: Callable[[str], None]) -> None:
        """A trial starts training: its child run is made `live_interval` seconds from now (with its
        params; the UI lists it then), unless the trial has ended by then (`log_trial` writes it whole);
        `on_run_id` gets its run id as soon as it is made. An earlier run of the trial that a process
        which died left RUNNING ends KILLED (`ChildRuns.end_earlier`)."""
        if trial.mlflow_run_id is not None:
            self._pool.submit(partial(self.children.end_earlier, trial.mlflow_run_id), key=trial.config_hash)
        self._live.started(study, trial, on_run_id)

    def trial_evaluated(self, config_hash: str, evaluations: Sequence[Evaluation]) -> None:
        """Evaluations of a training trial: buffered, and written in order with the next live write
        (at most every `live_interval` seconds), or with the trial's end."""
        self._live.evaluated(config_hash, evaluations)

    def log_trial(
        self,
        study: StudyContext,
        trial: Trial,
        matrices: dict[str, Any] | None,
        on_run_id: Callable[[str], None],
    ) -> None:
        """A finished trial's child run complete: its final metrics (success judged under the study's
        criterion), tags and artifacts (`matrices`: the trained {"W": [N][N], "V": [N][d] or None}),
        then terminated; made whole when it has none yet (a short trial, a reused one, or one rebuilt by
        a sync), `on_run_id` then getting its run id, and the run the trial's row named till then (a
        cancelled run's, ended KILLED; one an outage left incomplete) deleted: one run per trial."""
        live = self._live.ended(trial.config_hash)
        finish = partial(self.children.finish, study, trial, matrices, on_run_id, live)
        self._pool.submit(finish, key=trial.config_hash)

    def trial_stopped(self, config_hash: str, status: str, reason: str) -> None:
        """A trial stopped before its end (cancelled, or interrupted: pending to run again, or error):
        its live child run, if one was made, ends KILLED with the trial's `status` in the ledger and the
        reason (tags `memsweep.status`, `memsweep.reason`), after its queued writes;
        before, it stayed RUNNING for ever, and the UI counted it running. A later run of the trial
        makes a new child run; a sync deletes the stopped one, which no trial owns then."""
        live = self._live.ended(config_hash)
        if live is not None:
            self._pool.submit(partial(self.children.stop, live, status, reason), key=config_hash)

    def trial_restated(self, trial: Trial, status: str, reason: str) -> None:
        """A stopped trial's status changed in the ledger (`StudyRecorder.restated`): its child run, if one
        was made, gets the new `memsweep.status` and `memsweep.reason`, after its stop's writes."""
        if trial.mlflow_run_id is not None:
            self._pool.submit(
                partial(self.children.restate, trial.mlflow_run_id, status, reason), key=trial.config_hash
            )

    # ----- queued: the parent run ----------------------------------------------------------------
    def study_progress(self, parent_run_id: str, table: dict[str, Any]) -> None:
        """The parent run's counts as the study goes (a success table): trials, finished, succeeded,
        failed and per model success_count.<model>, each a new point of its metric."""
        self._pool.submit(partial(write_progress, self.client, parent_run_id, table))

    def log_summary(
        self, parent_run_id: str, summary: dict[str, Any], figures: dict[str, bytes], status: str
    ) -> None:
        """A finished study's summary, figures and final `status` on its parent run, after every
        child run queued so far."""
        self.flush()  # the summary describes the finished child runs: write it after them
        self._pool.submit(partial(write_summary, self.client, parent_run_id, summary, figures, status))

    # ----- the writes so far, and the end --------------------------------------------------------
    def flush(self) -> list[str]:
        """Wait for every queued write; the errors so far."""
        return self._pool.flush()

    def close(self) -> None:
        """Stop the live clock, then write everything queued and stop the writer threads."""
        self._live.close()
        self._pool.close()

    def abandon(self, why: str) -> list[str]:
        """Close without the queued writes (MLflow is down: each would only fail); the errors, `why`
        first. What they would have written, the ledger holds, and a sync rebuilds it."""
        self._live.abandon()
        dropped = self._pool.abandon()
        return [why, *self._pool.errors] + ([f"{dropped} queued writes dropped"] if dropped else [])
