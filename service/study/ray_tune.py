"""The Ray Tune adapter: a study run's units as Ray trials, what happens to them told to the driver's book.

- `run_unit` is the function trainable a worker runs (`service.study.worker.train_unit`: it trains
  a unit's members and only reports, through `tune.report`);
- `BookCallback` runs in the driver and tells the study's `TrialBook` what the Ray trials do;
- `UnitQueue` is a grid's round of units as Ray Tune's searcher, which takes back at once the members a
  fault sent back;
- `UnitSearcher` is a sampling's `Draws` as Ray Tune's searcher: Optuna's points, each a unit of trials;
- `CancelStopper` ends a run once its study is cancelled;
- `PrimedAsha` is an asha study's scheduler: Ray's ASHA rule on Tune's public scheduler API, its rungs
  holding the study's points finished before the run;
- `RayTune` is the engine's executor: it starts and stops Ray, says what no node can place, what the
  cluster has and which plugins each node has, measures a unit's memory, runs tasks (a plan's
  calibrations) and runs a `RunRequest` (a round of units, or a sampler's draws) to the end.

With `service.study.nodes` (starting, joining and reaping Ray; its nodes), the one module of the
service that uses Ray's API: the runner, the plans, the application and the API ask the executor.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from ray.tune import Callback, Stopper
from ray.tune.schedulers import FIFOScheduler
from ray.tune.search import Searcher

from service.core.settings import Settings
from service.core.spec import ASHA_MAX_EVALUATIONS, Asha
from service.core.trial import Unit
from service.study.book import TrialBook
from service.study.executor import RunRequest, Task, TaskResult
from service.study.nodes import (
    NodeMemory,
    embedded,
    ensure_ray,
    node_name,
    node_plugins,
    shutdown_ray,
    unplaceable,
    unplaceable_here,
)
from service.study.packing import bundle
from service.study.search import Draws, Sampling
from service.study.worker import train_unit

log = logging.getLogger(__name__)

_TUNE_REGISTRY_LOCK = threading.Lock()  # see RayTune.run
#: seconds between two looks at `run_tasks`'s cancel while its tasks run
CANCEL_POLL = 0.5


def run_unit(config: dict[str, Any]) -> None:
    """Ray Tune function trainable: the unit of `config["unit"]` trained on this worker, its
    reports through `tune.report` (`service.study.worker.train_unit`)."""
    from ray import tune

    train_unit(config["unit"], tune.report, node_name())


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


class BookCallback(Callback):
    """Runs in the driver: tells the study's `TrialBook` what Ray Tune's trials do (the book records
    them in the ledger and MLflow). A Ray trial that errs (its worker, node or process died) is an
    infrastructure fault, not a result (`TrialBook.failed`)."""

    def __init__(
        self,
        book: TrialBook,
        again: Callable[[Unit], None] | None = None,
        tick: Callable[[], None] | None = None,
    ) -> None:
        """`again`: takes a unit of the members a fault sent back, to run them in this run; `tick`:
        called at each turn of Tune's loop (`RunRequest.tick`)."""
        self.book = book
        self.again = again
        self.tick = tick

    def __getstate__(self) -> dict[str, Any]:
        return {}  # see CancelStopper.__getstate__: the driver keeps the live object, restore is not used

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.book.started(trial.trial_id, trial.config["unit"])

    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        # taken out of the result: Tune keeps its last result in the experiment state, and the
        # events (trained matrices among them) are recorded by the book, once
        placement = result.pop("placement", None)
        if placement is not None:
            self.book.placed(trial.trial_id, placement)
        self.book.reported(trial.trial_id, result.pop("events", []))

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        self.book.tick()
        if self.tick is not None:
            self.tick()

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.book.ended(trial.trial_id)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        # the unit too: a trial whose actor died before it started was never `started`
        unit: Unit = trial.config["unit"]
        why = error_summary(trial)
        back = set(self.book.failed(trial.trial_id, f"its Ray worker failed: {why}", unit))
        log.warning(
            "a unit of %d trials lost its Ray worker (%s); %d of them run again%s",
            len(unit.members), why, len(back), "" if back else " (none: finished, or out of attempts)",
        )  # fmt: skip
        if back and self.again is not None:
            self.again(bundle([m for m in unit.members if m.config_hash in back], fused=unit.fused,
                              lockstep=unit.lockstep))  # fmt: skip


def error_summary(trial: Any) -> str:
    """One line a person can read from a Ray trial's error (the whole traceback is in Ray's logs): the
    error Tune has just written into the trial's folder on this machine (`Trial.get_error` reads the
    trial's storage, which it syncs later, so a unit whose worker failed to start, a plugin its node
    cannot import, read as a dead worker), else its storage's text."""
    from ray import cloudpickle

    name, text = None, None
    try:
        if trial.pickled_error_file and os.path.exists(trial.pickled_error_file):
            with contextlib.suppress(Exception):  # an error class this process cannot import: the text
                with open(trial.pickled_error_file, "rb") as f:
                    error = cloudpickle.load(f)
                name, text = type(error).__name__, str(error)
        if text is None and trial.error_file and os.path.exists(trial.error_file):
            with open(trial.error_file) as f:
                text = f.read()
        if text is None:
            text = trial.get_error()
    except Exception:  # the error text is best effort
        return "no error text from Ray"
    if not text:
        return "the worker process or its node died"
    lines = str(text).strip().splitlines()
    cause = next(
        (line for line in reversed(lines) if line.strip() and not line.startswith(" ")),
        lines[-1] if lines else "",
    ).strip()[:300]
    return f"{name}: {cause}" if name else cause


class UnitQueue(Searcher):
    """A grid's round of units as Ray Tune's searcher, in order, each as `dispatch` leaves it when it
    leaves the queue (`RunRequest.dispatch`). A unit of the members a fault sent back (`again`: a
    worker, its process or its node died) goes to the head of the queue and trains on the next free
    slot; before, it waited for the round's last unit to end, however long that took. No unit is taken
    back under asha, whose units carry their points' finished seeds: the engine's next round rebuilds
    them from the ledger."""

    def __init__(
        self,
        units: Sequence[Unit],
        cancel: threading.Event,
        dispatch: Callable[[Unit], Unit | None] | None = None,
    ) -> None:
        super().__init__(metric="objective", mode="min")
        self.queue = deque(units)
        self.cancel = cancel
        self.dispatch = dispatch
        self.live: set[str] = set()

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:  # type: ignore[override]  # FINISHED: a str
        while self.queue and not self.cancel.is_set():
            queued = self.queue.popleft()
            unit = queued if self.dispatch is None else self.dispatch(queued)
            if unit is not None:
                self.live.add(trial_id)
                return {"unit": unit}
        # None: Tune asks again later (a live unit may still send members back); FINISHED ends the run
        return None if self.live and not self.cancel.is_set() else Searcher.FINISHED

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        self.live.discard(trial_id)  # Tune tells this before its callbacks' `on_trial_error` (`again`)

    def again(self, unit: Unit) -> None:
        self.queue.appendleft(unit)  # first: it waits for no other queued unit, only a free slot

    def save(self, checkpoint_path: str) -> None:
        """Nothing: a study resumes from the ledger, never from Tune's checkpoints."""

    def __getstate__(self) -> dict[str, Any]:
        # see UnitSearcher.__getstate__: the live object stays (its dispatch holds the ledger)
        return {**self.__dict__, "cancel": None, "dispatch": None}


class UnitSearcher(Searcher):
    """A sampling's draws as Ray Tune's searcher: each suggestion one unit (`Draws`), each finished
    Ray trial's objective told to the sampler."""

    def __init__(self, sampling: Sampling) -> None:
        super().__init__(metric="objective", mode="min")
        self.draws = Draws(sampling)

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        unit = self.draws.ask(trial_id)
        return None if unit is None else {"unit": unit}  # None: Tune asks again later

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        if error or not result:
            self.draws.tell(trial_id, None)
        elif result.get("complete"):
            self.draws.tell(trial_id, result.get("objective"))
        else:  # stopped by the scheduler (or a cancel) after some rounds: Optuna's pruned trial
            stopped = max(int(result.get("evaluations", 0)), int(result.get("pruned_at", 0)))
            self.draws.tell(trial_id, result.get("objective"), pruned_at=stopped)

    def save(self, checkpoint_path: str) -> None:
        """Nothing: a study resumes from the ledger, never from Tune's checkpoints."""

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its config for Tuner.restore, which memsweep never uses; the draws (the
        # sampling's ledger lookup holds a database connection) stay with the live object
        return {**self.__dict__, "draws": None}


class PrimedAsha(FIFOScheduler):
    """Asynchronous successive halving in evaluations (`service.study.worker.Reports`), Ray Tune's ASHA
    with one bracket to the letter, its rungs holding the study's points finished before this run
    (`history`: each one's objective by evaluations), so that a resumed or extended study judges a new
    point against them as one run would have. Built on Tune's public scheduler API: Ray's ASHA keeps
    its rungs private. A unit ends by itself at the end of its budget: no stop at max_t, which only
    bounds the rungs.

    Rungs at grace_period × reduction_factor^k evaluations below `ASHA_MAX_EVALUATIONS`; a unit reaching
    one (its highest, when it passed several at once) goes on when its objective is no worse than the
    (1 − 1 / reduction_factor) quantile of those recorded there before it (NaN ignored; none recorded:
    it goes on), and is recorded there, once; a unit's last result is recorded too."""

    def __init__(self, asha: Asha, history: Sequence[Mapping[int, float]]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.reduction_factor = asha.reduction_factor
        count = int(np.log(ASHA_MAX_EVALUATIONS / asha.grace_period) / np.log(self.reduction_factor) + 1)
        #: each rung, lowest first: its milestone and what reached it (trial id → objective)
        self.rungs = [
            (asha.grace_period * self.reduction_factor**k, dict[str, float]()) for k in range(count)
        ]
        for i, values in enumerate(history):
            for milestone, recorded in self.rungs:
                at = math.ceil(milestone)  # the first report at or past the milestone
                if at in values:
                    recorded[f"before-{i}"] = values[at]
        self.mode: str | None = None

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        if (self.mode and mode) or not super().set_search_properties(metric, mode, **spec):
            return False
        self.mode = mode or self.mode
        return True

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        if self.mode not in ("min", "max"):
            raise ValueError(
                f"PrimedAsha needs mode 'min' or 'max', not {self.mode!r}: give it to TuneConfig"
            )

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        return self.judge(trial.trial_id, result)

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> None:
        self.judge(trial.trial_id, result)

    def judge(self, trial_id: str, result: Mapping[str, Any]) -> str:
        """STOP or CONTINUE for a unit's result, recorded at the highest rung it reached first."""
        if "evaluations" not in result or self.metric not in result:
            return self.CONTINUE
        sign = 1.0 if self.mode == "max" else -1.0  # as Ray's ASHA: the larger, the better
        for milestone, recorded in reversed(self.rungs):
            if result["evaluations"] < milestone:
                continue
            if trial_id in recorded:  # judged there already
                return self.CONTINUE
            before = [sign * v for v in recorded.values()]
            recorded[trial_id] = result[self.metric]
            worse = bool(before) and sign * result[self.metric] < np.nanpercentile(
                before, (1 - 1 / self.reduction_factor) * 100
            )
            return self.STOP if worse else self.CONTINUE
        return self.CONTINUE


class RayTune:
    """The engine's executor on Ray: starts (or joins) Ray, says what its nodes cannot place, measures
    a unit's memory on a node that would run it, and runs a `RunRequest` as Ray Tune trials."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.node_memory = NodeMemory()

    def start(self) -> None:
        ensure_ray(self.settings)

    def stop(self) -> None:
        shutdown_ray(self.settings)

    def unplaceable(self, resources: Mapping[str, float]) -> str | None:
        import ray

        if ray.is_initialized():
            return unplaceable(resources, self.settings if embedded(self.settings) else None)
        # an embedded Ray is this machine's, up or not; a cluster is asked once joined
        return unplaceable_here(self.settings, resources) if embedded(self.settings) else None

    def resources(self) -> Mapping[str, float] | None:
        import ray

        if not ray.is_initialized():
            return None
        total = ray.cluster_resources()  # type: ignore[no-untyped-call]
        return {"cpu": float(total.get("CPU", 0.0)), "gpu": float(total.get("GPU", 0.0))}

    def node_plugins(self) -> Mapping[str, Mapping[str, str]] | None:
        return None if embedded(self.settings) else node_plugins()

    def run_tasks(
        self,
        tasks: Sequence[Task],
        resources: Mapping[str, float],
        slots: int,
        timeout: float,
        cancel: threading.Event | None = None,
    ) -> list[TaskResult | None]:
        """Each task as a Ray task (no retry) with these resources, at most `slots` at once, its
        `env` in its worker's runtime environment (a worker process of its own for each)."""
        import ray

        self.start()
        cpus, gpus = float(resources.get("cpu", 0.0)), float(resources.get("gpu", 0.0))
        remotes: dict[Callable[..., Any], Any] = {}
        deadline = time.monotonic() + timeout
        todo, out = list(range(len(tasks))), list[TaskResult | None]([None] * len(tasks))
        running: dict[Any, int] = {}
        stopped = cancel.is_set if cancel is not None else lambda: False
        while (todo or running) and not stopped():
            while todo and len(running) < max(slots, 1) and time.monotonic() < deadline:
                i = todo.pop(0)
                task = tasks[i]
                if task.fn not in remotes:
                    remotes[task.fn] = ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=0)(task.fn)
                remote = remotes[task.fn]
                if task.env:
                    remote = remote.options(runtime_env={"env_vars": dict(task.env)})
                running[remote.remote(*task.args)] = i
            left = deadline - time.monotonic()
            done, _ = ray.wait(list(running), num_returns=1, timeout=max(0.0, min(left, CANCEL_POLL)))
            for ref in done:  # a result that came in is kept, even as a cancel comes
                i = running.pop(ref)
                try:
                    out[i] = TaskResult(value=ray.get(ref))
                except Exception as exc:  # the task itself died (out of memory, a lost node)
                    out[i] = TaskResult(error=exc)
            if not done and left <= CANCEL_POLL:
                break
        for ref in running:
            ray.cancel(ref, force=True)
        return out

    def run(self, request: RunRequest, book: TrialBook) -> None:
        """Run the request's units (a round's) or its sampler's draws as Ray trials, to the end or to
        its cancel; members left unfinished are closed as cancelled or interrupted."""
        from ray import tune
        from ray.tune import FailureConfig, RunConfig, TuneConfig

        self.start()
        scheduler = None
        if request.asha is not None:
            scheduler = PrimedAsha(request.asha, request.asha_history)
        # Tune's registries (trainables) are process-wide dicts that every registration iterates: two
        # studies starting at once in one server raced on them ("dictionary changed size during
        # iteration"). Register under a lock and hand Tune the name: one per resource shape, registered
        # again at each run (a Ray started anew has lost it) over the same trainable, so that a server's
        # runs do not pile names up in the registry and Ray's key-value store (one per run, before).
        trainable_name = trainable_for(request.resources)
        with _TUNE_REGISTRY_LOCK:
            tune.register_trainable(trainable_name, tune.with_resources(run_unit, dict(request.resources)))
        searcher: UnitSearcher | UnitQueue = (
            UnitSearcher(request.sampling)
            if request.sampling
            else UnitQueue(request.units, request.cancel, request.dispatch)
        )
        again = searcher.again if isinstance(searcher, UnitQueue) and request.asha is None else None
        # Tune keeps its experiment's state in a folder that nothing reads (the ledger resumes a study,
        # never Tuner.restore): one for this run, removed once it ends (runs had piled up in ray_results)
        results = self.settings.home / "ray_results"
        results.mkdir(parents=True, exist_ok=True)
        storage = Path(tempfile.mkdtemp(prefix=f"{request.name}-", dir=results))
        tuner = tune.Tuner(
            trainable_name,
            param_space={},
            tune_config=TuneConfig(
                metric="objective",
                mode="min",
                search_alg=searcher,
                scheduler=scheduler,
                num_samples=request.sampling.count if request.sampling else -1,  # -1: until the queue ends
                max_concurrent_trials=request.concurrency,
                reuse_actors=True,
                trial_dirname_creator=_trial_dirname,
            ),
            run_config=RunConfig(
                name=f"{request.name}-{int(time.time())}",
                storage_path=str(storage),
                callbacks=[BookCallback(book, again, request.tick)],
                failure_config=FailureConfig(max_failures=0),
                stop=CancelStopper(request.cancel),
                verbose=0,
            ),
        )
        try:
            tuner.fit()
        finally:
            shutil.rmtree(storage, ignore_errors=True)
        book.close_unfinished("its Ray trial ended before this member reported")


def trainable_for(resources: Mapping[str, float]) -> str:
    """The name `run_unit` is registered under with these resources: one per resource shape."""
    return "memsweep-unit-" + "-".join(f"{k}{float(v):g}" for k, v in sorted(resources.items()))


def _trial_dirname(trial: Any) -> str:
    return str(trial.trial_id)  # Tune's default name embeds the whole config: too long for a path
