"""The one MLflow seam: a study is a parent run, each trial a child run (explicit parent id).

All MLflow writes go through `Tracker`, on background threads, so a slow tracking server never
stalls the engine's event loop. A child run's writes go in order in its own lane (lanes run in
parallel); `flush` waits for all of them, and the parent's summary is written after the flush.

A training trial's child run is live, at a bounded number of requests: made `live_interval` seconds
after its trial starts (with its params), its curve then written at most every `live_interval`
seconds (less often when many runs are live: LIVE_WRITES_PER_SECOND), and the rest in one batch at
its end; a trial that ends sooner is written whole at its end
(create, one batch, its matrix, its status: four requests). MLflow's server answers some 40 requests
a second here, and its writes were the tail of short-trial studies. The local tracking server memsweep starts
when none is configured is `server`'s.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from service.store.models import Trial
    from trainers.criterion import Criterion
    from trainers.result import Evaluation

log = logging.getLogger(__name__)

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"  # without it the MLflow 3 UI opens on a GenAI overview

#: a trial's result fields logged as metrics of its child run, under the same names, and its success
#: and threshold under the study's criterion (JUDGED_FIELDS, as REST names them too)
METRIC_FIELDS = (
    "final_val_loss", "final_metric", "baseline_loss", "steps", "budget_steps", "early_stopped", "seconds",
    "param_count", "henrici_index", "success", "success_threshold",
)  # fmt: skip
JUDGED_FIELDS = ("success", "success_threshold")


#: MLflow's HTTP retries for memsweep's writes: 3 tries, 1 s backoff, 30 s a request
MLFLOW_FAIL_FAST = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, f"{key}."))
        else:
            out[key] = str(v)[:500]
    return out


def run_params(trial: Trial) -> dict[str, str]:
    """A trial's child-run params: its model, grid params and whole config, flattened."""
    return flatten({"model": trial.model, **trial.params, "config": trial.config})


def curve_metrics(evaluations: Sequence[Evaluation]) -> list[Any]:
    """A trial's evaluations as MLflow metrics: val_loss, train_loss and metric, each at its step."""
    from mlflow.entities import Metric

    ts = int(time.time() * 1000)
    return [
        Metric(key, float(value), ts, int(e.step))
        for e in evaluations
        for key, value in (("val_loss", e.val_loss), ("train_loss", e.train_loss), ("metric", e.metric))
        if value is not None
    ]


def criterion_slug(criterion: dict[str, Any]) -> str:
    """A criterion as a metric-name part: `0.5x_arjovsky`, `loss_lt_0.02`."""
    if criterion.get("threshold") is not None:
        return f"loss_lt_{criterion['threshold']:g}"
    return f"{criterion['fraction']:g}x_{criterion['baseline']}"


#: live curve writes per second at most, over all of a tracker's running trials: with many live runs
#: (two 32-member bundles) each is written less often than `live_interval`, and the server (~40
#: requests a second here) keeps most of its time for the end-of-trial writes
LIVE_WRITES_PER_SECOND = 10.0

# MLflow's LogBatch limits: 1,000 metrics, 100 params, 100 tags and 1,000 entities per request
MAX_BATCH_ENTITIES, MAX_BATCH_PARAMS, MAX_BATCH_TAGS = 1000, 100, 100


class Batch(NamedTuple):
    params: list[Any]
    metrics: list[Any]
    tags: list[Any]


def batches(params: list[Any], metrics: list[Any], tags: list[Any]) -> list[Batch]:
    """Params, metrics and tags in as few LogBatch requests as MLflow's limits allow (at least one)."""
    out: list[Batch] = []
    params, metrics, tags = list(params), list(metrics), list(tags)
    while params or metrics or tags or not out:
        p, params = params[:MAX_BATCH_PARAMS], params[MAX_BATCH_PARAMS:]
        t, tags = tags[:MAX_BATCH_TAGS], tags[MAX_BATCH_TAGS:]
        room = MAX_BATCH_ENTITIES - len(p) - len(t)
        m, metrics = metrics[:room], metrics[room:]
        out.append(Batch(p, m, t))
    return out


@dataclass
class LiveRun:
    """A training trial's child run between its start and its end, as the tracker holds it."""

    experiment_id: str
    parent_run_id: str
    trial: Trial
    on_run_id: Callable[[str], None]
    last_write: float  # monotonic time of the start, then of the last live write
    due: float | None  # when its next live write goes out; None: nothing to write yet
    run: tuple[str, str] | None = None  # (run id, artifact URI), once made
    params_sent: bool = False
    curve: list[Evaluation] = field(default_factory=list)  # evaluations not yet written
    queued: bool = False  # a live write is queued in its lane
    ended: bool = False  # its final write is queued: that one writes whatever is left


class Tracker:
    """Parent/child runs of studies; writes are queued to a small pool of writer threads."""

    def __init__(
        self, tracking_uri: str, experiment: str, writers: int = 4, live_interval: float = 2.0
    ) -> None:
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        # MLflow is a projection of the ledger, repaired by a sync: a write to a server that is down
        # fails within seconds (MLflow's own client would retry each for about 4 minutes and hold a
        # finished study "running" meanwhile). Explicit MLFLOW_HTTP_* settings win.
        for name, value in MLFLOW_FAIL_FAST.items():
            os.environ.setdefault(name, value)
        from mlflow.tracking import MlflowClient

        self.uri = tracking_uri
        self.client = MlflowClient(tracking_uri)
        self.experiment_name = experiment
        self.live_interval = live_interval
        self._pool = ThreadPoolExecutor(max_workers=writers, thread_name_prefix="mlflow-writer")
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)  # the live-write clock sleeps on it
        self._clock: threading.Thread | None = None
        self._closing = False
        self._pending: list[Future[Any]] = []
        self._errors: list[str] = []
        self._lanes: dict[str, collections.deque[tuple[Callable[..., Any], tuple[Any, ...]]]] = {}
        self._live: dict[str, LiveRun] = {}  # config hash → the child run of a training trial

    # ----- synchronous setup ---------------------------------------------------------------------
    def experiment_id(self) -> str:
        exp = self.client.get_experiment_by_name(self.experiment_name)
        if exp is not None:
            return str(exp.experiment_id)
        return str(
            self.client.create_experiment(
                self.experiment_name, tags={EXPERIMENT_KIND_TAG: "custom_model_development"}
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
        run = self.client.create_run(
            exp_id,
            run_name=f"study {name} [{study_id}]",
            tags={"memsweep.study_id": study_id, "memsweep.kind": "study"},
        )
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in flatten({"spec": spec}).items()]
        for batch in batches(params, [], []):
            self.client.log_batch(run.info.run_id, params=batch.params)
        return exp_id, run.info.run_id

    def run_status(self, run_id: str) -> str | None:
        """A run's status (RUNNING, FINISHED, FAILED, KILLED, or DELETED); None when MLflow has no such run."""
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(run_id)
        except MlflowException as exc:
            if "RESOURCE_DOES_NOT_EXIST" in str(exc.error_code) or "not found" in str(exc).lower():
                return None
            raise
        return "DELETED" if run.info.lifecycle_stage == "deleted" else str(run.info.status)

    def child_statuses(self, experiment_id: str, parent_run_id: str) -> dict[str, str]:
        """Every child run of the parent: run id → status."""
        from mlflow.entities import ViewType

        out: dict[str, str] = {}
        token = None
        while True:
            page = self.client.search_runs(
                [experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'",
                run_view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token,
            )  # fmt: skip
            out.update({r.info.run_id: str(r.info.status) for r in page})
            token = page.token
            if not token:
                return out

    def delete_run(self, run_id: str) -> None:
        """Delete a run (and forget it, if it was a live child run of this tracker). A run still
        RUNNING (an outage, a killed worker or API came between its first and last request) is ended
        KILLED first: deleted runs can be restored, and MLflow's UI would count it as running."""
        if self.client.get_run(run_id).info.status == "RUNNING":
            self.client.set_tag(run_id, "memsweep.replaced", "incomplete: made again whole, then deleted")
            self.client.set_terminated(run_id, status="KILLED")
        self.client.delete_run(run_id)
        with self._lock:
            self._live = {k: v for k, v in self._live.items() if not v.run or v.run[0] != run_id}

    # ----- queued writes -------------------------------------------------------------------------
    def submit(self, fn: Callable[..., Any], *args: Any, lane: str | None = None) -> None:
        """Queue a write. The writes of one lane (a trial's child run) go one after another, in order;
        different lanes, and writes without one, go in parallel on the writer threads."""
        with self._lock:
            self._submit(fn, args, lane)

    def _submit(self, fn: Callable[..., Any], args: tuple[Any, ...], lane: str | None) -> None:
        """`submit`, the lock held."""
        if lane is None:
            self._pending.append(self._pool.submit(self._guarded, fn, args))
            return
        queue = self._lanes.setdefault(lane, collections.deque())
        queue.append((fn, args))
        if len(queue) == 1:  # no drain of this lane is under way: start one
            self._pending.append(self._pool.submit(self._drain, lane))

    def _drain(self, lane: str) -> None:
        while True:
            with self._lock:
                fn, args = self._lanes[lane][0]
            self._guarded(fn, args)
            with self._lock:
                queue = self._lanes[lane]
                queue.popleft()
                if not queue:
                    del self._lanes[lane]
                    return

    def _guarded(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        except Exception as exc:  # tracking problems never take a study down (a sync repairs them)
            log.warning("MLflow write failed: %s", exc)
            self._errors.append(f"{type(exc).__name__}: {exc}")

    def flush(self) -> list[str]:
        """Wait for every queued write; the errors so far."""
        while True:
            with self._lock:
                pending, self._pending = self._pending, []
            if not pending:
                return self._errors
            for f in pending:
                f.result()

    # ----- a trial's child run: live while it trains, finished with it ------------------------------
    def trial_started(
        self, experiment_id: str, parent_run_id: str, trial: Trial, on_run_id: Callable[[str], None]
    ) -> None:
        """A trial starts training: its child run is made `live_interval` seconds from now (with its
        params; the UI lists it then), unless the trial has ended by then (`log_trial` writes it whole)."""
        now = time.monotonic()
        with self._lock:
            self._live[trial.config_hash] = LiveRun(
                experiment_id, parent_run_id, trial, on_run_id, now, due=now + self.live_interval
            )
            if self._clock is None:
                self._clock = threading.Thread(target=self._tick, name="mlflow-live-clock", daemon=True)
                self._clock.start()
            self._wake.notify()

    def trial_evaluated(self, config_hash: str, evaluations: Sequence[Evaluation]) -> None:
        """Evaluations of a training trial: buffered, and written in order with the next live write
        (at most every `live_interval` seconds), or with the trial's end."""
        with self._lock:
            live = self._live.get(config_hash)
            if live is None or live.ended:
                return
            live.curve.extend(evaluations)
            if live.due is None and not live.queued:
                live.due = live.last_write + self._spacing()
                self._wake.notify()

    def _spacing(self) -> float:
        """Seconds between two live writes of a run (the lock held): `live_interval`, or longer when
        that many live runs would write more than LIVE_WRITES_PER_SECOND."""
        return max(self.live_interval, len(self._live) / LIVE_WRITES_PER_SECOND)

    def _tick(self) -> None:
        """The live-write clock: queues each live run's write when it falls due."""
        with self._lock:
            while not self._closing:
                now = time.monotonic()
                waiting = [
                    v for v in self._live.values() if v.due is not None and not v.queued and not v.ended
                ]
                for live in waiting:
                    if live.due is not None and live.due <= now:
                        live.due, live.queued = None, True
                        self._submit(self._write_live, (live,), live.trial.config_hash)
                nxt = min((v.due for v in waiting if v.due is not None), default=None)
                self._wake.wait(timeout=None if nxt is None else max(nxt - now, 0.01))

    def _write_live(self, live: LiveRun) -> None:
        """A live write: the run made (first time), then its params (first time) and buffered curve."""
        from mlflow.entities import Param

        with self._lock:
            if live.ended:  # the final write, queued behind this one, writes everything
                live.queued = False
                return
            curve, live.curve = live.curve, []
        try:
            if live.run is None:
                live.run = self._create_run(live.experiment_id, live.parent_run_id, live.trial, "running")
                live.on_run_id(
                    live.run[0]
                )  # at once: a sync finds and remakes a run an outage left incomplete
            params = [] if live.params_sent else [Param(k, v) for k, v in run_params(live.trial).items()]
            for batch in batches(params, curve_metrics(curve), []):
                self.client.log_batch(live.run[0], params=batch.params, metrics=batch.metrics)
            live.params_sent = True
        except Exception:
            with self._lock:  # the end of the trial writes them
                live.curve[:0] = curve
            raise
        finally:
            with self._lock:
                live.queued = False
                live.last_write = time.monotonic()
                if live.curve and not live.ended:
                    live.due = live.last_write + self._spacing()
                    self._wake.notify()

    def log_trial(
        self,
        experiment_id: str,
        parent_run_id: str,
        trial: Trial,
        criterion: Criterion,
        matrices: dict[str, Any] | None,
        on_run_id: Callable[[str], None],
    ) -> None:
        """A finished trial's child run complete: its final metrics (success judged under the study's
        `criterion`), tags and artifacts (`matrices`: the trained {"W": [N][N], "V": [N][d] or None}),
        then terminated; made whole when it has none yet (a short trial, a reused one, or one rebuilt by
        a sync)."""
        with self._lock:
            live = self._live.pop(trial.config_hash, None)
            if live is not None:
                live.ended = True
        self.submit(
            self._finish_child, experiment_id, parent_run_id, trial, criterion, matrices, on_run_id, live,
            lane=trial.config_hash,
        )  # fmt: skip

    def _create_run(
        self, experiment_id: str, parent_run_id: str, trial: Trial, status: str
    ) -> tuple[str, str]:
        """A trial's child run (its tags; params come with its first batch): (run id, artifact URI)."""
        params_label = " ".join(f"{k}={v}" for k, v in trial.params.items())
        run = self.client.create_run(
            experiment_id,
            run_name=f"{trial.model} {params_label}",
            tags={
                "mlflow.parentRunId": parent_run_id,
                "memsweep.study_id": trial.study_id,
                "memsweep.config_hash": trial.config_hash,
                "memsweep.model": trial.model,
                "memsweep.status": status,
            },
        )
        return str(run.info.run_id), str(run.info.artifact_uri)

    def _finish_child(
        self,
        experiment_id: str,
        parent_run_id: str,
        trial: Trial,
        criterion: Criterion,
        matrices: dict[str, Any] | None,
        on_run_id: Callable[[str], None],
        live: LiveRun | None,
    ) -> None:
        from mlflow.entities import Metric, Param, RunTag

        result = trial.result()
        if live is not None and live.run is not None:  # a live run: what it has not had yet
            (run_id, artifact_uri), unsent = live.run, live.curve
            params = {} if live.params_sent else run_params(trial)
        else:  # none yet (a short trial, a reused one, or one rebuilt by a sync): the whole run now
            run_id, artifact_uri = self._create_run(experiment_id, parent_run_id, trial, trial.status)
            on_run_id(run_id)
            unsent, params = list(result.history), run_params(trial)
        ts = int(time.time() * 1000)
        # the result's scalar fields, under their own names (booleans as 0/1)
        judged = {
            "success": trial.succeeded(criterion),
            "success_threshold": criterion.threshold_for(trial.baseline_loss, trial.reference_baselines),
        }
        metrics = curve_metrics(unsent) + [
            Metric(name, float(value), ts, 0)
            for name, value in {**result.to_dict(history=False), **judged}.items()
            if isinstance(value, (int, float)) and name in METRIC_FIELDS
        ]
        tags = [RunTag("memsweep.status", trial.status)]
        tags += [RunTag(f"memsweep.{k}", v) for k, v in (("node", trial.node), ("device", trial.device)) if v]
        tags += [RunTag(f"memsweep.provenance.{k}", str(v)) for k, v in (trial.provenance or {}).items()]
        if trial.reason:
            tags.append(RunTag("memsweep.reason", trial.reason[:4000]))
        for batch in batches([Param(k, v) for k, v in params.items()], metrics, tags):
            self.client.log_batch(run_id, metrics=batch.metrics, params=batch.params, tags=batch.tags)
        if trial.traceback:
            self._log_text(artifact_uri, trial.traceback, "traceback.txt")
        if matrices is not None and matrices.get("W") is not None:
            # straight to the run's artifact repository: MlflowClient.log_dict would first ask the
            # server for the run again, only to learn the artifact URI create_run already gave
            self._log_json(
                artifact_uri,
                {**matrices, "convention": "W_ij: from unit j to unit i; V_ij: from input j to unit i"},
                "recurrent_matrix.json",
            )
        status = {"done": "FINISHED", "failed": "FAILED", "pruned": "KILLED"}.get(trial.status, "FINISHED")
        self.client.set_terminated(run_id, status=status)

    # ----- the parent run's live counts ------------------------------------------------------------
    def study_progress(self, parent_run_id: str, table: dict[str, Any]) -> None:
        """The parent run's counts as the study goes (a success table): trials, finished, succeeded,
        failed and per model success_count.<model>, each a new point of its metric."""
        self.submit(self._log_progress, parent_run_id, table)

    def _log_progress(self, parent_run_id: str, table: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        total = table["total"]
        metrics = [Metric(k, float(total[k]), ts, 0) for k in ("trials", "finished", "succeeded", "failed")]
        metrics += [
            Metric(f"success_count.{model}", float(cell["succeeded"]), ts, 0)
            for model, cell in table["by_model"].items()
        ]
        for batch in batches([], metrics, []):
            self.client.log_batch(parent_run_id, metrics=batch.metrics)

    def _log_json(self, artifact_uri: str, data: Any, name: str) -> None:
        self._log_text(artifact_uri, json.dumps(data), name)

    def _log_text(self, artifact_uri: str, text: str, name: str) -> None:
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        repo = get_artifact_repository(artifact_uri, tracking_uri=self.uri)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_text(text)
            repo.log_artifact(str(path))  # type: ignore[no-untyped-call]

    def log_summary(
        self, parent_run_id: str, summary: dict[str, Any], figures: dict[str, bytes], status: str
    ) -> None:
        self.flush()  # the summary describes the finished child runs: write it after them
        self.submit(self._log_summary, parent_run_id, summary, figures, status)

    def _log_summary(
        self, parent_run_id: str, summary: dict[str, Any], figures: dict[str, bytes], status: str
    ) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        table = summary["success"]
        metrics = [
            Metric("trials", float(table["total"]["trials"]), ts, 0),
            Metric("succeeded", float(table["total"]["succeeded"]), ts, 0),
            Metric("failed", float(table["total"]["failed"]), ts, 0),
        ]
        for model, cell in table["by_model"].items():
            metrics += [
                Metric(f"success_count.{model}", float(cell["succeeded"]), ts, 0),
                Metric(f"success_rate.{model}", float(cell["rate"]), ts, 0),
                Metric(f"success_ci95_low.{model}", float(cell["ci95"][0]), ts, 0),
                Metric(f"success_ci95_high.{model}", float(cell["ci95"][1]), ts, 0),
                Metric(f"trials.{model}", float(cell["trials"]), ts, 0),
            ]
        for model, h in summary.get("henrici_index", {}).items():
            metrics += [
                Metric(f"henrici_mean.{model}", float(h["mean"]), ts, 0),
                Metric(f"henrici_sem.{model}", float(h["sem"]), ts, 0),
            ]
        if summary.get("best"):
            metrics.append(
                Metric("best_mean_final_val_loss", float(summary["best"][0]["mean_final_val_loss"]), ts, 0)
            )
        # successes against budget: one metric per model, its step the budget (the UI draws the curve)
        for model, rows in summary.get("success_vs_budget", {}).get("by_model", {}).items():
            metrics += [
                Metric(f"success_vs_budget.{model}", float(r["succeeded"]), ts, int(r["step"])) for r in rows
            ]
        for other in summary.get("success_other_criteria", []):
            slug = criterion_slug(other["criterion"])
            metrics += [
                Metric(f"success_count.{model}.{slug}", float(cell["succeeded"]), ts, 0)
                for model, cell in other["by_model"].items()
            ]
        for batch in batches([], metrics, []):
            self.client.log_batch(parent_run_id, metrics=batch.metrics)
        self.client.log_dict(parent_run_id, summary, "summary.json")
        with tempfile.TemporaryDirectory() as tmp:
            for name, data in figures.items():
                path = os.path.join(tmp, name)
                Path(path).write_bytes(data)
                self.client.log_artifact(parent_run_id, path, "plots")
        if summary.get("best"):
            self.client.set_tag(
                parent_run_id, "memsweep.best_config", json.dumps(summary["best"][0]["params"])[:4000]
            )
        self.client.set_tag(parent_run_id, "memsweep.criterion", table["criterion"]["name"])
        self.client.set_tag(parent_run_id, "memsweep.trainer_version", str(summary.get("trainer_version")))
        self.client.set_terminated(parent_run_id, status=status)

    def log_comparison(self, comparison: dict[str, Any], table_csv: str, figure: bytes) -> tuple[str, str]:
        """A comparison of studies as its own run (written now, not queued): each study's rate and
        interval per group as metrics, `comparison.csv`, `comparison.json` and `plots/comparison.png`;
        (experiment id, run id)."""
        from mlflow.entities import Metric, Param

        exp_id = self.experiment_id()
        ids = [s["study_id"] for s in comparison["studies"]]
        run = self.client.create_run(
            exp_id,
            run_name=f"compare {' vs '.join(s['name'] for s in comparison['studies'])}",
            tags={
                "memsweep.kind": "comparison",
                "memsweep.studies": ",".join(ids),
                "memsweep.criterion": "; ".join(s["criterion"]["name"] for s in comparison["studies"]),
                "memsweep.trainer_version": str(comparison["trainer_version"]),
            },
        )
        run_id = run.info.run_id
        params = [Param("by", ",".join(comparison["by"])), Param("reference", comparison["reference"])]
        params += [Param("at_step", str(comparison["at_step"]))]
        params += [Param(f"criterion.{s['study_id']}", s["criterion"]["name"]) for s in comparison["studies"]]
        ts = int(time.time() * 1000)
        metrics = []
        for row in comparison["rows"]:
            where = ".".join(str(v) for v in row["group"].values()) if row["scope"] == "group" else "total"
            who = row["study_id"] or "pooled"
            name = re.sub(r"[^\w\-. /]", "_", f"{who}.{where}")  # what MLflow allows in a name
            metrics += [
                Metric(f"success_rate.{name}", float(row["rate"]), ts, 0),
                Metric(f"success_ci95_low.{name}", float(row["ci95"][0]), ts, 0),
                Metric(f"success_ci95_high.{name}", float(row["ci95"][1]), ts, 0),
            ]
            if row["difference"] is not None:
                metrics.append(Metric(f"difference.{name}", float(row["difference"]), ts, 0))
        for batch in batches(params, metrics, []):
            self.client.log_batch(run_id, metrics=batch.metrics, params=batch.params)
        self.client.log_text(run_id, table_csv, "comparison.csv")
        self.client.log_dict(run_id, comparison, "comparison.json")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "comparison.png"
            path.write_bytes(figure)
            self.client.log_artifact(run_id, str(path), "plots")
        self.client.set_terminated(run_id, status="FINISHED")
        return exp_id, run_id

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._wake.notify()
        if self._clock is not None:
            self._clock.join()
        self.flush()
        self._pool.shutdown(wait=True)

    def abandon(self, why: str) -> list[str]:
        """Close without the queued writes (MLflow is down: each would only fail); the errors, `why`
        first. What they would have written, the ledger holds, and a sync rebuilds it."""
        with self._lock:
            self._closing = True
            self._lanes.clear()
            self._live.clear()
            self._wake.notify()
            pending, self._pending = self._pending, []
        dropped = sum(f.cancel() for f in pending)
        self._pool.shutdown(wait=False, cancel_futures=True)
        return [why, *self._errors] + ([f"{dropped} queued writes dropped"] if dropped else [])
