"""The study lifecycle: create, extend, run, summarise.

    engine = Engine(get_settings())
    study = engine.create_study(spec)          # validates, enumerates the grid into the ledger
    summary = engine.run_study(study.id)       # runs what is not finished; resumable at any point

The ledger is the source of truth: a run that dies midway is resumed by calling `run_study` again
(only pending or interrupted trials run); `extend_study` adds only new points; a finished trial of
any study with the same config hash is reused. The driver is the only writer of the ledger and of
MLflow; Ray workers only report (`service.ray_tune`). A study's trials come from `service.search`,
travel as `TrialSpec`s and units (`service.trial`, `service.packing`), and come back as
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
from service.ledger import FINISHED, Ledger, Study, Trial
from service.packing import pack
from service.search import check_space, execution, grid_trials, optuna_search
from service.settings import Settings
from service.spec import StudyError, StudySpec
from service.summary import best_configs, henrici_table, success_table, success_vs_budget
from service.trial import PlanError, TrialSpec
from trainers import TRAINER_VERSION, Criterion, TrialResult

log = logging.getLogger(__name__)

#: where a run's time goes, in order (`run_study`'s summary["seconds"])
RUN_PHASES = ("ray_tune", "tracking_backlog", "summary_and_plots", "parent_run")
#: trials a run takes up: never started, interrupted by a crash (running), or stopped with their study
UNFINISHED = ("pending", "running", "cancelled")


class Engine:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        settings.home.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger(settings.resolved_database_url())
        self._tracking_uri: str | None = None

    # ----- creation --------------------------------------------------------------------------------
    def create_study(self, spec: StudySpec) -> Study:
        space = self._space(spec)
        trials = self._trials(spec, space)
        study = self.ledger.create_study(spec.name or space.name, spec.model_dump(mode="json"))
        self.ledger.add_trials(study.id, trials)
        return study

    def extend_study(self, study_id: str, spec: StudySpec) -> int:
        """Replace the study's spec with a larger one; only points not yet in the ledger are added."""
        study = self._study(study_id)
        if StudySpec.model_validate(study.spec).sampler != spec.sampler:
            raise StudyError("extend keeps the sampler; create a new study to change it")
        space = self._space(spec)
        added = self.ledger.add_trials(study.id, self._trials(spec, space))
        self.ledger.update_study(study.id, spec=spec.model_dump(mode="json"), state="pending")
        return added

    def _space(self, spec: StudySpec) -> SearchSpace:
        try:
            space = spec.search_space()
        except (ValueError, KeyError) as exc:
            raise StudyError(str(exc)) from None
        check_space(space)
        if spec.sampler == "grid":
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
            from service.tracking import ensure_mlflow_server

            s = self.settings
            self._tracking_uri = ensure_mlflow_server(s.mlflow_tracking_uri, s.home, s.mlflow_port)
        return self._tracking_uri

    def run_study(self, study_id: str, cancel: threading.Event | None = None) -> dict[str, Any]:
        """Run every trial of the study that is not finished; returns the study summary.

        `cancel`: set it (from another thread) to stop the run; unfinished trials stay resumable."""
        from service.tracking import Tracker

        study = self._study(study_id)
        spec = StudySpec.model_validate(study.spec)
        space = self._space(spec)
        cancel = cancel if cancel is not None else threading.Event()
        tracker = Tracker(self.tracking_uri(), self.settings.mlflow_experiment)
        exp_id, parent = tracker.start_study(study.id, study.name, study.spec, study.mlflow_run_id)
        self.ledger.update_study(
            study.id, state="running", error=None, mlflow_experiment_id=exp_id, mlflow_run_id=parent
        )
        marks = [time.perf_counter()]
        try:
            recorder = self._recorder(tracker, exp_id, parent, spec.criterion())
            self._run_units(study, spec, space, recorder, cancel)
            state = "cancelled" if cancel.is_set() else "done"
        except Exception as exc:
            log.exception("study %s failed", study.id)
            self.ledger.update_study(study.id, state="failed", error=f"{type(exc).__name__}: {exc}")
            tracker.close()
            raise
        marks.append(time.perf_counter())
        self._backfill_tracking(study.id, tracker, exp_id, parent, spec.criterion())
        marks.append(time.perf_counter())
        summary = self.summary(study.id)
        try:
            from service.plots import study_figures

            figures = study_figures(self.ledger.trials(study.id), summary, spec.criterion())
        except Exception as exc:  # a plot never fails a finished study
            log.warning("study %s: plots failed: %s", study.id, exc)
            figures = {}
        marks.append(time.perf_counter())
        tracker.log_summary(parent, summary, figures, "FINISHED" if state == "done" else "KILLED")
        errors = tracker.flush()
        marks.append(time.perf_counter())
        phases = dict(zip(RUN_PHASES, (b - a for a, b in pairwise(marks)), strict=True))
        log.info("study %s: %s", study.id, ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()))
        tracker.close()
        self.ledger.update_study(study.id, state=state, error="; ".join(errors[:3]) if errors else None)
        summary["state"] = state
        summary["seconds"] = phases
        return summary

    def _recorder(
        self, tracker: Any, exp_id: str, parent: str, criterion: Criterion
    ) -> Callable[[int, TrialResult], None]:
        """How the driver records a finished trial: its ledger row, then its MLflow child run."""

        def record(trial_id: int, result: TrialResult) -> None:
            row = self.ledger.finish_trial(trial_id, result)
            matrices = None
            if result.recurrent_matrix is not None:
                v = result.input_matrix
                matrices = {"W": result.recurrent_matrix.tolist(), "V": v.tolist() if v is not None else None}
            tracker.log_trial(exp_id, parent, row, criterion, matrices, _setter(self.ledger, trial_id))

        return record

    def _run_units(
        self,
        study: Study,
        spec: StudySpec,
        space: SearchSpace,
        record: Callable[[int, TrialResult], None],
        cancel: threading.Event,
    ) -> None:
        """The study's unfinished trials through Ray Tune: a grid's packed into units, or a sampler's
        points as they are drawn, up to `max_trials`."""
        from service.ray_tune import LedgerCallback, UnitSearcher, tune_units

        sampled = spec.sampler != "grid"
        callback = LedgerCallback(self.ledger, study.id, record, cancel, sampled=sampled)
        how: dict[str, Any] = {
            "concurrency": spec.concurrency,
            "resources": {"cpu": spec.resources.cpus, "gpu": spec.resources.gpus},
            "asha": spec.scheduler == "asha",
        }
        if not sampled:
            # Interrupted trials (status running, from a crash) run again; failed ones stay failed.
            try:
                todo = [t.spec() for t in self.ledger.trials(study.id, UNFINISHED)]
            except PlanError as exc:
                raise StudyError(str(exc)) from None
            if not todo:
                return
            units = pack(
                todo, fused=spec.fuses, slots=spec.concurrency, size=spec.bundle_size,
                device="cuda" if spec.resources.gpus > 0 else "cpu", gpus_per_unit=spec.resources.gpus,
            )  # fmt: skip
            if len(units) < len(todo):
                log.info("study %s: %d trials packed into %d Ray units", study.id, len(todo), len(units))
            tune_units(self.settings, f"study-{study.id}", callback, cancel, units=units, **how)
            return
        finished = self.ledger.trials(study.id, FINISHED)
        remaining = (spec.max_trials or 0) - len(finished)
        if remaining <= 0:
            return
        searcher = UnitSearcher(
            optuna_search(spec, space, finished), space, execution(spec), spec.fuses,
            lambda hashes: self.ledger.finished_objectives(study.id, hashes),
        )  # fmt: skip
        num_samples = math.ceil(remaining / len(space.seeds))
        tune_units(
            self.settings,
            f"study-{study.id}",
            callback,
            cancel,
            searcher=searcher,
            num_samples=num_samples,
            **how,
        )

    def _backfill_tracking(
        self, study_id: str, tracker: Any, exp_id: str, parent: str, criterion: Criterion
    ) -> None:
        """Every finished trial gets its child run, reused ones included."""
        tracker.flush()  # child runs still queued have not recorded their run id yet
        for t in self.ledger.trials(study_id, FINISHED):
            if t.mlflow_run_id is None:
                matrices = self.ledger.matrices(t.id)
                tracker.log_trial(exp_id, parent, t, criterion, matrices, _setter(self.ledger, t.id))

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


def _setter(ledger: Ledger, trial_id: int) -> Callable[[str], None]:
    return lambda run_id: ledger.update_trial(trial_id, mlflow_run_id=run_id)
