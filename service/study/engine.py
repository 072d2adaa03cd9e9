"""The study lifecycle: create, extend, run, summarise.

    engine = Engine(get_settings())
    study = engine.create_study(spec)          # validates, enumerates the grid into the ledger
    summary = engine.run_study(study.id)       # runs what is not finished; resumable at any point

The ledger is the source of truth: a run that dies midway is resumed by calling `run_study` again
(only pending or interrupted trials run); `extend_study` adds only new points; a finished trial of
any study with the same config hash is reused. The driver is the only writer of the ledger and of
MLflow; Ray workers only report (`service.study.ray_tune`). A study's trials come from `service.study.search`,
travel as `TrialSpec`s and units (`service.core.trial`, `service.study.packing`), and come back as
`trainers.TrialResult`s.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any

from search_spaces import SearchSpace
from service.core.settings import Settings
from service.core.spec import StudyError, StudySpec
from service.core.trial import PlanError, TrialSpec
from service.planning.plan import record_actual
from service.reports.summary import best_configs, henrici_table, success_table, success_vs_budget
from service.store.ledger import FINISHED, Ledger, Study, Trial
from service.study.packing import pack_study
from service.study.search import check_space, execution, grid_trials, optuna_search
from trainers import TRAINER_VERSION, Criterion, Evaluation, TrialResult

log = logging.getLogger(__name__)

#: seconds a node's measured memory is trusted for bundle sizes (`Engine._unit_memory`)
MEMORY_TTL = 600.0
#: where a run's time goes, in order (`run_study`'s summary["seconds"])
RUN_PHASES = ("ray_tune", "tracking_backlog", "summary_and_plots", "parent_run")
#: trials a run takes up: never started, interrupted by a crash (running) or a fault (pending again),
#: stopped with their study (cancelled), or left as error by an earlier run's faults
UNFINISHED = ("pending", "running", "cancelled", "error")


class Engine:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        settings.home.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger(settings.resolved_database_url())
        self._tracking_uri: str | None = None
        self._memory: dict[tuple[float, float], tuple[float, tuple[str, int] | None]] = {}
        #: the recorder of each study this engine runs (its pace: `eta`)
        self.progress: dict[str, StudyRecorder] = {}

    # ----- creation --------------------------------------------------------------------------------
    def create_study(self, spec: StudySpec) -> Study:
        space = self._space(spec)
        trials = self._trials(spec, space)
        study = self.ledger.create_study(spec.name or space.name, spec.model_dump(mode="json"))
        self.ledger.add_trials(study.id, trials)
        return study

    def extend_study(self, study_id: str, spec: StudySpec) -> int:
        """Replace the study's spec with a larger one; only points not yet in the ledger are added.
        Returns how many; an extension that adds nothing (and, sampled, no budget) changes nothing."""
        study = self._study(study_id)
        old = StudySpec.model_validate(study.spec)
        if old.sampler != spec.sampler:
            raise StudyError("extend keeps the sampler; create a new study to change it")
        space = self._space(spec)
        added = self.ledger.add_trials(study.id, self._trials(spec, space))
        more_budget = spec.sampler != "grid" and (spec.max_trials or 0) > (old.max_trials or 0)
        if added or more_budget:
            self.ledger.update_study(study.id, spec=spec.model_dump(mode="json"), state="pending")
        return added if spec.sampler == "grid" else (spec.max_trials or 0) - (old.max_trials or 0)

    def _space(self, spec: StudySpec) -> SearchSpace:
        try:
            space = spec.search_space()
        except (ValueError, KeyError) as exc:
            raise StudyError(str(exc)) from None
        if spec.sampler == "grid":  # its size first: a product of the dimensions' lengths, nothing made
            if not space.is_grid:
                raise StudyError(
                    "sampler 'grid' needs lists of values in every dimension; use tpe/random/qmc for ranges"
                )
            size = space.size()
            limit = min(self.settings.max_grid_size, spec.max_trials or self.settings.max_grid_size)
            if size > limit:
                raise StudyError(
                    f"the grid holds {size} trials (points × seeds), over the limit of {limit}; "
                    "choose fewer models, values or seeds (or raise max_trials / MEMSWEEP_MAX_GRID_SIZE)"
                )
        check_space(space)
        return space

    def _trials(self, spec: StudySpec, space: SearchSpace) -> list[TrialSpec]:
        """A grid's trials, resolved (a sampled study adds its trials as their points are drawn)."""
        return grid_trials(space, execution(spec)) if spec.sampler == "grid" else []

    def _study(self, study_id: str) -> Study:
        study = self.ledger.get_study(study_id)
        if study is None:
            raise KeyError(f"no study {study_id!r}")
        return study

    # ----- execution -------------------------------------------------------------------------------
    def tracking_uri(self) -> str:
        if self._tracking_uri is None:
            from service.tracking.tracker import ensure_mlflow_server

            s = self.settings
            self._tracking_uri = ensure_mlflow_server(s.mlflow_tracking_uri, s.home, s.mlflow_port)
        return self._tracking_uri

    def run_study(self, study_id: str, cancel: threading.Event | None = None) -> dict[str, Any]:
        """Run every trial of the study that is not finished; returns the study summary.

        `cancel`: set it (from another thread) to stop the run; unfinished trials stay resumable."""
        from service.tracking.tracker import Tracker

        study = self._study(study_id)
        spec = StudySpec.model_validate(study.spec)
        space = self._space(spec)
        cancel = cancel if cancel is not None else threading.Event()
        tracker = Tracker(
            self.tracking_uri(),
            self.settings.mlflow_experiment,
            live_interval=self.settings.mlflow_live_interval,
        )
        exp_id, parent = tracker.start_study(study.id, study.name, study.spec, study.mlflow_run_id)
        self.ledger.update_study(
            study.id, state="running", error=None, mlflow_experiment_id=exp_id, mlflow_run_id=parent
        )
        marks = [time.perf_counter()]
        try:
            recorder = StudyRecorder(self.ledger, tracker, study.id, exp_id, parent, spec.criterion())
            self.progress[study.id] = recorder
            recorder.progress(force=True)  # the parent's counts from the start (and right after a resume)
            self._run_units(study, spec, space, recorder, cancel)
            state = "cancelled" if cancel.is_set() else "done"
        except Exception as exc:
            log.exception("study %s failed", study.id)
            self.ledger.update_study(study.id, state="failed", error=f"{type(exc).__name__}: {exc}")
            tracker.close()
            raise
        finally:
            self.progress.pop(study.id, None)
        marks.append(time.perf_counter())
        summary, errors = self._project(study.id, tracker, exp_id, parent, spec.criterion(), state, marks)
        phases = dict(zip(RUN_PHASES, (b - a for a, b in pairwise(marks)), strict=True))
        record_actual(self.ledger, study.id, phases)  # what the run took, beside its plan's estimate
        log.info("study %s: %s", study.id, ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()))
        self.ledger.update_study(study.id, state=state, error=tracking_error(study.id, errors))
        summary["state"] = state
        summary["seconds"] = phases
        return summary

    def sync_tracking(self, study_id: str) -> dict[str, Any]:
        """Rebuild the study's MLflow runs from the ledger, the source of truth: the parent run (made
        again if MLflow lost it), a complete child run for every finished trial (an incomplete one, left
        by an outage, is made again; one no trial owns is deleted), and the summary. Returns the study
        summary, with `mlflow_errors` (empty when MLflow now agrees with the ledger)."""
        from service.tracking.tracker import Tracker, server_healthy

        study = self._study(study_id)
        spec = StudySpec.model_validate(study.spec)
        uri = self.tracking_uri()
        down = (
            None if not uri.startswith("http") or server_healthy(uri) else f"MLflow at {uri} does not answer"
        )
        try:  # a quick probe first: MLflow's client retries a refused connection for a minute or more
            if down:
                raise ConnectionError(down)
            tracker = Tracker(uri, self.settings.mlflow_experiment)
            exp_id, parent = tracker.start_study(study.id, study.name, study.spec, study.mlflow_run_id)
        except Exception as exc:  # nothing to rebuild on yet; the ledger keeps every result
            summary = self.summary(study.id)
            summary["mlflow_errors"] = [down or f"{type(exc).__name__}: {exc}"]
            return summary
        self.ledger.update_study(study.id, mlflow_experiment_id=exp_id, mlflow_run_id=parent)
        state = study.state if study.state in ("done", "failed", "cancelled") else "cancelled"
        summary, errors = self._project(study.id, tracker, exp_id, parent, spec.criterion(), state, [])
        if study.state != "running":
            self.ledger.update_study(study.id, error=tracking_error(study.id, errors))
        summary["mlflow_errors"] = errors
        return summary

    def _project(
        self,
        study_id: str,
        tracker: Any,
        exp_id: str,
        parent: str,
        criterion: Criterion,
        state: str,
        marks: list[float],
    ) -> tuple[dict[str, Any], list[str]]:
        """The end of a run, in MLflow: every finished trial's child run complete and once, then the
        summary, figures and final status on the parent run. (summary, MLflow errors). With MLflow
        down, nothing is written (the study ends now; the runs are rebuilt when it answers)."""
        from service.tracking.tracker import server_healthy

        if tracker.uri.startswith("http") and not server_healthy(tracker.uri):
            marks.extend([time.perf_counter()] * 3)
            down = f"MLflow at {tracker.uri} did not answer at the end of the study"
            return self.summary(study_id), tracker.abandon(down)
        unreconciled = []
        try:
            self._reconcile_children(study_id, tracker, exp_id, parent, criterion)
        except Exception as exc:  # MLflow unreachable: recorded, repaired by a later sync
            log.warning("study %s: MLflow child runs not reconciled: %s", study_id, exc)
            unreconciled.append(f"{type(exc).__name__}: {exc}")
        marks.append(time.perf_counter())
        summary = self.summary(study_id)
        try:
            from service.reports.plots import study_figures

            figures = study_figures(self.ledger.trials(study_id), summary, criterion)
        except Exception as exc:  # a plot never fails a finished study
            log.warning("study %s: plots failed: %s", study_id, exc)
            figures = {}
        marks.append(time.perf_counter())
        tracker.log_summary(parent, summary, figures, "FINISHED" if state == "done" else "KILLED")
        errors = unreconciled + list(tracker.flush())
        marks.append(time.perf_counter())
        tracker.close()
        return summary, errors

    def _run_units(
        self,
        study: Study,
        spec: StudySpec,
        space: SearchSpace,
        record: StudyRecorder,
        cancel: threading.Event,
    ) -> None:
        """The study's trials through Ray Tune: a sampler's points as they are drawn (up to
        `max_trials`), then the unfinished trials packed into units, round after round while an
        infrastructure fault sends some back (each at most `trial_attempts` starts in this run)."""
        from service.study.ray_tune import (
            LedgerCallback,
            UnitSearcher,
            ensure_ray,
            tune_units,
            unit_memory,
            unplaceable,
        )

        ensure_ray(self.settings)
        why = unplaceable({"cpu": spec.resources.cpus, "gpu": spec.resources.gpus})
        if why is not None:
            raise StudyError(why)
        sampled = spec.sampler != "grid"
        callback = LedgerCallback(
            self.ledger, study.id, record, cancel, sampled=sampled, attempts=self.settings.trial_attempts
        )
        how: dict[str, Any] = {
            "concurrency": spec.concurrency,
            "resources": {"cpu": spec.resources.cpus, "gpu": spec.resources.gpus},
            "asha": spec.scheduler == "asha",
        }
        name = f"study-{study.id}"
        measured = self._unit_memory(how["resources"], unit_memory) if spec.fuses else None
        if sampled:
            finished = self.ledger.trials(study.id, FINISHED)
            remaining = (spec.max_trials or 0) - len(finished)
            if remaining > 0:
                searcher = UnitSearcher(
                    optuna_search(spec, space, finished), space, execution(spec), spec.fuses,
                    lambda hashes: self.ledger.finished_objectives(study.id, hashes),
                )  # fmt: skip
                num_samples = math.ceil(remaining / len(space.seeds))
                tune_units(
                    self.settings, name, callback, cancel, searcher=searcher, num_samples=num_samples, **how
                )
        for _ in range(self.settings.trial_attempts):
            # pending, interrupted by a crash (running) or by a fault (pending again), cancelled, error
            try:
                todo = [
                    t.spec()
                    for t in self.ledger.trials(study.id, UNFINISHED)
                    if callback.starts.get(t.config_hash, 0) < self.settings.trial_attempts  # not spent here
                ]
            except PlanError as exc:
                raise StudyError(str(exc)) from None
            if not todo or cancel.is_set():
                return
            units = pack_study(spec, todo, measured)
            log.info("study %s: %d trials in %d Ray units", study.id, len(todo), len(units))
            record.plan(todo)
            callback.requeued = 0
            tune_units(self.settings, name, callback, cancel, units=units, **how)
            if not callback.requeued:
                return
            log.warning("study %s: %d trials were interrupted; they run again", study.id, callback.requeued)

    def _unit_memory(
        self, resources: dict[str, float], measure: Callable[[dict[str, float]], tuple[str, int] | None]
    ) -> tuple[str, int] | None:
        """A node's memory for a unit of these resources, measured at most every MEMORY_TTL seconds."""
        key = (resources["cpu"], resources["gpu"])
        cached = self._memory.get(key)
        if cached is None or time.monotonic() - cached[0] > MEMORY_TTL:
            cached = (time.monotonic(), measure(resources))
            self._memory[key] = cached
        return cached[1]

    def _reconcile_children(
        self, study_id: str, tracker: Any, exp_id: str, parent: str, criterion: Criterion
    ) -> None:
        """Every finished trial gets one complete child run (reused trials included); a run that an
        outage left incomplete is made again, and a child run no trial owns is deleted."""
        tracker.flush()  # child runs still queued have not recorded their run id yet
        children = tracker.child_statuses(exp_id, parent)
        owned = set()
        for t in self.ledger.trials(study_id, FINISHED):
            status = children.get(t.mlflow_run_id) if t.mlflow_run_id else None
            if status in ("FINISHED", "FAILED", "KILLED"):
                owned.add(t.mlflow_run_id)
                continue
            if status is not None:  # RUNNING: the outage came between its first and last request
                tracker.delete_run(t.mlflow_run_id)
            tracker.log_trial(
                exp_id, parent, t, criterion, self.ledger.matrices(t.id), _setter(self.ledger, t.id)
            )
        tracker.flush()
        owned |= {t.mlflow_run_id for t in self.ledger.trials(study_id) if t.mlflow_run_id}
        for run_id in set(children) - owned:  # a duplicate, or one whose ledger write was lost
            tracker.delete_run(run_id)

    # ----- answers -----------------------------------------------------------------------------------
    def criteria(self, study: Study, trials: Sequence[Trial]) -> tuple[Criterion, list[Criterion]]:
        """The study's success criterion, and the others it reports beside it: its spec's extra
        criteria, and the same fraction of every reference baseline its trials' tasks report (copy:
        Arjovsky's)."""
        spec = StudySpec.model_validate(study.spec)
        main = spec.criterion()
        extra = [c.criterion() for c in spec.extra_criteria]
        if main.fraction is not None:
            names = sorted({name for t in trials for name in (t.reference_baselines or {})})
            extra += [Criterion(fraction=main.fraction, baseline=name) for name in names]
        return main, [c for i, c in enumerate(extra) if c != main and c not in extra[:i]]

    def summary(self, study_id: str, criterion: Criterion | None = None) -> dict[str, Any]:
        """What the study found, under its own criterion (or `criterion`): counts, success tables
        (also against budget, and under the other criteria it reports), best configurations."""
        study = self._study(study_id)
        trials = self.ledger.trials(study_id)
        main, extra = self.criteria(study, trials)
        criterion = criterion or main
        table = success_table(trials, criterion)
        return {
            "study_id": study.id,
            "name": study.name,
            "state": study.state,
            "trainer_version": TRAINER_VERSION,
            "counts": self.ledger.counts(study_id, criterion),
            "success": table,
            "success_other_criteria": [success_table(trials, c) for c in extra],
            "success_vs_budget": success_vs_budget(trials, criterion),
            "best": best_configs(trials, k=5, criterion=criterion),
            "best_per_model": {
                m: best_configs(trials, k=1, model=m, criterion=criterion) for m in table["by_model"]
            },
            "henrici_index": henrici_table(trials, criterion),  # Orhan Table 2: d(W) of successful trials
            "mlflow": {"experiment_id": study.mlflow_experiment_id, "run_id": study.mlflow_run_id},
        }


#: seconds between two updates of a study's live counts on its parent run
PROGRESS_INTERVAL = 10.0


class StudyRecorder:
    """How the driver records a running study's trials: each in the ledger (the source of truth) and
    as a live MLflow child run (made when it starts, its curve as it evaluates, finished with it);
    the parent run's counts every PROGRESS_INTERVAL seconds; and the pace of the running trials."""

    def __init__(
        self, ledger: Ledger, tracker: Any, study_id: str, exp_id: str, parent: str, criterion: Criterion
    ) -> None:
        self.ledger, self.tracker, self.study_id = ledger, tracker, study_id
        self.exp_id, self.parent, self.criterion = exp_id, parent, criterion
        self._lock = threading.Lock()
        self._running: dict[str, tuple[int, int, float]] = {}  # config hash → (budget, step, seconds)
        self._planned: dict[str, int] = {}  # config hash → budget in steps, of trials not yet started
        self._last_progress = 0.0

    def plan(self, trials: Sequence[TrialSpec]) -> None:
        """The trials a round will run (their budgets count in the ETA until they start)."""
        with self._lock:
            for t in trials:
                self._planned.setdefault(t.config_hash, budget_steps(t))

    def started(self, trial_id: int, spec: TrialSpec) -> None:
        row = self.ledger.trial(trial_id)
        self.tracker.trial_started(self.exp_id, self.parent, row, _setter(self.ledger, trial_id))
        with self._lock:
            budget = self._planned.pop(spec.config_hash, None)
            self._running[spec.config_hash] = (budget if budget is not None else budget_steps(spec), 0, 0.0)

    def evaluated(self, trial_id: int, config_hash: str, evaluation: Evaluation) -> None:
        self.tracker.trial_evaluated(config_hash, [evaluation])
        with self._lock:
            budget = self._running.get(config_hash, (evaluation.step, 0, 0.0))[0]
            self._running[config_hash] = (budget, evaluation.step, evaluation.seconds)

    def finished(self, trial_id: int, result: TrialResult) -> None:
        row = self.ledger.finish_trial(trial_id, result)
        matrices = None
        if result.recurrent_matrix is not None:
            v = result.input_matrix
            matrices = {"W": result.recurrent_matrix.tolist(), "V": v.tolist() if v is not None else None}
        self.tracker.log_trial(
            self.exp_id, self.parent, row, self.criterion, matrices, _setter(self.ledger, trial_id)
        )
        with self._lock:
            self._running.pop(row.config_hash, None)
        self.progress()

    def progress(self, force: bool = False) -> None:
        """The parent run's live counts, at most every PROGRESS_INTERVAL seconds (or now: `force`)."""
        now = time.monotonic()
        if not force and now - self._last_progress < PROGRESS_INTERVAL:
            return
        self._last_progress = now
        self.tracker.study_progress(
            self.parent, success_table(self.ledger.trials(self.study_id), self.criterion)
        )

    def eta(self, unplanned: int = 0) -> float | None:
        """Seconds left at the measured pace of the running trials (each one's steps per second,
        summed): their remaining steps, the planned trials' budgets, and `unplanned` trials more (a
        sampler's, not drawn yet) at the mean budget; None before a running trial has evaluated."""
        with self._lock:
            running = list(self._running.values())
            planned = list(self._planned.values())
        rate = sum(step / seconds for _, step, seconds in running if step and seconds > 0)
        if rate <= 0:
            return None
        budgets = [b for b, _, _ in running] + planned
        left = sum(max(b - step, 0) for b, step, _ in running) + sum(planned)
        return (left + unplanned * (sum(budgets) / len(budgets))) / rate


def budget_steps(spec: TrialSpec) -> int:
    """A planned trial's budget in optimiser steps (its task says how many make an epoch)."""
    from trainers.schedule import Schedule

    return Schedule.of(spec.resolved.config, spec.resolved.make_task().train_size).budget


def tracking_error(study_id: str, errors: Sequence[str]) -> str | None:
    """The study's note about MLflow writes that failed (None when none did): the ledger holds every
    result, and a sync rebuilds the runs from it."""
    if not errors:
        return None
    return (
        f"MLflow: {len(errors)} writes failed ({errors[0][:300]}); the ledger has every result — "
        f"`memsweep sync {study_id}` (or the server, once MLflow answers) rebuilds the runs"
    )


def _setter(ledger: Ledger, trial_id: int) -> Callable[[str], None]:
    return lambda run_id: ledger.update_trial(trial_id, mlflow_run_id=run_id)
