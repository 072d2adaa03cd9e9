"""The live-run clock: a training trial's child run written while it trains, at a bounded number of
requests.

A trial's child run is made `interval` seconds after its trial starts (with its params), its curve
then written at most every `interval` seconds (less often when many runs are live:
LIVE_WRITES_PER_SECOND), and the rest in one batch at its end; a trial that ends sooner is written
whole at its end (create, one batch, its matrix, its status: four requests). MLflow's server answers
some 40 requests a second here, and its writes were the tail of short-trial studies.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from service.tracking.batches import now_ms
from service.tracking.context import StudyContext
from service.tracking.pool import WriterPool

if TYPE_CHECKING:
    from service.store.models import Trial
    from trainers.result import Evaluation

#: live curve writes per second at most, over all of a clock's running trials: with many live runs
#: (two 32-member bundles) each is written less often than `interval`, and the server (~40 requests a
#: second here) keeps most of its time for the end-of-trial writes
LIVE_WRITES_PER_SECOND = 10.0

#: an evaluation and its points' timestamp (ms since the epoch), fixed when it comes: a write sent again
#: after its answer was lost (MLflow restarting, a timeout) repeats its points exactly, and MLflow's
#: store keeps one of each (a point is its key, step, value and timestamp); stamped at each try, a point
#: that had landed was drawn twice
Stamped = tuple[int, "Evaluation"]


def stamp(evaluations: Iterable[Evaluation]) -> list[Stamped]:
    """Evaluations stamped now."""
    ts = now_ms()
    return [(ts, e) for e in evaluations]


@dataclass
class LiveRun:
    """A training trial's child run between its start and its end: what the clock schedules, and what
    the live writes have made of it."""

    study: StudyContext
    trial: Trial
    on_run_id: Callable[[str], None]
    last_write: float  # monotonic time of the start, then of the last live write
    due: float | None  # when its next live write goes out; None: nothing to write yet
    run: tuple[str, str] | None = None  # (run id, artifact URI), once made
    params_sent: bool = False
    curve: list[Stamped] = field(default_factory=list)  # evaluations not yet written
    queued: bool = False  # a live write is queued in its lane
    ended: bool = False  # its final write is queued: that one writes whatever is left


#: a live write of a run: made (the first time), then its params (the first time) and this curve
WriteLive = Callable[[LiveRun, list[Stamped]], None]


class LiveClock:
    """Queues each live run's write to the pool, in the run's lane (its config hash), when it falls due.

    Lifecycle: `started` when a trial starts training (the clock's thread starts with the first);
    `evaluated` as it reports; `ended` when it finishes, before its final write is queued in the same
    lane (that write then sends what the live writes have not); `forget` a run deleted meanwhile. Then
    once either `close` (stop the thread, wait for it) or `abandon` (stop it and drop every run).
    """

    def __init__(self, pool: WriterPool, write: WriteLive, interval: float) -> None:
        self.interval = interval
        self._pool, self._write = pool, write
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)  # the clock's thread sleeps on it
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._runs: dict[str, LiveRun] = {}  # config hash → the child run of a training trial

    def started(self, study: StudyContext, trial: Trial, on_run_id: Callable[[str], None]) -> None:
        """A trial starts training: its first live write falls due `interval` seconds from now."""
        now = time.monotonic()
        with self._lock:
            self._runs[trial.config_hash] = LiveRun(study, trial, on_run_id, now, due=now + self.interval)
            if self._thread is None:
                self._thread = threading.Thread(target=self._tick, name="mlflow-live-clock", daemon=True)
                self._thread.start()
            self._wake.notify()

    def evaluated(self, config_hash: str, evaluations: Sequence[Evaluation]) -> None:
        """Evaluations of a training trial: buffered for its next live write (or its end)."""
        with self._lock:
            live = self._runs.get(config_hash)
            if live is None or live.ended:
                return
            live.curve.extend(stamp(evaluations))
            if live.due is None and not live.queued:
                live.due = live.last_write + self._spacing()
                self._wake.notify()

    def ended(self, config_hash: str) -> LiveRun | None:
        """A trial has finished: its live run (None if it had none) leaves the clock, written no more."""
        with self._lock:
            live = self._runs.pop(config_hash, None)
            if live is not None:
                live.ended = True
            return live

    def forget(self, run_id: str) -> None:
        """A run was deleted: if it is a live one, it leaves the clock."""
        with self._lock:
            self._runs = {k: v for k, v in self._runs.items() if not v.run or v.run[0] != run_id}

    def close(self) -> None:
        """Stop the clock's thread and wait for it (what it queued stays queued)."""
        self._stop(drop_runs=False)
        if self._thread is not None:
            self._thread.join()

    def abandon(self) -> None:
        """Stop the clock's thread and drop every live run, without waiting."""
        self._stop(drop_runs=True)

    def _stop(self, drop_runs: bool) -> None:
        with self._lock:
            self._stopped = True
            if drop_runs:
                self._runs.clear()
            self._wake.notify()

    def _spacing(self) -> float:
        """Seconds between two live writes of a run (the lock held): `interval`, or longer when that
        many live runs would write more than LIVE_WRITES_PER_SECOND."""
        return max(self.interval, len(self._runs) / LIVE_WRITES_PER_SECOND)

    def _tick(self) -> None:
        """The clock's thread: queues each live run's write when it falls due."""
        with self._lock:
            while not self._stopped:
                now = time.monotonic()
                waiting = [
                    v for v in self._runs.values() if v.due is not None and not v.queued and not v.ended
                ]
                for live in waiting:
                    if live.due is not None and live.due <= now:
                        live.due, live.queued = None, True
                        self._pool.submit(partial(self._write_due, live), key=live.trial.config_hash)
                nxt = min((v.due for v in waiting if v.due is not None), default=None)
                self._wake.wait(timeout=None if nxt is None else max(nxt - now, 0.01))

    def _write_due(self, live: LiveRun) -> None:
        """A live write, in the run's lane: its buffered curve (put back if the write fails), then the
        next one scheduled if more came meanwhile."""
        with self._lock:
            if live.ended:  # the final write, queued behind this one, writes everything
                live.queued = False
                return
            curve, live.curve = live.curve, []
        try:
            self._write(live, curve)
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
