"""A trial's child run: made under its study's parent run (explicit parent id), written live while its
trial trains (`live`), and finished with its result, tags and artifacts."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import TYPE_CHECKING, Any

from service.tracking.batches import flatten, log_batches, now_ms
from service.tracking.context import StudyContext
from service.tracking.live import LiveRun, Stamped, stamp

#: the child run's tags of its trial's status and reason: written here, read back by the tracker
#: (`Tracker.child_statuses`), which tells a run finished by its status tag
STATUS_TAG = "memsweep.status"
REASON_TAG = "memsweep.reason"

if TYPE_CHECKING:
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from service.store.models import Trial
    from trainers.criterion import Criterion
    from trainers.result import Evaluation, TrialResult

#: a trial's result fields logged as metrics of its child run, under the same names, and its success
#: and threshold under the study's criterion (`Trial.judged`, as REST gives them too)
METRIC_FIELDS = (
    "final_val_loss", "final_metric", "baseline_loss", "steps", "budget_steps", "early_stopped", "seconds",
    "param_count", "henrici_index", "success", "success_threshold",
)  # fmt: skip

#: a finished trial's status → its child run's terminal status (FINISHED for any other: `run_status`)
RUN_STATUS = {"done": "FINISHED", "failed": "FAILED", "pruned": "KILLED"}
MATRIX_CONVENTION = "W_ij: from unit j to unit i; V_ij: from input j to unit i"


def run_status(trial_status: str) -> str:
    """The terminal status of a finished trial's child run (`RUN_STATUS`)."""
    return RUN_STATUS.get(trial_status, "FINISHED")


def is_complete(trial: Trial, status: str, status_tag: str | None) -> bool:
    """Whether a child run of the finished `trial` (its MLflow `status` and `memsweep.status` tag) is
    the complete run of what the ledger holds now: not one an outage left RUNNING, nor one that ended
    otherwise (a cancelled run's, KILLED, of a trial that took another study's result since)."""
    return status == run_status(trial.status) and status_tag == trial.status


def is_missing(exc: MlflowException) -> bool:
    """Whether MLflow answered that it has no such run (or experiment)."""
    return "RESOURCE_DOES_NOT_EXIST" in str(exc.error_code) or "not found" in str(exc).lower()


def run_params(trial: Trial) -> list[Param]:
    """A trial's child-run params: its model, grid params and whole config, flattened."""
    from mlflow.entities import Param

    flat = flatten({"model": trial.model, **trial.params, "config": trial.config})
    return [Param(k, v) for k, v in flat.items()]


def status_tags(status: str, reason: str) -> list[RunTag]:
    """A stopped trial's status in the ledger and why, as its child run's tags."""
    from mlflow.entities import RunTag

    return [RunTag(STATUS_TAG, status), RunTag(REASON_TAG, reason[:4000])]


def curve_metrics(curve: Sequence[Stamped]) -> list[Metric]:
    """A trial's evaluations as MLflow metrics: val_loss, train_loss and metric, each at its step, and
    `lr`, the rate of that step, where the trial's rate moves (a drop, a decay)."""
    from mlflow.entities import Metric

    def values(e: Evaluation) -> tuple[tuple[str, float | None], ...]:
        return ("val_loss", e.val_loss), ("train_loss", e.train_loss), ("metric", e.metric), ("lr", e.lr)

    return [
        Metric(key, float(value), ts, int(e.step))
        for ts, e in curve
        for key, value in values(e)
        if value is not None
    ]


def result_metrics(trial: Trial, result: TrialResult, criterion: Criterion) -> list[Metric]:
    """A finished trial's METRIC_FIELDS (booleans as 0/1), its success judged under `criterion`."""
    from mlflow.entities import Metric

    ts = now_ms()
    return [
        Metric(name, float(value), ts, 0)
        for name, value in {**result.to_dict(history=False), **trial.judged(criterion)}.items()
        if isinstance(value, (int, float)) and name in METRIC_FIELDS
    ]


def result_tags(trial: Trial) -> list[RunTag]:
    """A finished trial's tags: its status, node, device, provenance and reason; and, for a trial that
    took another's result (`reused_from`), that trial's ledger id."""
    from mlflow.entities import RunTag

    tags = [RunTag(STATUS_TAG, trial.status)]
    if trial.reused_from is not None:
        tags.append(RunTag("memsweep.reused_from", str(trial.reused_from)))
    tags += [RunTag(f"memsweep.{k}", v) for k, v in (("node", trial.node), ("device", trial.device)) if v]
    tags += [RunTag(f"memsweep.provenance.{k}", str(v)) for k, v in (trial.provenance or {}).items()]
    if trial.reason:
        tags.append(RunTag(REASON_TAG, trial.reason[:4000]))
    return tags


class ChildRuns:
    """Writes the child runs of trials through one MLflow client (each call is one lane's write)."""

    def __init__(self, client: MlflowClient, tracking_uri: str) -> None:
        self.client, self.uri = client, tracking_uri

    def create(self, study: StudyContext, trial: Trial, status: str) -> tuple[str, str]:
        """A trial's child run (its tags; params come with its first batch): (run id, artifact URI)."""
        params_label = " ".join(f"{k}={v}" for k, v in trial.params.items())
        run = self.client.create_run(
            study.experiment_id,
            run_name=f"{trial.model} {params_label}",
            tags={
                "mlflow.parentRunId": study.parent_run_id,
                "memsweep.study_id": trial.study_id,
                "memsweep.config_hash": trial.config_hash,
                "memsweep.model": trial.model,
                STATUS_TAG: status,
            },
        )
        return str(run.info.run_id), str(run.info.artifact_uri)

    def write_live(self, live: LiveRun, curve: list[Stamped]) -> None:
        """A live write: the run made (the first time), then its params (the first time) and `curve`."""
        if live.run is None:
            live.run = self.create(live.study, live.trial, "running")
            live.on_run_id(live.run[0])  # at once: a sync finds and remakes a run an outage left incomplete
        params = [] if live.params_sent else run_params(live.trial)
        log_batches(self.client, live.run[0], params, curve_metrics(curve))
        live.params_sent = True

    def finish(
        self,
        study: StudyContext,
        trial: Trial,
        matrices: dict[str, Any] | None,
        on_run_id: Callable[[str], None],
        live: LiveRun | None,
    ) -> None:
        """A finished trial's child run complete (see `Tracker.log_trial`): what its live writes have
        not sent, or the whole run when it has none yet (a short trial, a reused one, or one rebuilt by
        a sync), which replaces the run its row names, if any: that one is deleted once this one is
        whole."""
        result = trial.result()
        earlier = None
        if live is not None and live.run is not None:  # a live run: what it has not had yet
            (run_id, artifact_uri), unsent = live.run, live.curve
            params = [] if live.params_sent else run_params(trial)
        else:  # none yet: the whole run now
            run_id, artifact_uri = self.create(study, trial, trial.status)
            on_run_id(run_id)
            unsent, params = stamp(result.history), run_params(trial)
            earlier = trial.mlflow_run_id
        metrics = curve_metrics(unsent) + result_metrics(trial, result, study.criterion)
        log_batches(self.client, run_id, params, metrics, result_tags(trial))
        if trial.traceback:
            self.write_artifact(artifact_uri, trial.traceback, "traceback.txt")
        if matrices is not None and matrices.get("W") is not None:
            # straight to the run's artifact repository: MlflowClient.log_dict would first ask the
            # server for the run again, only to learn the artifact URI create_run already gave
            matrix = json.dumps({**matrices, "convention": MATRIX_CONVENTION})
            self.write_artifact(artifact_uri, matrix, "recurrent_matrix.json")
        self.client.set_terminated(run_id, status=run_status(trial.status))
        if earlier is not None and earlier != run_id:
            self.delete(earlier)

    def stop(self, live: LiveRun, status: str, reason: str) -> None:
        """A trial stopped before its end (see `Tracker.trial_stopped`): its live run, if made, gets what
        its curve has not had, the trial's status in the ledger and the reason, and ends KILLED."""
        if live.run is None:
            return
        run_id = live.run[0]
        log_batches(self.client, run_id, [], curve_metrics(live.curve), status_tags(status, reason))
        self.client.set_terminated(run_id, status="KILLED")

    def restate(self, run_id: str, status: str, reason: str) -> None:
        """A stopped trial's run told its trial's new status and reason (`Tracker.trial_restated`)."""
        log_batches(self.client, run_id, [], [], status_tags(status, reason))

    def end_earlier(self, run_id: str) -> None:
        """An earlier child run of a trial that starts again: ended KILLED, pending with the reason, when
        the process that trained it died and left it RUNNING (a crash, a SIGKILL); the UI counted it
        running beside the new one until the study ended. (No trial owns it once the new run is made:
        the study's end, or a sync, deletes it.)"""
        from mlflow.entities import RunTag
        from mlflow.exceptions import MlflowException

        try:
            running = self.client.get_run(run_id).info.status == "RUNNING"
        except MlflowException:  # deleted, or never made: nothing to end
            return
        if running:
            reason = "the process training it died before it ended; the trial trains again in a new run"
            tags = [RunTag(STATUS_TAG, "pending"), RunTag(REASON_TAG, reason)]
            log_batches(self.client, run_id, [], [], tags)
            self.client.set_terminated(run_id, status="KILLED")

    def delete(self, run_id: str) -> None:
        """Delete a run (see `Tracker.delete_run`); one MLflow has deleted, or never had, is left alone."""
        from mlflow.exceptions import MlflowException

        try:
            info = self.client.get_run(run_id).info
        except MlflowException as exc:
            if is_missing(exc):  # never made, or MLflow's store was reset: nothing to delete
                return
            raise
        if info.lifecycle_stage == "deleted":
            return
        if info.status == "RUNNING":
            self.client.set_tag(run_id, "memsweep.replaced", "incomplete: made again whole, then deleted")
            self.client.set_terminated(run_id, status="KILLED")
        self.client.delete_run(run_id)

    def write_artifact(self, artifact_uri: str, text: str, name: str) -> None:
        """`text` as the artifact `name` of the run at `artifact_uri`."""
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        repo = get_artifact_repository(artifact_uri, tracking_uri=self.uri)
        with TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_text(text)
            repo.log_artifact(str(path))  # type: ignore[no-untyped-call]
