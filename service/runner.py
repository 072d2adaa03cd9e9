"""The one study runner, for the REST server and `memsweep run` alike: each run of a study is
planned, run and costed here (`run_planned`: its plan of what is left, kept in the ledger; the
engine's run; what the run took, beside the plan), on a small pool of threads, one study each.

The ledger stays the source of truth; the runner only knows which studies this process has queued or
is running, and how fast each one goes (for the ETA). A run claims its study first (one process runs a
study at a time: `service.study.claim`). On start it resumes every study the ledger holds as pending or
running (a crash leaves them so) that no other live process runs, and those later, once their process
is gone; on shutdown it stops the Tune runs and leaves those studies and their interrupted trials
pending (`Engine.run_study`'s `Stop`: not cancelled, as by a user), so the next start resumes
them; a user's cancel that comes during the shutdown wins, and ends the study cancelled. Ray and
MLflow are brought up once, before the first study, by `prepare` (two studies must not race to start
them).

The runner shuts down the Ray it started, through the engine's executor (`Executor.start`, `stop`),
which starts it on a thread that lives as long as the process (`service.study.nodes.ensure_ray`): Ray
ties its processes to the *thread* that started them (Linux's parent-death signal fires when that
thread ends), so a Ray started from a short-lived thread would die with it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any

from service.core.spec import expected_trials
from service.core.states import FINISHED, RESUMABLE
from service.planning.record import plan_run, record_actual
from service.store.ledger import ClaimLostError
from service.store.patience import outage
from service.study.book import SHUTDOWN_NOTE, Stop
from service.study.claim import StudyBusyError, StudyClaim, gone
from service.study.engine import ORPHAN_NOTE, Engine, run_error

log = logging.getLogger(__name__)

#: seconds between two starts of a local MLflow server that keeps failing to start, at most
MLFLOW_RESTART_MAX = 600.0
#: seconds between two looks at a ledger that did not answer, first and at most (`StudyRunner._run`)
LEDGER_POLL = (1.0, 15.0)


def run_planned(
    engine: Engine,
    study_id: str,
    stop: Stop | None = None,
    after_plan: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """One run of a study: its plan of what is left (calibrating the shapes the cache lacks), kept in
    `studies.plan`; the run (`Engine.run_study`, `stop` as there) of the units the plan packed; what
    it took, beside that plan (`record_actual`).
    `after_plan` is called between the plan and the run. Returns the run's summary."""
    stop = stop if stop is not None else Stop()
    units = plan_run(engine, study_id, stop.event)  # a stop ends its calibrations too
    if stop.event.is_set():  # stopped while it planned: no run, nothing to record
        return {"state": stopped_state(engine, study_id, stop)}
    if after_plan is not None:
        after_plan()
    summary = engine.run_study(study_id, stop=stop, units=units)
    record_actual(
        engine.ledger, study_id, summary["seconds"], summary.pop("units"), summary["state"] == "done"
    )
    return summary


def stopped_state(engine: Engine, study_id: str, stop: Stop) -> str:
    """A study stopped before its run began (while it waited for Ray, MLflow or its plan): `pending`
    with SHUTDOWN_NOTE for the next start when its process stops, else `cancelled` by its user. It
    went on into the run (a parent run made, the study `running`, its summary written) for nothing."""
    state = stop.settle() or "cancelled"
    engine.ledger.update_study(study_id, state=state, error=SHUTDOWN_NOTE if state == "pending" else None)
    return state


@dataclass
class Active:
    """A study this process has queued or is running."""

    stop: Stop = field(default_factory=Stop)  # stops its run: a user's cancel, or a shutdown
    future: Future[None] | None = None
    planning: bool = False  # its plan is made (its calibrations may wait for CPUs)
    started: float | None = None  # time.monotonic() when its run began
    finished_at_start: int = 0
    summary: dict[str, Any] | None = None  # the run's, once it ended


class StudyRunner:
    def __init__(self, engine: Engine, workers: int) -> None:
        self.engine = engine
        self.workers = workers
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="study") if workers else None
        self._lock = threading.Lock()
        self._active: dict[str, Active] = {}
        self._prepare_lock = threading.Lock()
        self._ray_lock = threading.Lock()
        self.prepared = threading.Event()
        self.prepare_error: str | None = None
        self.tracking_uri: str | None = engine.settings.mlflow_tracking_uri
        self._stopping = False
        self._ray_started = False
        self._repair_stop = threading.Event()
        #: studies this process did not run because another runs them (`StudyClaim`): why
        self.refused: dict[str, str] = {}
        self._mlflow_retry_at = 0.0  # monotonic time before which a dead local MLflow is not started again
        self._mlflow_backoff = 0.0

    # ----- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> list[str]:
        """Bring up Ray and MLflow in the background and queue every unfinished study; their ids."""
        if not self.workers:
            return []
        threading.Thread(target=self._warm_up, name="warm-up", daemon=True).start()
        threading.Thread(target=self._repair_tracking, name="mlflow-repair", daemon=True).start()
        resumed = [s.id for s in self.engine.ledger.list_studies() if s.state in RESUMABLE]
        for study_id in reversed(resumed):  # oldest first
            self.submit(study_id)
        if resumed:
            log.info("resuming %d unfinished studies: %s", len(resumed), ", ".join(resumed))
        return resumed

    def _repair_tracking(self) -> None:
        """Every `mlflow_repair_interval` seconds: studies another process ran when this one started are
        resumed once that process is gone (`_resume_orphans`); the local MLflow server this home runs
        on, when no tracking URI is configured, is started again if it died (`_keep_local_mlflow`); and studies
        whose MLflow writes failed (MLflow was down) get their runs rebuilt from the ledger once MLflow
        answers again (`Engine.sync_tracking`)."""
        from service.tracking.server import server_healthy

        interval = self.engine.settings.mlflow_repair_interval
        while not self._repair_stop.wait(interval):
            try:
                self._resume_orphans()
                self._keep_local_mlflow()
                stale = [
                    s.id
                    for s in self.engine.ledger.list_studies()
                    if (s.error or "").startswith("MLflow:")
                    and not self.is_active(s.id)
                    and s.state != "running"
                ]
                if stale and self.tracking_uri and server_healthy(self.tracking_uri):
                    for study_id in stale:
                        log.info("study %s: rebuilding its MLflow runs from the ledger", study_id)
                        try:
                            self.engine.sync_tracking(study_id)
                        except StudyBusyError as exc:  # a run (or a sync) holds it: its turn comes later
                            log.info("study %s: not rebuilt now (%s)", study_id, exc)
            except Exception:  # a repair that fails is tried again later
                log.exception("MLflow repair failed; trying again in %d s", interval)

    def _resume_orphans(self) -> None:
        """Studies this process found run by another (`refused`), resumed here once that process is gone
        without letting them go (it crashed: a host it ran on lost); a study its process let go (a
        Ctrl-C) or ended is not this process's to run."""
        for study_id in list(self.refused):
            study = self.engine.ledger.get_study(study_id)
            if study is None or study.state not in RESUMABLE or study.owner is None:
                self.refused.pop(study_id, None)
            elif gone(study.owner, study.owner_beat):
                log.info("study %s: the process that ran it (%s) is gone; resuming it", study_id, study.owner)
                self.refused.pop(study_id, None)
                self.submit(study_id)

    def _keep_local_mlflow(self) -> None:
        """Start the local MLflow server again when it no longer answers (issue 35: a dead one stayed
        dead, and /ready said 503, until `memsweep serve` was restarted); after a start that fails,
        the next try waits twice as long, up to MLFLOW_RESTART_MAX seconds. A configured tracking URI
        (MEMSWEEP_MLFLOW_TRACKING_URI) is someone else's server: left alone."""
        from service.tracking.server import server_healthy

        settings = self.engine.settings
        if settings.mlflow_tracking_uri or not self.prepared.is_set() or not self.tracking_uri:
            return
        if server_healthy(self.tracking_uri) or time.monotonic() < self._mlflow_retry_at:
            return
        log.warning("the local MLflow server at %s does not answer: starting it again", self.tracking_uri)
        try:
            self.tracking_uri = self.engine.tracking_uri(restart=True)
            self._mlflow_backoff = 0.0
            log.info("the local MLflow server answers again at %s", self.tracking_uri)
        except Exception as exc:
            base = settings.mlflow_repair_interval
            self._mlflow_backoff = min(max(2 * self._mlflow_backoff, base), MLFLOW_RESTART_MAX)
            self._mlflow_retry_at = time.monotonic() + self._mlflow_backoff
            log.warning("could not start MLflow again (%s); next try in %.0f s", exc, self._mlflow_backoff)

    def _warm_up(self) -> None:
        try:
            self.prepare()
        except Exception:
            log.exception("could not bring up Ray or MLflow")

    def prepare(self) -> None:
        """Start (or join) Ray and resolve the MLflow server, once."""
        with self._prepare_lock:
            if self.prepared.is_set():
                return
            try:
                self.start_ray()
                self.tracking_uri = self.engine.tracking_uri()
            except Exception as exc:
                self.prepare_error = f"{type(exc).__name__}: {exc}"
                raise
            self.prepare_error = None
            self.prepared.set()

    def start_ray(self) -> None:
        """Start (or join) Ray, once (a plan's calibrations need Ray, not MLflow); an error says why it
        could not, and the next call tries again. It lives until `shutdown` (the executor starts it on
        a thread that outlives this call's)."""
        with self._ray_lock:
            if self._ray_started:
                return
            if self._stopping:  # a start after the shutdown looked would outlive it
                raise RuntimeError("the runner is stopping")
            try:
                self.engine.executor.start()
            except Exception as exc:
                raise RuntimeError(f"{type(exc).__name__}: {exc}") from exc
            self._ray_started = True

    def shutdown(self, timeout: float = 60.0) -> None:
        """Stop the running studies (they stay resumable) and the threads."""
        self._repair_stop.set()
        with self._lock:
            self._stopping = True
            running = []
            for study_id, a in list(self._active.items()):
                if a.future is None or a.future.cancel():  # never started: still pending in the ledger
                    del self._active[study_id]
                else:
                    a.stop.shut_down()  # its trials wait for the next start, unless its user cancelled
                    running.append(a.future)
        still: set[Future[None]] = set()
        if running:
            log.info("stopping %d running studies; they resume at the next start", len(running))
            still = wait_futures(running, timeout=timeout).not_done
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        # a start under way (the warm-up's) ends before this looks: else Ray would come up after it
        locked = self._ray_lock.acquire(timeout=timeout)
        try:
            if self._ray_started and not still:
                self.engine.executor.stop()
                self._ray_started = False
        finally:
            if locked:
                self._ray_lock.release()
        if still:  # shut down under them, a study would start Ray anew (or crash in Ray's calls)
            log.warning(
                "%d studies did not stop within %.0f s (a calibration waits on its tasks); Ray is left to "
                "shut down at exit",
                len(still),
                timeout,
            )

    def unplaceable(self, resources: dict[str, float]) -> str | None:
        """Why no node this runner's studies run on can run a trial asking these resources
        (`Executor.unplaceable`: an embedded Ray is this machine's, a cluster is asked once joined);
        None when one can, or when this runner runs no studies (a runner elsewhere on the ledger,
        which may have what this one lacks, runs them)."""
        return self.engine.executor.unplaceable(resources) if self.workers else None

    def node_plugins(self) -> Mapping[str, Mapping[str, str]] | None:
        """Each Ray node's plugins (`Executor.node_plugins`: None on an embedded Ray, this process's
        installation); None when Ray is not up yet."""
        return self.engine.executor.node_plugins() if self._ray_started else None

    # ----- studies -----------------------------------------------------------------------------------
    def is_active(self, study_id: str) -> bool:
        with self._lock:
            return study_id in self._active

    def is_queued(self, study_id: str) -> bool:
        with self._lock:
            a = self._active.get(study_id)
            return a is not None and a.started is None

    def submit(self, study_id: str) -> bool:
        """Queue the study to run; False when it is queued or running already. What a process that died
        left of it `running` reads `pending` from now (`Ledger.pend_orphans`), not once its turn comes."""
        with self._lock:
            if self._stopping or study_id in self._active:
                return False
            a = Active()
            self._active[study_id] = a
            if self._pool is not None:
                a.future = self._pool.submit(self._run, study_id, a)
        try:
            self.engine.ledger.pend_orphans(study_id, ORPHAN_NOTE, gone)
        except Exception:  # its claim takes them up all the same
            log.exception("study %s: what a dead process left running could not be set pending", study_id)
        return True

    def cancel(self, study_id: str) -> bool:
        """Stop a queued or running study; False when this process is not running it, or its run has
        ended (`Stop.cancel`). A study queued here that no process holds is marked
        `cancelled`; one another process runs (a `memsweep run` on this ledger), or a dead one left
        `running`, is not this process's to mark: it stays queued, and the answer is False (it wrote
        `cancelled` under a live run, so that another study stopped waiting for its trials and trained
        them too)."""
        with self._lock:
            a = self._active.get(study_id)
            if a is None:
                return False
            if a.future is not None and not a.future.cancel():  # started: its run records the cancel
                return a.stop.cancel()
            # never started here: cancelled in the ledger unless another process holds it (a runner
            # without workers queues studies it never starts: its entry goes either way)
            if self.engine.ledger.cancel_unclaimed_study(study_id) or a.future is None:
                del self._active[study_id]
                return True
            # held by another process, or left running by a dead one: queued again, its turn to come
            a.future = self._pool.submit(self._run, study_id, a) if self._pool is not None else None
            return False

    def waiting(self, study_id: str) -> str | None:
        """What a study queued here waits for while its plan is made: its calibrations (each a task of a
        unit's resources), which may wait for the CPUs the studies running here hold (Ray is not asked
        whether they do); None when it is not planning."""
        with self._lock:
            a = self._active.get(study_id)
            if a is None or a.started is not None or not a.planning:
                return None
            running = sorted(s for s, other in self._active.items() if other.started is not None)
        if not running:
            return "calibrating its plan"
        holders = f"studies {', '.join(running)} hold" if len(running) > 1 else f"study {running[0]} holds"
        return f"calibrating its plan: its calibrations may wait for the CPUs that {holders}"

    def eta(self, study_id: str) -> float | None:
        """Seconds left of a study this process runs: at the measured step rates of its running trials
        (`StudyRecorder.eta`: known as soon as one has evaluated), else at the pace of the trials
        finished in this run; None before either is known, or when it is not running here. A sampled
        study expects `max_trials` trials, more than its ledger holds while points are still drawn."""
        with self._lock:
            a = self._active.get(study_id)
            if a is None or a.started is None:
                return None
            started, before = a.started, a.finished_at_start
        study = self.engine.ledger.get_study(study_id)
        if study is None:
            return None
        c = self.engine.ledger.counts(study_id)
        finished, total = sum(c[s] for s in FINISHED), c["total"]
        expected = expected_trials(study.spec, total)
        if expected - finished <= 0:
            return 0.0
        recorder = self.engine.progress.get(study_id)
        measured = recorder.eta(undrawn=max(expected - total, 0)) if recorder is not None else None
        if measured is not None:
            return measured
        done_here = finished - before
        if done_here <= 0:
            return None
        return (expected - finished) * (time.monotonic() - started) / done_here

    def _run(self, study_id: str, a: Active) -> None:
        """Claim the study and run it; every write of it, a failure's and a shutdown's included, is made
        while the claim is held, so the ledger refuses it once another process took the study over. A
        run the ledger stopped (it did not answer past its patience: `service.store.patience.outage`)
        leaves the study pending, and it runs again here once the ledger answers (`_after_outage`)."""
        try:
            while self._run_once(study_id, a) and self._after_outage(study_id, a):
                log.info("study %s: the ledger answers again; resuming it", study_id)
        finally:
            with self._lock:
                self._active.pop(study_id, None)

    def _run_once(self, study_id: str, a: Active) -> bool:
        """One claimed run of the study (`_run`); True when the ledger stopped it (an outage)."""
        ledger = self.engine.ledger
        try:
            # one process runs a study at a time; a sync of its MLflow runs holding it is waited for
            with StudyClaim(ledger, study_id, on_lost=a.stop.event.set, until=a.stop.event):
                try:
                    self._run_claimed(study_id, a)
                except ClaimLostError:
                    raise
                except Exception as exc:
                    down = outage(exc)
                    if down is not None:  # the engine said so in the study and logged the traceback
                        log.warning(
                            "study %s stopped: %s; it runs again once the ledger answers", study_id, down
                        )
                        return True
                    log.exception("study %s failed", study_id)
                    study = ledger.get_study(study_id)
                    # failed before the engine said so; a shutdown's leaves it pending, the error kept
                    if study is not None and study.state in RESUMABLE:
                        state = a.stop.settle() or "failed"
                        ledger.update_study(study_id, state=state, error=run_error(exc))
        except StudyBusyError as exc:  # another process runs it: nothing here touches it
            if a.stop.by_user:  # cancelled while it waited for a sync to let it go
                ledger.cancel_unclaimed_study(study_id)
            elif not a.stop.event.is_set():
                log.warning("%s", exc)
                self.refused[study_id] = str(exc)
        except ClaimLostError as exc:  # another process took it over mid-run: its state is that one's
            log.error("%s", exc)
            self.refused[study_id] = str(exc)
        except Exception as exc:  # the claim itself, or its release: the study stays as it is
            down = outage(exc)
            if down is None:
                log.exception("study %s could not be claimed or let go", study_id)
                return False
            log.warning("study %s: its claim: %s; it runs again once the ledger answers", study_id, down)
            return True
        return False

    def _after_outage(self, study_id: str, a: Active) -> bool:
        """Wait for the ledger to answer again after an outage stopped the study's run: True to run it
        again (it is still pending or running there, or its user cancelled it meanwhile: that run writes
        the cancel); False when this runner stops first (a shutdown: its next start resumes it). Queued
        again meanwhile (`is_queued`), with a new stop: the run's was settled."""
        with self._lock:
            if self._stopping:
                return False
            a.stop, a.started, a.planning, a.summary = Stop(), None, False, None
            stop = a.stop
        delay, most = LEDGER_POLL
        while not stop.event.wait(delay):
            delay = min(2 * delay, most)
            # answering is not enough: a database that refuses writes (read-only, full) would fail the
            # run's claim again after the whole patience, and again, for ever
            if self.engine.ledger.unreachable() is not None or self.engine.ledger.unwritable() is not None:
                continue
            try:
                study = self.engine.ledger.get_study(study_id)
            except Exception:  # gone again: look again later
                continue
            return study is not None and study.state in RESUMABLE
        if not stop.by_user:
            return False
        # its user's cancel: written by one more run, which finds its stop set once it holds the study
        # (`stopped_state`). Here, the study may still read `running` under this process (the outage ate
        # the failure's writes and the claim's release), which no unclaimed cancel may touch: the cancel
        # was answered, and nothing wrote it
        while self.engine.ledger.unreachable() is not None:
            with self._lock:
                if self._stopping:
                    return False
            time.sleep(most)
        return True

    def _run_claimed(self, study_id: str, a: Active) -> None:
        ledger = self.engine.ledger
        self.engine.pend_orphans(study_id)  # claimed: what a dead process left running reads pending now
        try:
            self.prepare()
        except Exception as exc:  # the study fails saying why, and what brings it back
            if a.stop.event.is_set():  # stopped meanwhile (a shutdown refuses to start Ray): not a failure
                stopped_state(self.engine, study_id, a.stop)
                return
            raise RuntimeError(
                f"could not bring up Ray or MLflow ({exc}); once that is fixed, run the study again: "
                f"`memsweep resume {study_id} --url URL` on a server (POST /studies/{study_id}/resume), "
                f"`memsweep run --study {study_id}` here"
            ) from None
        if a.stop.event.is_set():
            stopped_state(self.engine, study_id, a.stop)
            return

        def started() -> None:
            c = ledger.counts(study_id)
            with self._lock:
                a.started, a.finished_at_start = time.monotonic(), sum(c[s] for s in FINISHED)

        with self._lock:
            a.planning = True
        a.summary = run_planned(self.engine, study_id, a.stop, started)
