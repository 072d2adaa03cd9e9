"""How the driver records a running study's trials, as Ray Tune reports them: in the ledger (the
source of truth) and as live MLflow child runs, with the parent run's counts and the pace of the
running trials (the study's ETA)."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from sqlalchemy.exc import InterfaceError, OperationalError

from service.core.states import FINISHED
from service.core.trial import TrialSpec
from service.reports.summary import success_table
from service.store.ledger import Ledger
from service.tracking.context import StudyContext
from service.tracking.tracker import Tracker
from trainers import Evaluation, TrialResult

log = logging.getLogger(__name__)

#: seconds between two updates of a study's live counts on its parent run
PROGRESS_INTERVAL = 10.0
#: seconds between two writes of the running trials' evaluations into the ledger (each write is one
#: transaction for all of them, each trial's evaluations in full), at the least
LIVE_INTERVAL = 10.0
#: the most of the driver's time those writes take: a write that took d seconds is followed by the next
#: d / LIVE_SHARE seconds later at the soonest
LIVE_SHARE = 0.05


class StudyRecorder:
    """How the driver records a running study's trials: each in the ledger (the source of truth) and
    as a live MLflow child run (made when it starts, its curve as it evaluates, finished with it);
    the parent run's counts every PROGRESS_INTERVAL seconds; and the pace of the running trials."""

    def __init__(self, ledger: Ledger, tracker: Tracker, study_id: str, mlflow: StudyContext) -> None:
        self.ledger, self.tracker, self.study_id, self.mlflow = ledger, tracker, study_id, mlflow
        self._lock = threading.Lock()
        self._running: dict[str, tuple[int, int, float]] = {}  # config hash → (budget, step, seconds)
        self._expected: dict[str, int] = {}  # config hash → budget in steps, of trials not yet started
        self._last_progress = 0.0
        self._unwritten: dict[int, Sequence[Evaluation]] = {}  # trial id → its evaluations so far
        self._next_write = -math.inf  # when the next write of them falls due (time.monotonic)

    def expect(self, trials: Sequence[TrialSpec]) -> None:
        """The trials a round will run (their budgets count in the ETA until they start)."""
        with self._lock:
            for t in trials:
                self._expected.setdefault(t.config_hash, budget_steps(t))

    def unexpect(self, hashes: Iterable[str]) -> None:
        """Expected trials this run will not start (another study's result taken, or another study
        trains them): they leave the ETA."""
        with self._lock:
            for h in hashes:
                self._expected.pop(h, None)

    def took(self, hashes: Iterable[str]) -> None:
        """Trials of these hashes that took another study's result (`Ledger.take_results`): each one's
        child run made whole now, as a finished trial's is, replacing the run an earlier run of it left
        (a cancel's, ended KILLED with the partial curve)."""
        wanted = set(hashes)
        if not wanted:
            return
        for row in self.ledger.trials(self.study_id, FINISHED):
            if row.config_hash in wanted and row.reused_from is not None:
                matrices = self.ledger.matrices(row.id)
                self.tracker.log_trial(self.mlflow, row, matrices, run_id_setter(self.ledger, row.id))

    def started(self, trial_id: int, spec: TrialSpec) -> None:
        row = self.ledger.trial(trial_id)
        self.tracker.trial_started(self.mlflow, row, run_id_setter(self.ledger, trial_id))
        with self._lock:
            budget = self._expected.pop(spec.config_hash, None)
            self._running[spec.config_hash] = (budget if budget is not None else budget_steps(spec), 0, 0.0)

    def evaluated(self, trial_id: int, config_hash: str, history: Sequence[Evaluation]) -> None:
        """A running trial evaluated (`history`: its evaluations so far, the new one last): its live
        child run's curve, its pace, and its row's evaluations (`write_evaluations`)."""
        evaluation = history[-1]
        self.tracker.trial_evaluated(config_hash, [evaluation])
        with self._lock:
            budget = self._running.get(config_hash, (evaluation.step, 0, 0.0))[0]
            self._running[config_hash] = (budget, evaluation.step, evaluation.seconds)
            self._unwritten[trial_id] = history
        self.write_evaluations()

    def write_evaluations(self) -> None:
        """The running trials' evaluations into their ledger rows, in one write when it falls due: what
        REST, the client and the CLI show of a trial while it trains. A write is due LIVE_INTERVAL
        seconds after the last, or LIVE_SHARE⁻¹ times as long as the last took, whichever is later:
        each write carries every running trial's whole curve, so a bundle of hundreds of members with
        long curves spends at most that share of the driver's time on them. A trial's end writes all of
        its own; what a database outage held back goes with the next write."""
        now = time.monotonic()
        with self._lock:
            if not self._unwritten or now < self._next_write:
                return
            unwritten, self._unwritten = self._unwritten, {}
        written = self.ledger.record_evaluations(self.study_id, unwritten)
        took = time.monotonic() - now
        with self._lock:
            self._next_write = now + max(LIVE_INTERVAL, took / LIVE_SHARE)
            if not written:  # newer evaluations of a trial, if any came meanwhile, are its whole curve too
                self._unwritten = {**unwritten, **self._unwritten}

    def finished(self, trial_id: int, result: TrialResult) -> None:
        """A trial's result into the ledger (raising when the ledger did not take it: the caller keeps
        it, `TrialBook._finish`), then its child run and the parent run's counts. Once the result is
        written, a ledger that stops answering raises nothing more here: the child run's id and the counts
        wait for the study's next write or sync, and the trial is not taken for one the ledger lacks (a
        written result was kept and its `done` row written back to `pending`)."""
        with self._lock:
            self._unwritten.pop(trial_id, None)
        row = self.ledger.finish_trial(trial_id, result)
        matrices = None
        if result.recurrent_matrix is not None:
            v = result.input_matrix
            matrices = {"W": result.recurrent_matrix.tolist(), "V": v.tolist() if v is not None else None}
        with self._lock:
            self._running.pop(row.config_hash, None)
        try:
            self.tracker.log_trial(self.mlflow, row, matrices, run_id_setter(self.ledger, trial_id))
            self.progress()
        except (OperationalError, InterfaceError) as exc:  # the ledger's, after the result was written
            log.warning("study %s: trial %d written; its run id or the counts wait (%s)", self.study_id,
                        trial_id, str(exc).splitlines()[0])  # fmt: skip

    def stopped(self, trial_id: int, config_hash: str, status: str, reason: str) -> None:
        """A trial stopped before its end (cancelled, or interrupted: pending to run again, or error):
        its live child run ends KILLED with its `status` and the reason; it no longer counts in the ETA."""
        self.tracker.trial_stopped(config_hash, status, reason)
        with self._lock:
            self._running.pop(config_hash, None)
            self._unwritten.pop(trial_id, None)

    def restated(self, trial_id: int, status: str, reason: str) -> None:
        """A trial stopped already, its status in the ledger changed since (a shutdown's `pending`, then
        its user's cancel): its child run, ended KILLED, says the new one."""
        self.tracker.trial_restated(self.ledger.trial(trial_id), status, reason)

    def progress(self, force: bool = False) -> None:
        """The parent run's live counts, at most every PROGRESS_INTERVAL seconds (or now: `force`)."""
        now = time.monotonic()
        if not force and now - self._last_progress < PROGRESS_INTERVAL:
            return
        self._last_progress = now
        table = success_table(self.ledger.trials(self.study_id), self.mlflow.criterion)
        self.tracker.study_progress(self.mlflow.parent_run_id, table.model_dump(mode="json"))

    def eta(self, undrawn: int = 0) -> float | None:
        """Seconds left at the measured pace of the running trials (each one's steps per second,
        summed): their remaining steps, the expected trials' budgets, and `undrawn` trials more (a
        sampler's, not drawn yet) at the mean budget; None before a running trial has evaluated."""
        with self._lock:
            running = list(self._running.values())
            expected = list(self._expected.values())
        rate = sum(step / seconds for _, step, seconds in running if step and seconds > 0)
        if rate <= 0:
            return None
        budgets = [b for b, _, _ in running] + expected
        left = sum(max(b - step, 0) for b, step, _ in running) + sum(expected)
        return (left + undrawn * (sum(budgets) / len(budgets))) / rate


def budget_steps(spec: TrialSpec) -> int:
    """A trial's budget in optimiser steps (its task says how many make an epoch)."""
    from trainers.schedule import Schedule

    return Schedule.of_trial(spec.resolved).budget


def run_id_setter(ledger: Ledger, trial_id: int) -> Callable[[str], None]:
    """Records a trial's MLflow run id in its ledger row, once MLflow made the run."""
    return lambda run_id: ledger.update_trial(trial_id, mlflow_run_id=run_id)
