"""The driver's book of a study's running trials: which member runs in which executor trial, how often
it started in this run, what it reported — and what becomes of members an executor trial left
unfinished (cancelled, pruned, sent back to pending, or ended as an error). The engine owns it and an
executor only tells it what happened (`Executor`, `service.study.executor`); it knows no Ray."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import trainers
from service.core.states import UNFINISHED
from service.core.trial import Evaluated, Event, TrialSpec, Unit
from service.store.ledger import Ledger
from service.store.patience import outage
from trainers.model import build_model, count_params
from trainers.runtime import record_plugins, record_task
from trainers.schedule import Schedule

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # the worker's record of where it trains; the book only keeps it
    from service.study.worker import Placement

#: the reason of a trial, and the note of its study, that a run stopped because its process did (a
#: server's shutdown, a Ctrl-C or SIGTERM of `memsweep run`), not its user: pending, to resume at the next start
SHUTDOWN_NOTE = (
    "interrupted: its runner stopped (a server shutdown, a Ctrl-C or SIGTERM); the next start resumes it"
)
#: the reason of a trial its study's user cancelled it with
CANCEL_NOTE = "the study was cancelled"
#: what follows the outage (`service.store.patience.outage`) in the reason of a trial its run left
#: unfinished when the driver's ledger did not answer past its patience: the driver's fault, not the trial's
OUTAGE_NOTE = (
    "pending, no attempt spent (the ledger's outage, not the trial's fault): it trains when its study "
    "runs again, which its server (or `memsweep run`) starts once the ledger answers"
)
#: the reason of a trial whose result came while the ledger did not answer (`TrialBook.kept`)
KEPT_NOTE = (
    "its result came while the ledger did not answer: it is kept on this machine's disk (the home's "
    "unwritten/ folder) and written when the study runs here again (once the ledger answers, by this "
    "process or the next), without training it again"
)


class Stop:
    """Why a study's run stops: one cause for the study and every trial the run leaves unfinished.
    Its user's cancel ends them `cancelled` (CANCEL_NOTE); its process stopping (a server's shutdown,
    a Ctrl-C) leaves them `pending` with SHUTDOWN_NOTE, for the next start. `event` is set by either,
    and is what the executor, a plan's calibrations and the study's claim watch (a lost claim sets it
    alone: that run raises, and what it stopped reads cancelled).

    A user's cancel wins over a shutdown, one under way too: the user asked for the study to end, and
    the next start would resume it; a shutdown never turns a cancel back. The run's end reads the
    cause once (`settle`): a cancel after that is refused, the run having ended (before, a cancel
    during a shutdown left some trials `pending`, some `cancelled`)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._lock = threading.Lock()
        self._shutdown = False
        self._by_user = False
        self._settled = False

    def cancel(self) -> bool:
        """The user's cancel; False when it comes too late: the run has ended (done, cancelled, or
        paused by a shutdown), and nothing of it is left to stop."""
        with self._lock:
            if self._settled:
                return False
            self._by_user, self._shutdown = True, False
            self.event.set()
            return True

    def shut_down(self) -> None:
        """The process stops: the cause, unless the user cancelled first or the run has ended."""
        with self._lock:
            if not self._settled:
                self._shutdown = not self._by_user
            self.event.set()

    @property
    def by_user(self) -> bool:
        return self._by_user

    def settle(self) -> str | None:
        """The run's end: the state its stop ends the study in (`pending`, `cancelled`), None when
        nothing stopped it; from the first call on, the cause no longer changes."""
        with self._lock:
            self._settled = True
            return self.outcome()[0] if self.event.is_set() else None

    def outcome(self) -> tuple[str, str]:
        """(status, reason) of what the stop leaves unfinished; the status is also the study's state."""
        return ("pending", SHUTDOWN_NOTE) if self._shutdown else ("cancelled", CANCEL_NOTE)


class Recorder(Protocol):
    """What the driver does with a trial as it runs: record it in the ledger and MLflow
    (`service.study.recorder.StudyRecorder`)."""

    def started(self, trial_id: int, spec: TrialSpec) -> None: ...

    def evaluated(self, trial_id: int, config_hash: str, history: Sequence[trainers.Evaluation]) -> None: ...

    def write_evaluations(self) -> None: ...

    def finished(self, trial_id: int, result: trainers.TrialResult) -> None: ...

    def stopped(self, trial_id: int, config_hash: str, status: str, reason: str) -> None: ...

    def restated(self, trial_id: int, status: str, reason: str) -> None: ...


class TrialBook:
    """A study run's trials as an executor runs them, recorded by the driver (the one writer of the
    ledger and MLflow).

    Lifecycle, per executor trial (`run`: the executor's own key of it, e.g. Ray's trial id):

    1. `started(run, unit)` once, when the unit's worker starts: each member not finished yet is
       started in the ledger and counted (`starts`);
    2. `reported(run, events)` any number of times: evaluations and finished members, in order
       (and `tick()` between them, as often as the executor's loop turns); `placed(run, placement)`
       at most once, before the events of the report that carried it: where its worker trains, which
       the members a scheduler stops record (their results, which say it, never come);
    3. then exactly one of `ended(run)` (the executor trial returned or was stopped: the members it
       did not finish are stopped with the run (see below), else pruned by the scheduler) or
       `failed(run, reason, unit)` (its worker, process or node died: an infrastructure fault, not a
       result; its unfinished members go back to `pending` — `requeued` — up to `attempts` tries in
       this run, and only then end as `error`). An executor trial whose worker died before it
       started (1. never came: Ray's actor died while it was placed or importing) fails the same way:
       its unit's members are each one try further, and requeued or ended as error.

    `failed` returns the members it sent back, for an executor that runs them again in the same run
    (`RayTune` does for a grid: they wait for the next free slot, not for the round's last unit).
    After the executor's run, `close_unfinished` closes what no `ended`/`failed` reached. The engine
    then runs another round of what is still unfinished: `begin_round` clears `requeued`, and `spent`
    says which trials used their starts; a member may thus be `started` again under a new `run` key.

    A run stops once its `stop` is set (`Stop`): by its user (its unfinished members end `cancelled`
    with the study), or by its process stopping (a server's shutdown, a Ctrl-C), which leaves them
    `pending` with SHUTDOWN_NOTE, for the next start, in the ledger and MLflow alike (before, they read
    `cancelled` as by a user until the runner rewrote them, and a kill meanwhile left them so). At the
    run's end `settle` reads the cause once: a user's cancel that came while a shutdown stopped the run
    ends the members already left pending `cancelled` too.

    A run whose ledger does not answer past its patience (`service.store.patience.outage`) ends with
    that error; its open members go back to `pending` with no attempt spent (`pause_unfinished`: the
    driver's fault, not theirs), and a result that came and could not be written is kept (`kept`, the
    engine's for the study: on disk, `service.study.kept`) and written by the study's next run on this
    machine (`write_kept`) before anything trains, by this process or the next."""

    def __init__(
        self,
        ledger: Ledger,
        study_id: str,
        record: Recorder,
        stop: Stop,
        sampled: bool,
        attempts: int = 3,
        kept: MutableMapping[str, trainers.TrialResult] | None = None,
    ) -> None:
        self.ledger, self.study_id, self.record, self.stop = ledger, study_id, record, stop
        #: config hash → a result the ledger did not take (an outage): written by the study's next run
        self.kept: MutableMapping[str, trainers.TrialResult] = kept if kept is not None else {}
        self.sampled = sampled  # sampled points get their ledger rows as they start
        self.attempts = attempts
        self.ids: dict[str, int] = {}  # config hash → ledger trial id
        self._param_counts: dict[str, int] = {}  # a model's shape (`_param_count`) → its parameters
        self.specs: dict[str, TrialSpec] = {}  # config hash → the trial, as its unit started it
        self.open: dict[str, set[str]] = {}  # executor trial → members not yet finished
        self.placements: dict[str, Placement] = {}  # executor trial → where its worker trains
        self.history: dict[str, list[trainers.Evaluation]] = {}
        self.starts: dict[
            str, int
        ] = {}  # config hash → tries in this run (a start, or a unit that died first)
        self.requeued = 0  # members sent back to pending since the round began
        self.paused: dict[str, int] = {}  # config hash → ledger trial id: left pending by a shutdown

    def begin_round(self) -> None:
        """A new round of units starts: `requeued` counts its interrupted members."""
        self.requeued = 0

    def spent(self, config_hash: str) -> bool:
        """Whether the trial used all its starts in this run."""
        return self.starts.get(config_hash, 0) >= self.attempts

    def started(self, run: str, unit: Unit) -> None:
        if self.sampled:
            self.ledger.add_trials(self.study_id, unit.members)
        todo = set()
        training = set().union(*self.open.values())  # members other executor trials have open
        for m in unit.members:
            if m.config_hash in training:  # another unit trains it: this one's reports of it are ignored
                continue
            row_id = self.ledger.start_trial(self.study_id, m.config_hash)
            if row_id is None:  # finished already (resume, reuse)
                continue
            self.ids[m.config_hash] = row_id
            self.specs[m.config_hash] = m
            self.history[m.config_hash] = []
            self.starts[m.config_hash] = self.starts.get(m.config_hash, 0) + 1
            todo.add(m.config_hash)
            self.record.started(row_id, m)
        self.open[run] = todo

    def placed(self, run: str, placement: Placement) -> None:
        """Where the executor trial's worker trains its unit (`service.study.worker.Placement`): kept for
        the members a scheduler stops, and written on its running members' rows at once (what `GET
        /studies/{id}/trials?status=running` and `memsweep trials` show)."""
        if run in self.open:
            self.placements[run] = placement
            ids = [self.ids[key] for key in sorted(self.open[run])]
            self.ledger.place_trials(self.study_id, ids, placement.device, placement.node)

    def reported(self, run: str, events: Iterable[Event]) -> None:
        mine = self.open.get(run, set())
        down: Exception | None = None  # the ledger did not answer a result's write past its patience
        for event in events:
            key = event.config_hash
            if key not in mine:  # finished before this unit started, or trained by another unit
                continue
            if isinstance(event, Evaluated):
                if down is None:
                    self.history[key].append(event.evaluation)
                    self.record.evaluated(self.ids[key], key, self.history[key])
            elif down is not None:  # the report's other results: kept, not waited for again
                self.kept[key] = event.result
            else:
                try:
                    self._finish(run, key, event.result)
                except Exception as exc:
                    if outage(exc) is None:
                        raise
                    down = exc
        if down is not None:
            raise down

    def tick(self) -> None:
        """The executor's loop turned: the running trials' evaluations the recorder held back are
        written once they are due (`Recorder.write_evaluations`), also when no report comes."""
        self.record.write_evaluations()

    def ended(self, run: str) -> None:
        if self.stop.event.is_set():
            self._close(run, *self.stop.outcome())
        else:
            self._close(run, "pruned", "stopped early by the scheduler")

    def prune_unstarted(self, run: str, unit: Unit, reason: str) -> None:
        """The unit's members recorded `pruned` without training (seeds added to a point a scheduler
        stopped before: `Engine`), ended at once; never started (`runs` stays 0: they said 1, and a
        plan's actual counted them as trained), so with no device, node or final metric: nothing
        trained them anywhere."""
        self._tried(run, unit)
        for key in sorted(self.open.get(run, set())):
            result = trainers.TrialResult(status="pruned", reason=reason)
            self._with_task(result, key)
            self._finish(run, key, result)
        self.open.pop(run, None)

    def failed(self, run: str, reason: str, unit: Unit | None = None) -> list[str]:
        """The executor trial's worker died: its unfinished members go back to pending (or end as
        error after `attempts`). Returns the config hashes of those sent back, which the executor may
        run again at once (`RayTune` does, in the same run) or leave to the engine's next round."""
        if run not in self.open and unit is not None:  # its worker died before the unit started
            self._tried(run, unit)
            reason = f"{reason}, before its unit started"
        return self._close(run, "interrupted", reason)

    def _tried(self, run: str, unit: Unit) -> None:
        """A unit that never started, counted as one try of each member not finished yet (its ledger
        row stays as it was, pending or interrupted: nothing ran). Without this its members were left
        pending, uncounted, and a study could end `done` with trials that never ran."""
        if self.sampled:
            self.ledger.add_trials(self.study_id, unit.members)
        rows = {t.config_hash: t.id for t in self.ledger.trials(self.study_id, UNFINISHED)}
        todo = set()
        for m in unit.members:
            if m.config_hash not in rows:  # finished already
                continue
            self.ids[m.config_hash] = rows[m.config_hash]
            self.specs[m.config_hash] = m
            self.history[m.config_hash] = []
            self.starts[m.config_hash] = self.starts.get(m.config_hash, 0) + 1
            todo.add(m.config_hash)
        self.open[run] = todo

    def close_unfinished(self, reason: str) -> None:
        """Every executor trial still open: stopped with the run (and said so), else
        interrupted for `reason`."""
        how = self.stop.outcome() if self.stop.event.is_set() else ("interrupted", reason)
        for run in list(self.open):
            self._close(run, *how)

    def pause_unfinished(self, reason: str) -> None:
        """Every executor trial still open when the run itself stops on an error (the ledger not answering
        past its patience, Ray's driver): stopped with the run (and said so), else `pending` for `reason`
        with no attempt spent (the run's error is no fault of the trial); a member whose result is kept
        (`kept`: the ledger did not take it) says so (KEPT_NOTE)."""
        how = self.stop.outcome() if self.stop.event.is_set() else ("pending", reason)
        for run in list(self.open):
            self._close(run, *how)

    def write_kept(self) -> list[str]:
        """The results an earlier run of the study on this machine could not write (`kept`), recorded now
        on their trials still unfinished, before anything trains: none trains again, and each keeps the
        one start (`runs`) that trained it. A result whose trial has finished since (another process
        trained it) is dropped. Their config hashes."""
        if not self.kept:
            return []
        rows = {t.config_hash: t.id for t in self.ledger.trials(self.study_id, UNFINISHED)}
        written = []
        for key in sorted(self.kept):
            result = self.kept.get(key)  # None: its file could not be read (set aside): it trains again
            if result is not None and key in rows:
                try:
                    self.record.finished(rows[key], result)
                    written.append(key)
                except Exception as exc:
                    if outage(exc) is not None:
                        raise  # down again: still kept, for the next run
                    log.exception(
                        "study %s: a kept result of %s could not be written; it trains again",
                        self.study_id,
                        key,
                    )
            with contextlib.suppress(KeyError):
                del self.kept[key]
        return written

    def settle(self) -> str | None:
        """The run's end (`Stop.settle`): the state its stop ends the study in, None when none did; the
        members a shutdown left pending before its user's cancel came end `cancelled` with the rest."""
        state = self.stop.settle()
        if state == "cancelled":
            for row_id in sorted(self.paused.values()):
                self.ledger.update_trial(row_id, status="cancelled", reason=CANCEL_NOTE)
                self.record.restated(row_id, "cancelled", CANCEL_NOTE)
        self.paused.clear()
        return state

    def _finish(self, run: str, key: str, result: trainers.TrialResult) -> None:
        self.history.pop(key, None)
        try:
            self.record.finished(self.ids[key], result)
        except Exception as exc:
            if outage(exc) is not None:  # the ledger did not take it: kept for the study's next run here
                self.kept[key] = result
            raise
        self.open.get(run, set()).discard(key)

    def _with_task(self, result: trainers.TrialResult, key: str, placement: Placement | None = None) -> None:
        """A pruned (or cancelled) trial's result, which its worker never sent, with what it records of
        its task (the baselines: its last loss stays comparable), its budget, its model's parameter count
        (it read 0: the model is built here, its weights drawn from the trial's own stream, as the
        worker's), where it trained (`placement`: its device, node and numerics provenance, which a
        comparison with finished trials found empty), and the plugins its cell and task come from
        (`plugin.cell`, as its worker records them: a comparison of two studies saw no code change in a
        plugin whose trials asha stopped)."""
        spec = self.specs.get(key)
        if spec is None:
            return
        if placement is not None:
            result.device, result.node = placement.device, placement.node
            result.provenance = {**(result.provenance or {}), **placement.provenance}
        record_plugins(result, spec.resolved.config)
        with contextlib.suppress(Exception):  # a file-backed task without its files here: none
            task = spec.resolved.make_task()
            record_task(result, task)
            result.budget_steps = Schedule.of(spec.resolved.config, task.train_size).budget
            result.param_count = self._param_count(spec.resolved, task)

    def _param_count(self, resolved: trainers.Resolved, task: Any) -> int:
        """The trial's model's parameter count, built once per shape: a grid's seeds and learning rates
        share it, and a model (0.2–0.8 s at hidden 1,024) built for each of a rung's pruned trials held
        the executor's loop."""
        shape = trainers.config_hash({**resolved.to_dict(), "seed": 0, "lr": 0.0})
        if shape not in self._param_counts:
            self._param_counts[shape] = count_params(build_model(resolved, task))
        return self._param_counts[shape]

    def _close(self, run: str, how: str, reason: str) -> list[str]:
        """The members an executor trial left unfinished: stopped with the run (`how` cancelled by its
        user, or pending for its process's next start or the study's resume: no attempt spent, nothing
        to run again in this run), pruned (by the scheduler), or interrupted by an infrastructure fault
        (pending again, or error); the config hashes of those a fault sent back to pending."""
        again = []
        for key in sorted(self.open.get(run, set())):
            history = self.history.pop(key, [])
            last = history[-1] if history else None
            stop = how in ("cancelled", "pending")
            if stop or (how == "pruned" and last is None):  # pruned before its first evaluation: cancelled
                status = how if stop else "cancelled"
                task = trainers.TrialResult()
                if history:  # what it records of its task: its evaluations are judged at a budget reached
                    self._with_task(task, key)
                note = KEPT_NOTE if status == "pending" and key in self.kept else reason
                self.ledger.stop_trial(self.ids[key], status, note, history, task)
                self.record.stopped(self.ids[key], key, status, note)
                if status == "pending":
                    self.paused[key] = self.ids[key]
            elif how == "pruned":
                evaluations = f"{len(history)} evaluation{'s' if len(history) != 1 else ''}"
                result = trainers.TrialResult(
                    status="pruned", reason=f"{reason} after {evaluations}", history=history,
                    final_val_loss=last.val_loss if last else None, steps=last.step if last else 0,
                    final_metric=last.metric if last else None, seconds=last.seconds if last else 0.0,
                )  # fmt: skip
                self._with_task(result, key, self.placements.get(run))
                self._finish(run, key, result)
            elif self.starts.get(key, 0) < self.attempts:
                note = f"{reason} (attempt {self.starts[key]} of {self.attempts}; it runs again)"
                self.ledger.stop_trial(self.ids[key], "pending", note, [])
                self.record.stopped(self.ids[key], key, "pending", note)
                self.requeued += 1
                again.append(key)
            else:
                note = f"{reason} (after {self.attempts} attempts: an infrastructure fault, not a result)"
                self.ledger.stop_trial(self.ids[key], "error", note, history)
                self.record.stopped(self.ids[key], key, "error", note)
        self.open.pop(run, None)
        self.placements.pop(run, None)
        return again
