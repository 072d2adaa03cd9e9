"""The Ray Tune adapter: units run as Ray trials, their reports recorded by the driver.

- `run_unit` is the function trainable a worker runs: it trains a `Unit`'s members (a fused bundle,
  or one after another) with the trainers and only reports, through `tune.report` (`train_unit`);
- `LedgerCallback` runs in the driver and is the one writer of the ledger and MLflow;
- `UnitSearcher` turns the points an Optuna sampler suggests into units of trials;
- `CancelStopper` ends a run once its study is cancelled;
- `RayTune` is the engine's executor: it starts Ray, says what no node can place, measures a unit's
  memory, and runs a study's units (a grid's, or a searcher's) to the end.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from ray.tune import Callback, Stopper
from ray.tune.search import Searcher

import trainers
from search_spaces import SearchSpace
from service.core.settings import Settings
from service.core.trial import Evaluated, Event, Finished, TrialSpec, Unit, objective
from service.store.ledger import Ledger
from service.study.nodes import NodeMemory, ensure_ray, node_name, unplaceable
from service.study.packing import bundle
from service.study.search import point_trials, suggested_point
from trainers.numerics import NumericsError
from trainers.numerics import use as use_numerics

log = logging.getLogger(__name__)

_TUNE_REGISTRY_LOCK = threading.Lock()  # see RayTune.run


# ----- the worker ----------------------------------------------------------------------------------


def _baseline(resolved: trainers.Resolved) -> float | None:
    try:
        return resolved.make_task().baseline_loss
    except Exception:  # a file-backed task without its files: the trial itself reports why
        return None


def run_unit(config: dict[str, Any]) -> None:
    """Ray Tune function trainable: the unit of `config["unit"]` trained on this worker, its
    reports through `tune.report` (`train_unit`)."""
    from ray import tune

    train_unit(config["unit"], tune.report, node_name())


def train_unit(unit: Unit, report: Callable[[dict[str, Any]], None], node: str) -> None:
    """Train the unit's members — as one fused bundle when the unit says so, else one after the
    other — reporting each evaluation and each result to `report` (Ray Tune's, on a worker).

    Every report carries `objective` (the searcher and the scheduler read it): an evaluation's loss
    over the baseline, or the mean objective of the unit's members so far, and its `events`. A bundle
    reports its members' evaluations in batches (one report per round of evaluations), so a bundle
    of K costs Ray no more reports than one trial. `node` is written into each result (where it ran)."""
    objectives = list(unit.known.values())
    todo = [m for m in unit.members if m.config_hash not in unit.known]
    if not todo:  # every member was already finished: the searcher still needs the objective
        report({"objective": statistics.fmean(objectives) if objectives else 0.0, "events": []})
        return
    # this worker process computes with the study's numerics mode from before its first computation
    # (the baselines below build tasks); a process that cannot fails each member with the reason
    with contextlib.suppress(NumericsError):
        use_numerics(todo[0].resolved.config.numerics)
    baselines = [_baseline(m.resolved) for m in todo]

    if unit.fused and len(todo) > 1:
        from trainers.fused import train_fused

        buffer: list[tuple[Evaluated, float]] = []

        def flush(events: Sequence[Event], objective_now: float) -> None:
            report({"objective": objective_now, "events": list(events)})

        def flush_buffer() -> None:
            flush([e for e, _ in buffer], statistics.fmean(o for _, o in buffer))
            buffer.clear()

        def report_member(k: int, e: trainers.Evaluation) -> None:
            # members evaluate at the same steps: a round is complete when every member reported, or
            # when a new step begins (members that stopped early or failed have left the bundle)
            if buffer and e.step != buffer[0][0].evaluation.step:
                flush_buffer()
            buffer.append((Evaluated(todo[k].config_hash, e), objective(e.val_loss, baselines[k], "done")))
            if len(buffer) >= len(todo):
                flush_buffer()

        results = train_fused([m.resolved for m in todo], report_member)
        for r in results:
            r.node = node
        objectives += [objective(r.final_val_loss, r.baseline_loss, r.status) for r in results]
        finals = [Finished(m.config_hash, r) for m, r in zip(todo, results, strict=True)]
        flush([*(e for e, _ in buffer), *finals], statistics.fmean(objectives))
        return

    for member, baseline in zip(todo, baselines, strict=True):

        def evaluated(
            e: trainers.Evaluation, key: str = member.config_hash, baseline: float | None = baseline
        ) -> None:
            report({"objective": objective(e.val_loss, baseline, "done"), "events": [Evaluated(key, e)]})

        result = trainers.train(member.resolved, evaluated)
        result.node = node
        objectives.append(objective(result.final_val_loss, result.baseline_loss, result.status))
        report({"objective": statistics.fmean(objectives), "events": [Finished(member.config_hash, result)]})


# ----- the driver ----------------------------------------------------------------------------------


class CancelStopper(Stopper):
    """Ray Tune stopper that ends the whole experiment once the study is cancelled."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return self.event.is_set()

    def stop_all(self) -> bool:
        return self.event.is_set()

    def __getstate__(self) -> dict[str, Any]:
        return {}  # Tune pickles its run config for Tuner.restore, which memsweep never uses (the ledger resumes)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.event = threading.Event()


class Recorder(Protocol):
    """What the driver does with a trial as it runs: record it in the ledger and MLflow."""

    def started(self, trial_id: int, spec: TrialSpec) -> None: ...

    def evaluated(self, trial_id: int, config_hash: str, evaluation: trainers.Evaluation) -> None: ...

    def finished(self, trial_id: int, result: trainers.TrialResult) -> None: ...


class LedgerCallback(Callback):
    """Runs in the driver: turns the workers' reports into ledger rows and MLflow child runs.

    A Ray trial that errs (its worker, node or process died) or ends before its members reported is
    an infrastructure fault, not a result: its unfinished members go back to `pending` for the next
    round (`requeued`), up to `attempts` starts in this run, and only then end as `error`."""

    def __init__(
        self,
        ledger: Ledger,
        study_id: str,
        record: Recorder,
        cancel: threading.Event,
        sampled: bool,
        attempts: int = 3,
    ) -> None:
        self.ledger, self.study_id, self.record, self.cancel = ledger, study_id, record, cancel
        self.sampled = sampled  # sampled points get their ledger rows as they start
        self.attempts = attempts
        self.ids: dict[str, int] = {}  # config hash → ledger trial id
        self.open: dict[str, set[str]] = {}  # Ray trial id → members not yet finished
        self.history: dict[str, list[trainers.Evaluation]] = {}
        self.starts: dict[str, int] = {}  # config hash → starts in this run
        self.requeued = 0  # members sent back to pending since the last round began

    def __getstate__(self) -> dict[str, Any]:
        return {}  # see CancelStopper.__getstate__: the driver keeps the live object, restore is not used

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        unit: Unit = trial.config["unit"]
        if self.sampled:
            self.ledger.add_trials(self.study_id, unit.members)
        todo = set()
        for m in unit.members:
            row_id = self.ledger.start_trial(self.study_id, m.config_hash)
            if row_id is None:  # finished already (resume, reuse)
                continue
            self.ids[m.config_hash] = row_id
            self.history[m.config_hash] = []
            self.starts[m.config_hash] = self.starts.get(m.config_hash, 0) + 1
            todo.add(m.config_hash)
            self.record.started(row_id, m)
        self.open[trial.trial_id] = todo

    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        # taken out of the result: Tune keeps its last result in the experiment state, and the
        # events (trained matrices among them) are recorded here, once
        for event in result.pop("events", []):
            key = event.config_hash
            if key not in self.ids:
                continue
            if isinstance(event, Evaluated):
                self.history[key].append(event.evaluation)
                self.record.evaluated(self.ids[key], key, event.evaluation)
            else:
                self._finish(trial.trial_id, key, event.result)

    def _finish(self, ray_trial_id: str, key: str, result: trainers.TrialResult) -> None:
        self.history.pop(key, None)
        self.record.finished(self.ids[key], result)
        self.open.get(ray_trial_id, set()).discard(key)

    def _close(self, ray_trial_id: str, how: str, reason: str) -> None:
        """The members a Ray trial left unfinished: cancelled (with the study), pruned (by the
        scheduler), or interrupted by an infrastructure fault (pending again, or error)."""
        for key in sorted(self.open.get(ray_trial_id, set())):
            history = self.history.pop(key, [])
            last = history[-1] if history else None
            if how == "cancelled" or (how == "pruned" and last is None):  # pruned before its first evaluation
                self.ledger.cancel_trial(self.ids[key], reason, history)
            elif how == "pruned":
                result = trainers.TrialResult(
                    status="pruned", reason=reason, history=history, final_val_loss=last.val_loss if last else None,
                    steps=last.step if last else 0,
                )  # fmt: skip
                self._finish(ray_trial_id, key, result)
            elif self.starts.get(key, 0) < self.attempts:
                note = f"{reason} (attempt {self.starts[key]} of {self.attempts}; it runs again)"
                self.ledger.interrupt_trial(self.ids[key], "pending", note, [])
                self.requeued += 1
            else:
                note = f"{reason} (after {self.attempts} attempts: an infrastructure fault, not a result)"
                self.ledger.interrupt_trial(self.ids[key], "error", note, history)
        self.open.pop(ray_trial_id, None)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        if self.cancel.is_set():
            self._close(trial.trial_id, "cancelled", "the study was cancelled")
        else:
            self._close(trial.trial_id, "pruned", "stopped early by the scheduler")

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._close(trial.trial_id, "interrupted", f"its Ray worker failed: {error_summary(trial)}")

    def close_unfinished(self, how: str, reason: str) -> None:
        for ray_trial_id in list(self.open):
            self._close(ray_trial_id, how, reason)


def error_summary(trial: Any) -> str:
    """One line a person can read from a Ray trial's error (the whole traceback is in Ray's logs)."""
    try:
        error = trial.get_error()
    except Exception:  # the error text is best effort
        return "no error text from Ray"
    if error is None:
        return "the worker process or its node died"
    text = str(error).strip().splitlines()
    cause = next(
        (line for line in reversed(text) if line.strip() and not line.startswith(" ")),
        text[-1] if text else "",
    )
    return f"{type(error).__name__}: {cause.strip()[:300]}"


class UnitSearcher(Searcher):
    """An Optuna searcher's points as units: each suggested point × the space's seeds, resolved
    here in the driver (`service.study.search.point_trials`); members already finished in the ledger are
    counted, not trained again."""

    def __init__(
        self,
        inner: Searcher,
        space: SearchSpace,
        settings: Mapping[str, Any],
        fused: bool,
        known: Callable[[Iterable[str]], dict[str, float]],
    ) -> None:
        super().__init__(metric="objective", mode="min")
        self.inner, self.space, self.settings, self.fused, self.known = inner, space, settings, fused, known
        self.models = {m.name: m for m in space.models}

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        return bool(self.inner.set_search_properties(metric, mode, config, **spec))

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        return bool(self.inner.set_max_concurrency(max_concurrent))

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        config: Any = self.inner.suggest(trial_id)
        if config is None or config == Searcher.FINISHED:
            return config  # type: ignore[no-any-return]
        name, point = suggested_point(config)
        members = point_trials(self.space, self.models[name], point, self.settings)
        unit = bundle(members, fused=self.fused)
        known = self.known([m.config_hash for m in members])
        return {"unit": Unit(unit.members, unit.fused, known)}

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        self.inner.on_trial_result(trial_id, result)

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        self.inner.on_trial_complete(trial_id, result=result, error=error)

    def save(self, checkpoint_path: str) -> None:
        """Nothing: a study resumes from the ledger, never from Tune's checkpoints."""

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its config for Tuner.restore, which memsweep never uses; the ledger lookup
        # (a database connection) stays with the live object
        return {**self.__dict__, "known": None}


class RayTune:
    """The engine's executor on Ray: starts (or joins) Ray, says what its nodes cannot place, measures
    a unit's memory on a node that would run it, and runs a round of units (or a searcher's points)
    as Ray Tune trials. Tests put an in-process executor with the same methods in its place."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.node_memory = NodeMemory()

    def start(self) -> None:
        ensure_ray(self.settings)

    def unplaceable(self, resources: Mapping[str, float]) -> str | None:
        return unplaceable(resources)

    def run(
        self,
        name: str,
        callback: LedgerCallback,
        cancel: threading.Event,
        *,
        units: Sequence[Unit] = (),
        searcher: Searcher | None = None,
        num_samples: int = 1,
        concurrency: int,
        resources: Mapping[str, float],
        asha: bool = False,
    ) -> None:
        """Run the units (a grid's) or `num_samples` suggestions of `searcher` as Ray trials, to the end
        or to a cancel; members left unfinished are closed as cancelled or failed."""
        from ray import tune
        from ray.tune import FailureConfig, RunConfig, TuneConfig

        self.start()
        scheduler = None
        if asha:
            from ray.tune.schedulers import ASHAScheduler

            scheduler = ASHAScheduler(time_attr="training_iteration", grace_period=2, reduction_factor=3)
        # Tune's registries (trainables) are process-wide dicts that every registration iterates: two
        # studies starting at once in one server raced on them ("dictionary changed size during
        # iteration"). Register under a lock and hand Tune the name.
        trainable_name = f"memsweep-{name}-{time.time_ns()}"
        with _TUNE_REGISTRY_LOCK:
            tune.register_trainable(trainable_name, tune.with_resources(run_unit, dict(resources)))
        tuner = tune.Tuner(
            trainable_name,
            param_space={"unit": tune.grid_search(list(units))} if searcher is None else {},
            tune_config=TuneConfig(
                metric="objective",
                mode="min",
                search_alg=searcher,
                scheduler=scheduler,
                num_samples=num_samples,
                max_concurrent_trials=concurrency,
                reuse_actors=True,
                trial_dirname_creator=_trial_dirname,
            ),
            run_config=RunConfig(
                name=f"{name}-{int(time.time())}",
                storage_path=str(self.settings.home / "ray_results"),
                callbacks=[callback],
                failure_config=FailureConfig(max_failures=0),
                stop=CancelStopper(cancel),
                verbose=0,
            ),
        )
        tuner.fit()
        callback.close_unfinished(
            "cancelled" if cancel.is_set() else "interrupted",
            "its Ray trial ended before this member reported",
        )


def _trial_dirname(trial: Any) -> str:
    return str(trial.trial_id)  # Tune's default name embeds the whole config: too long for a path
