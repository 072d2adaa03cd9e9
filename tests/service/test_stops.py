"""How a study's trials read when its run stops other than by finishing: a server's shutdown (pending,
for the next start, not cancelled as by a user), a process that died (pending once the next run claims
the study), the ledger not answering past its patience (pending, no attempt spent, no result lost,
resumed once it answers), a trial that starts again (no reason left from the run before); and an
extension of a sampled study's budget, which only grows. A real SQLite ledger throughout; the runs on a real Ray and
a real MLflow server, through the runner a server uses."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from mlflow.tracking import MlflowClient

from service.core import processes
from service.core.settings import Settings
from service.core.spec import StudySpec
from service.core.trial import Finished
from service.store.ledger import Ledger
from service.study.book import CANCEL_NOTE, SHUTDOWN_NOTE
from service.study.executor import RunRequest
from tests.service.conftest import TINY
from tests.service.test_lifecycle import InProcess, grid, make_engine  # noqa: F401  (a fixture)


def lr_grid(name: str, lrs: list[float], steps: int) -> StudySpec:
    return StudySpec.model_validate({
        "name": name, "base": {**TINY, "steps": steps, "eval_every": max(steps // 4, 1)},
        "space": {"dims": {"lr": lrs}}, "bundle_size": 1, "concurrency": 2,
    })  # fmt: skip


def wait_until(what: str, ok: Callable[[], bool], seconds: float = 240.0) -> None:
    deadline = time.monotonic() + seconds
    while not ok():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_trial_started_again_carries_no_reason_from_the_run_before(tmp_path: Path) -> None:
    """A start clears why an earlier run stopped the trial (a cancel, a shutdown, a fault): it read
    "the study was cancelled" while it trained again; `runs` says it is a start again."""
    from service.study.engine import Engine

    engine = Engine(Settings(home=tmp_path, mlflow_tracking_uri="http://127.0.0.1:9"))  # runs nothing
    study = engine.create_study(lr_grid("again", [1e-3], 20))
    ledger = engine.ledger
    (row,) = ledger.trials(study.id)
    assert ledger.start_trial(study.id, row.config_hash) == row.id
    ledger.stop_trial(row.id, "cancelled", "the study was cancelled", [])
    # a unit about to start reserves it (`running` while it waits for a slot): no reason either
    assert ledger.reserve_trials(study.id, [row.config_hash], lambda owner, beat: True) == {row.config_hash}
    reserved = ledger.trial(row.id)
    assert (reserved.status, reserved.reason) == ("running", None)
    assert ledger.pend_running(study.id, [row.config_hash], None, forget_history=False)  # never started
    assert ledger.start_trial(study.id, row.config_hash) == row.id
    ledger.stop_trial(row.id, "pending", "its worker failed (attempt 2 of 3; it runs again)", [])
    assert ledger.start_trial(study.id, row.config_hash) == row.id
    again = ledger.trial(row.id)
    assert (again.status, again.runs, again.reason) == ("running", 3, None)


@pytest.fixture
def rest(tmp_path: Path) -> Iterator[TestClient]:
    """The REST app in-process on a real SQLite ledger, running no study (as test_api_units)."""
    from service.api import create_app

    settings = Settings(home=tmp_path, max_parallel_studies=0, mlflow_tracking_uri="http://127.0.0.1:9")
    with TestClient(create_app(settings)) as c:
        yield c


def test_a_sampled_studys_budget_only_grows(rest: TestClient) -> None:
    """An extension with a smaller `max_trials` answered 200 with a negative count added (-4) and kept
    the spec: it is a 422 naming the study's budget and what to do; the same budget adds 0, changes
    nothing; a larger one adds the difference."""
    spec = {
        "name": "budget", "sampler": "random", "max_trials": 6, "seeds": [1], "base": TINY,
        "space": {"dims": {"lr": {"loguniform": [1e-4, 1e-2]}}},
    }  # fmt: skip
    made = rest.post("/studies", json=spec)
    assert made.status_code in (200, 201, 202), made.text
    sid = made.json()["id"]
    rest.app.state.runner.cancel(sid)  # type: ignore[attr-defined]  # this server runs nothing
    smaller = rest.post(f"/studies/{sid}/extend", json={"max_trials": 2})
    assert smaller.status_code == 422, smaller.text
    said = smaller.text
    assert "max_trials 2" in said and "study's 6" in said and "above 6" in said, said
    assert rest.get(f"/studies/{sid}").json()["spec"]["max_trials"] == 6
    same = rest.post(f"/studies/{sid}/extend", json={"max_trials": 6})
    assert same.status_code == 200 and same.json()["added"] == 0, same.text
    more = rest.post(f"/studies/{sid}/extend", json={"max_trials": 9})
    assert more.status_code == 200 and more.json()["added"] == 3, more.text
    assert rest.get(f"/studies/{sid}").json()["spec"]["max_trials"] == 9


@pytest.mark.slow
def test_a_shutdown_leaves_its_running_trials_pending_not_cancelled(engine: Any, mlflow_uri: str) -> None:
    """A runner's shutdown (a server's SIGTERM, a Ctrl-C) stopped its studies as a user's cancel does:
    their running trials read `cancelled` ("the study was cancelled") in the ledger until the runner
    rewrote them pending, and stayed so in MLflow; a kill meanwhile left them cancelled. Now they go
    straight to `pending`, saying the runner stopped and the next start resumes them, in both; the
    next run trains them again without that reason, and nothing twice."""
    from service.runner import StudyRunner

    study = engine.create_study(lr_grid("shutdown", [1e-3, 3e-4, 1e-4], 4000))
    watch = Ledger(engine.ledger.url)
    runner = StudyRunner(engine, workers=1)
    seen: set[str] = set()  # every trial status and study state the shutdown went through
    polling = threading.Event()

    def poll() -> None:
        while not polling.is_set():
            seen.add(f"study {watch.study(study.id).state}")
            seen.update(t.status for t in watch.trials(study.id))
            time.sleep(0.02)

    try:
        runner.submit(study.id)
        wait_until(  # its live child run made (at once its id is in the ledger)
            "no trial ever started",
            lambda: any(t.status == "running" and t.mlflow_run_id for t in watch.trials(study.id)),
        )
        poller = threading.Thread(target=poll)
        poller.start()
        runner.shutdown()
    finally:
        polling.set()
        runner.shutdown()
    poller.join()
    assert "cancelled" not in seen and "study cancelled" not in seen, seen
    row = watch.study(study.id)
    assert row.state == "pending" and "runner stopped" in (row.error or ""), (row.state, row.error)
    trials = watch.trials(study.id)
    stopped = [t for t in trials if t.runs == 1 and t.status == "pending"]
    assert stopped and not [t for t in trials if t.status in ("cancelled", "running")]
    mlflow = MlflowClient(mlflow_uri)
    # the trial seen running had its live child run; one claimed just before the shutdown, on a loaded
    # machine, may have had none yet (it trains again with one): MLflow is checked where there is a run
    assert any(t.mlflow_run_id for t in stopped), stopped
    for t in stopped:
        assert "runner stopped" in (t.reason or "") and "next start resumes" in (t.reason or ""), t.reason
        if t.mlflow_run_id is None:
            continue
        run = mlflow.get_run(t.mlflow_run_id)
        assert run.info.status == "KILLED"
        assert run.data.tags["memsweep.status"] == "pending", run.data.tags
        assert run.data.tags["memsweep.reason"] == t.reason
    done_before = {t.config_hash: t.final_val_loss for t in trials if t.status == "done"}

    training: dict[str, set[str | None]] = {t.config_hash: set() for t in stopped}  # reasons while running

    def reasons() -> bool:
        for t in watch.trials(study.id):
            if t.config_hash in training and t.status == "running":
                training[t.config_hash].add(t.reason)
        return watch.study(study.id).state == "done"

    again = StudyRunner(engine, workers=1)
    try:
        again.submit(study.id)
        wait_until("the resumed study never ended", reasons, seconds=300)
    finally:
        again.shutdown()
    assert all(while_running == {None} for while_running in training.values()), training
    final = watch.trials(study.id)
    assert all(t.status == "done" for t in final)
    for t in final:
        assert t.runs == (2 if t.config_hash in training else 1)  # none trained twice but the stopped
        if t.config_hash in done_before:
            assert t.final_val_loss == done_before[t.config_hash]


@pytest.mark.slow
def test_memsweep_run_stops_at_sigterm_as_at_a_ctrl_c(tmp_path: Path, mlflow_uri: str) -> None:
    """SIGTERM (`kill`, `timeout`, a batch scheduler, a container's stop) killed `memsweep run` at once:
    its study and trials stayed `running` and its embedded Ray's processes outlived it. It stops as a
    Ctrl-C does: the study and its running trials `pending`, resumable, Ray shut down, one line said."""
    spec = tmp_path / "spec.json"
    spec.write_text(lr_grid("sigterm", [1e-3, 3e-4], 20_000).model_dump_json())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "MEMSWEEP_RAY_ADDRESS"))}
    env.update(MEMSWEEP_HOME=str(tmp_path / "home"), MEMSWEEP_MLFLOW_TRACKING_URI=mlflow_uri)
    run = subprocess.Popen(
        [sys.executable, "-P", "-m", "service.cli", "run", str(spec)], env=env, cwd=Path(__file__).parents[2],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        ledger = tmp_path / "home" / "ledger.db"
        wait_until("the ledger never appeared", ledger.exists)
        watch = Ledger(f"sqlite:///{ledger}")
        wait_until(
            "no trial ever started",
            lambda: any(t.status == "running" for s in watch.list_studies() for t in watch.trials(s.id)),
        )
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=120)
    finally:
        run.kill()
    (study,) = watch.list_studies()
    assert run.returncode == 1, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == (
        f"terminated (SIGTERM): study {study.id} stopped, its unfinished trials pending; "
        f"`memsweep run --study {study.id}` resumes it"
    ), stderr[-3000:]
    assert "Traceback" not in stderr
    assert watch.study(study.id).state == "pending"
    trials = watch.trials(study.id)
    assert {t.status for t in trials} == {"pending"}
    assert all("runner stopped" in (t.reason or "") for t in trials if t.runs == 1)
    assert not list((tmp_path / "home" / "embedded-ray").iterdir())  # its record gone: Ray shut down


def dead_owner() -> str:
    """A study's owner on this host whose process has exited (as a SIGKILL leaves it)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = processes.started(child.pid)
    child.wait()
    return f"{socket.gethostname()}/{child.pid}/{started}"


@pytest.mark.slow
def test_what_a_dead_process_left_running_reads_pending_once_the_study_is_claimed(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A study resumed after its process was killed showed that process's trials `running` until its
    new run had Ray, MLflow and its plan up (about 10 s after a restart), though nothing trained them.
    Its claim says no other process runs the study: they read `pending` from then, before anything
    comes up, and train once more each."""
    from service.runner import StudyRunner

    study = engine.create_study(lr_grid("orphans", [1e-3, 3e-4, 1e-4], 40))
    dead = Ledger(engine.ledger.url)  # the killed process's writes, under its claim
    owner = dead_owner()
    assert dead.claim_study(study.id, owner, lambda owner, beat: True) is None
    dead.update_study(study.id, state="running")
    left = [t.config_hash for t in dead.trials(study.id)[:2]]
    for h in left:
        assert dead.start_trial(study.id, h) is not None

    runner = StudyRunner(engine, workers=1)
    claimed, release = threading.Event(), threading.Event()
    prepare = runner.prepare

    def bring_up() -> None:  # Ray and MLflow come up once the test has looked
        claimed.set()
        release.wait(60)
        prepare()

    monkeypatch.setattr(runner, "prepare", bring_up)
    watch = Ledger(engine.ledger.url)
    try:
        runner.submit(study.id)
        assert claimed.wait(60), "the study was never claimed"
        assert watch.study(study.id).owner != owner
        rows = {t.config_hash: t for t in watch.trials(study.id)}
        assert [rows[h].status for h in left] == ["pending", "pending"], [rows[h].status for h in left]
        assert all("died before it ended" in (rows[h].reason or "") for h in left)
        release.set()
        wait_until("the resumed study never ended", lambda: watch.study(study.id).state == "done")
    finally:
        release.set()
        runner.shutdown()
    final = watch.trials(study.id)
    assert all(t.status == "done" for t in final)
    assert sorted(t.runs for t in final) == [1, 2, 2] and {
        t.config_hash for t in final if t.runs == 2
    } == set(left)


# Why a study's run stops is one cause for the study and all its trials: a user's cancel that comes while a
# server's shutdown stops the run ends them all `cancelled` (the user asked for the study to end); before,
# the trials the shutdown had stopped read `pending` ("the next start resumes it") in a study that read
# `cancelled`. In-process stand-ins for Ray and MLflow (test_lifecycle's).


class StopsOneByOne(InProcess):
    """Starts every unit, then, once its run is told to stop, ends them one by one as Ray stops its
    trials: the first, then (`between`) the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.between: threading.Event | None = None
        self.go_on = threading.Event()
        self.fails = False  # it raises once its units have stopped

    def run(self, request: RunRequest, book: Any) -> None:
        runs = [f"unit-{i}" for i in range(len(request.units))]
        for run, unit in zip(runs, request.units, strict=True):
            book.started(run, unit)
        self.started.set()
        assert request.cancel.wait(30)
        book.ended(runs[0])
        if self.between is not None:
            self.between.set()
            assert self.go_on.wait(30)
        for run in runs[1:]:
            book.ended(run)
        book.close_unfinished("its unit ended before this member reported")
        if self.fails:
            raise RuntimeError("the executor failed as its run stopped")


def run_and_stop(
    make_engine: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    cancel_midway: bool,
    fails: bool = False,
) -> Any:
    """A study of 6 trials, one per unit, all started, then a shutdown (and, `cancel_midway`, its user's
    cancel after the first unit stopped): the study's row and its trials' rows after."""
    import service.runner as runner_module
    from service.runner import StudyRunner

    engine, _, trackers = make_engine()
    ex = StopsOneByOne()
    ex.fails = fails
    engine._executor = ex
    monkeypatch.setattr(runner_module, "plan_run", lambda engine, study_id, cancel: None)
    study = engine.create_study(grid(bundle_size=1, concurrency=6))
    runner = StudyRunner(engine, workers=1)
    runner.start_ray()
    assert runner.submit(study.id) and ex.started.wait(30)
    cancelled: list[bool] = []
    if cancel_midway:
        ex.between = threading.Event()
    stopping = threading.Thread(target=runner.shutdown, kwargs={"timeout": 30})
    stopping.start()
    if ex.between is not None:
        assert ex.between.wait(30)
        cancelled.append(runner.cancel(study.id))
        ex.go_on.set()
    stopping.join(60)
    assert not stopping.is_alive()
    assert cancelled == ([True] if cancel_midway else [])
    trials = engine.ledger.trials(study.id)
    # each trial's child run says what its row says (the cancel rewrote those the shutdown stopped first)
    runs = trackers[-1].runs
    assert [(runs[t.mlflow_run_id]["trial_status"], runs[t.mlflow_run_id]["reason"]) for t in trials] == [
        (t.status, t.reason) for t in trials
    ]
    return engine.ledger.study(study.id), trials


def test_a_cancel_during_a_shutdown_ends_the_study_and_every_trial_cancelled(
    make_engine: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    study, trials = run_and_stop(make_engine, monkeypatch, cancel_midway=True)
    assert (study.state, study.error) == ("cancelled", None)
    assert [(t.status, t.reason) for t in trials] == [("cancelled", CANCEL_NOTE)] * 6


def test_a_cancel_during_a_shutdown_and_then_an_error_still_ends_every_trial_cancelled(
    make_engine: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run's stop was read only when it ended without an error: a failing executor left the trials
    the shutdown had stopped first `pending` ("the next start resumes it") in a study written `failed`,
    which no start resumes."""
    study, trials = run_and_stop(make_engine, monkeypatch, cancel_midway=True, fails=True)
    assert study.state == "cancelled" and "the executor failed" in (study.error or "")
    assert [(t.status, t.reason) for t in trials] == [("cancelled", CANCEL_NOTE)] * 6


def test_a_shutdown_alone_leaves_the_study_and_every_trial_pending(
    make_engine: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    study, trials = run_and_stop(make_engine, monkeypatch, cancel_midway=False)
    assert (study.state, study.error) == ("pending", SHUTDOWN_NOTE)
    assert [(t.status, t.reason) for t in trials] == [("pending", SHUTDOWN_NOTE)] * 6


def test_the_stop_is_decided_once_at_the_runs_end() -> None:
    """A cancel wins over a shutdown until the run's end reads the cause; after a run that ended paused
    by a shutdown it is refused (the answer says so), and a shutdown never turns a cancel back."""
    from service.study.book import Stop

    paused = Stop()
    paused.shut_down()
    assert paused.outcome() == ("pending", SHUTDOWN_NOTE)
    assert paused.settle() == "pending"
    assert not paused.cancel() and paused.settle() == "pending"

    cancelled = Stop()
    cancelled.shut_down()
    assert cancelled.cancel()
    cancelled.shut_down()
    assert cancelled.outcome() == ("cancelled", CANCEL_NOTE) and cancelled.settle() == "cancelled"

    done = Stop()
    assert done.settle() is None
    assert not done.cancel() and done.settle() is None  # the run has ended: nothing is left to cancel


# The ledger's database gone past its patience while a run records (issue: PostgreSQL stopped 150 s under
# a server): the study failed with a 9,749-character TuneError traceback, its trials read "the study's run
# stopped (TuneError: Traceback (most recent call last):) (attempt 1 of 3; it runs again)" though nothing
# resumed it, the outage spent an attempt of each, and the results that came meanwhile were lost. A real
# SQLite ledger made unavailable (its file moved away: no connection opens), a patience of half a second.

PATIENCE = 0.5


class LedgerFile:
    """The ledger's SQLite file moved away and a folder in its place, as a stopped database server: every
    new connection fails (`unable to open database file`, SQLAlchemy's OperationalError) until `up`."""

    def __init__(self, engine: Any) -> None:
        self.database = engine.ledger.database
        self.path = Path(self.database.url.database)
        self.away = self.path.with_name(self.path.name + ".away")
        self.lock = threading.Lock()

    def down(self) -> None:
        with self.lock:
            self.database.dispose()  # the pool's connections closed: the next call opens one
            self.path.rename(self.away)
            self.path.mkdir()

    def up(self) -> None:
        with self.lock:
            if self.away.exists():
                self.path.rmdir()
                self.away.rename(self.path)
            self.database.dispose()


class LedgerGoesDown(InProcess):
    """Ray Tune's run as the outage met it: two units started (concurrency 2), the first one's results
    reported while the ledger is down; the driver's write of them outlasts its patience, and Tune
    re-raises the callback's error as a TuneError of its traceback's text (`TuneController`), ending
    the run with the second unit open. The ledger comes back at once (`back_after` None), or that many
    seconds later. Only its first run does so; the next runs train as `InProcess`."""

    def __init__(self, ledger: LedgerFile, back_after: float | None = None) -> None:
        super().__init__()
        self.ledger, self.back_after = ledger, back_after
        self.outages = 0
        self.reported: list[str] = []  # the first unit's members, whose results came during the outage
        self.open: list[str] = []  # the second unit's, which never reported

    def run(self, request: RunRequest, book: Any) -> None:
        if self.outages:
            return super().run(request, book)
        from ray.tune.error import TuneError

        from service.study.worker import train_unit

        self.outages += 1
        first, second = request.units[0], request.units[1]
        book.started("tune-1", first)
        book.started("tune-2", second)
        self.rounds.append([[m.config_hash for m in u.members] for u in (first, second)])
        reports: list[dict[str, Any]] = []
        train_unit(first, reports.append, node="in-process")
        self.reported = [m.config_hash for m in first.members]
        self.open = [m.config_hash for m in second.members]
        error: Exception | None = None
        try:
            for report in reports:
                if any(isinstance(e, Finished) for e in report["events"]):
                    self.ledger.down()
                book.reported("tune-1", report["events"])
        except Exception:
            error = TuneError(traceback.format_exc())  # as Ray's controller raises it, chained
        assert error is not None, "the ledger took the results it did not answer for"
        if self.back_after is None:
            self.ledger.up()
        else:
            threading.Timer(self.back_after, self.ledger.up).start()
        raise error


def outage_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, back_after: float | None = None) -> Any:
    """An engine (`make_engine`'s) on a ledger that goes down under its first run (`LedgerGoesDown`)."""
    import contextvars

    from service.store import patience
    from service.study.engine import Engine
    from tests.service.test_lifecycle import MemoryTracker

    monkeypatch.setattr(patience, "PATIENCE", contextvars.ContextVar("ledger_patience", default=PATIENCE))
    settings = Settings(home=tmp_path, mlflow_tracking_uri="memory://lifecycle", trial_attempts=2)
    engine = Engine(settings, tracker=MemoryTracker)  # type: ignore[arg-type]
    engine._executor = LedgerGoesDown(LedgerFile(engine), back_after)
    return engine


def test_a_ledger_outage_past_its_patience_is_said_in_one_line_spends_no_attempt_and_loses_no_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The study reads `pending` with the outage in one line, its trials too, none charged an attempt;
    the results that came during the outage are written by the study's next run, not trained again."""
    from ray.tune.error import TuneError

    engine = outage_engine(tmp_path, monkeypatch)
    ex = engine._executor
    study = engine.create_study(grid(bundle_size=1))
    with pytest.raises(TuneError, match="Traceback"):  # the run's error itself, whole, for the log
        engine.run_study(study.id)
    row = engine.ledger.study(study.id)
    said = f"the ledger (SQLite {ex.ledger.path}) did not answer for"
    assert row.state == "pending", (row.state, row.error)
    error = row.error or ""
    assert error.startswith(said) and "unable to open database file" in error, error
    assert "\n" not in error and "Traceback" not in error and len(error) < 600, error
    assert f"memsweep resume {study.id}" in error
    rows = {t.config_hash: t for t in engine.ledger.trials(study.id)}
    for h in ex.open:  # open, no result: pending, the outage said, no attempt spent
        t = rows[h]
        assert (t.status, t.runs) == ("pending", 1), (t.status, t.reason)
        assert (t.reason or "").startswith(said) and "no attempt spent" in (t.reason or ""), t.reason
        assert "once the ledger answers" in (t.reason or "") and "\n" not in (t.reason or "")
        assert "Traceback" not in (t.reason or "") and "attempt 1 of" not in (t.reason or "")
    for h in ex.reported:  # its result came: kept for the next run, which writes it
        assert (rows[h].status, rows[h].runs) == ("pending", 1)
        assert (rows[h].reason or "").startswith("its result came while the ledger did not answer")
    assert set(engine.unwritten[study.id]) == set(ex.reported)

    engine.run_study(study.id)  # its resume: the kept results first, then what is left
    trained = [h for units in ex.rounds[1:] for unit in units for h in unit]
    assert not set(ex.reported) & set(trained), "a result kept was trained again"
    final = {t.config_hash: t for t in engine.ledger.trials(study.id)}
    assert engine.ledger.study(study.id).state == "done" and not engine.unwritten[study.id]
    assert all(t.status in ("done", "failed") for t in final.values()), [t.status for t in final.values()]
    # each trained once, but the one the outage stopped (twice, and counted so): none twice unsaid
    assert {h: t.runs for h, t in final.items()} == {h: 2 if h in ex.open else 1 for h in final}
    assert all(final[h].final_val_loss is not None for h in ex.reported)


class CallbackFails(InProcess):
    """Ray Tune's run as a driver's callback that raises meets it: two units started, then the callback's
    error re-raised as a TuneError of its traceback's text, chained to it (as Tune's controller does), or
    that text alone (`chained` False)."""

    def __init__(self, chained: bool) -> None:
        super().__init__()
        self.chained = chained

    def run(self, request: RunRequest, book: Any) -> None:
        from ray.tune.error import TuneError

        for i, unit in enumerate(request.units[:2]):
            book.started(f"tune-{i}", unit)
        try:
            {}["lr"]  # a callback's bug
        except KeyError:
            text = traceback.format_exc()
            if self.chained:
                raise TuneError(text)  # noqa: B904  (chained implicitly, as Tune's controller raises it)
        raise TuneError(text)


@pytest.mark.parametrize("chained", [True, False])
def test_a_failed_runs_error_and_its_trials_reason_name_the_error_ray_tune_wrapped(
    tmp_path: Path, chained: bool
) -> None:
    """The study's error was Ray Tune's whole traceback, and its trials read its first line: "the study's
    run stopped (TuneError: Traceback (most recent call last):) (attempt 1 of 3; it runs again)", though
    nothing runs a failed study again. Now both name what was raised, in one line."""
    from ray.tune.error import TuneError

    from service.study.engine import Engine
    from tests.service.test_lifecycle import MemoryTracker

    settings = Settings(home=tmp_path, mlflow_tracking_uri="memory://lifecycle", trial_attempts=2)
    engine = Engine(settings, executor=CallbackFails(chained), tracker=MemoryTracker)  # type: ignore[arg-type]
    study = engine.create_study(grid(bundle_size=1))
    with pytest.raises(TuneError):
        engine.run_study(study.id)
    row = engine.ledger.study(study.id)
    assert (row.state, row.error) == ("failed", "KeyError: 'lr'")
    stopped = [t for t in engine.ledger.trials(study.id) if t.runs == 1]
    assert len(stopped) == 2
    for t in stopped:
        assert t.status == "pending" and (t.reason or "").startswith(
            "the study's run stopped (KeyError: 'lr'); "
        )
        assert "Traceback" not in (t.reason or "") and "it runs again" not in (t.reason or ""), t.reason
        assert f"memsweep resume {study.id}" in (t.reason or "")


@pytest.mark.parametrize("back_after", [None, 2.0])
def test_a_server_resumes_a_study_a_ledger_outage_stopped_once_the_ledger_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, back_after: float | None
) -> None:
    """Nothing resumed the study until its user ran `memsweep resume`, though its trials said "it runs
    again". The runner now waits for the ledger and runs it again, the ledger back as the run stopped or
    (`back_after`) a while after (the study's and its trials' writes outlast their patience too): the
    study ends `done`, every result recorded, none trained twice but those the outage stopped."""
    import service.runner as runner_module
    from service.runner import StudyRunner

    engine = outage_engine(tmp_path, monkeypatch, back_after)
    ex = engine._executor
    monkeypatch.setattr(runner_module, "plan_run", lambda engine, study_id, cancel: None)
    monkeypatch.setattr(runner_module, "LEDGER_POLL", (0.2, 0.5), raising=False)
    study = engine.create_study(grid(bundle_size=1))
    runner = StudyRunner(engine, workers=1)
    runner.start_ray()
    try:
        assert runner.submit(study.id)
        wait_until(
            "the study was never resumed", lambda: bool(ex.outages) and not runner.is_active(study.id), 60
        )
    finally:
        ex.ledger.up()
        runner.shutdown(timeout=30)
    row = engine.ledger.study(study.id)
    assert (row.state, row.error) == ("done", None), (row.state, row.error)
    final = {t.config_hash: t for t in engine.ledger.trials(study.id)}
    assert all(t.status in ("done", "failed") for t in final.values())
    assert {h: t.runs for h, t in final.items()} == {h: 2 if h in ex.open else 1 for h in final}


def test_memsweep_runs_bar_waits_out_a_ledger_outage_with_its_runner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`memsweep run`'s bar read the ledger with the engine's whole patience and raised past it, ending the
    command while its runner waited to resume the study once the ledger answered: it says the ledger does
    not answer, and goes on with the runner."""
    from service.cli import commands

    engine = outage_engine(tmp_path, monkeypatch)
    ledger = engine._executor.ledger
    study = engine.create_study(grid(bundle_size=1))
    monkeypatch.setattr(commands, "BAR_PATIENCE", 0.3, raising=False)  # (the bar had no patience of its own)

    class Runner:
        """The runner as the bar sees it: the study runs for five turns, the ledger down for three."""

        def __init__(self) -> None:
            self.engine, self.turns = engine, 0

        def is_active(self, study_id: str) -> bool:
            self.turns += 1
            if self.turns == 1:
                ledger.down()
            if self.turns == 4:
                ledger.up()
            return self.turns < 5

        def is_queued(self, study_id: str) -> bool:
            return False

        def eta(self, study_id: str) -> float | None:
            return None

    runner = Runner()
    commands.show_progress(runner, study.id, quiet=True)
    assert runner.turns == 5  # every turn taken, the outage's included


class DownAfterACommit(InProcess):
    """Its first run: a bundle's results reported, the ledger going down just after the first one is
    committed (as the child run's id and the counts are written next), and Tune re-raising the callback's
    error. Later runs train as `InProcess`."""

    def __init__(self, ledger: LedgerFile) -> None:
        super().__init__()
        self.ledger, self.first, self.members = ledger, True, []

    def run(self, request: RunRequest, book: Any) -> None:
        if not self.first:
            return super().run(request, book)
        self.first = False
        from ray.tune.error import TuneError

        from service.study.worker import train_unit

        unit = request.units[0]
        book.started("tune-1", unit)
        reports: list[dict[str, Any]] = []
        train_unit(unit, reports.append, node="in-process")
        self.members = [m.config_hash for m in unit.members]
        written = book.ledger.finish_trial

        def then_down(trial_id: int, result: Any) -> Any:
            row = written(trial_id, result)
            self.ledger.down()
            return row

        book.ledger.finish_trial = then_down
        try:
            for report in reports:
                book.reported("tune-1", report["events"])
        except Exception:
            raise TuneError(traceback.format_exc()) from None
        finally:
            book.ledger.finish_trial = written
            self.ledger.up()
        raise AssertionError("the second result's write outlasts its patience")


def test_a_result_kept_through_an_outage_outlives_its_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The results that came while the ledger did not answer were kept in the process's memory: a
    restart before the ledger came back (a server redeployed, `memsweep run` interrupted) lost them and
    they trained again. They are kept on disk under the home, and the study's next run in another
    process writes them, training none of them again; one whose file cannot be read trains again."""
    from ray.tune.error import TuneError

    from service.study.engine import Engine
    from tests.service.test_lifecycle import MemoryTracker

    engine = outage_engine(tmp_path, monkeypatch)
    ex = engine._executor
    study = engine.create_study(grid(bundle_size=2))
    with pytest.raises(TuneError):
        engine.run_study(study.id)
    assert len(ex.reported) == 2  # a bundle of two whose results came during the outage
    folder = tmp_path / "unwritten" / study.id
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{h}.result.pt" for h in ex.reported)
    reason = {t.config_hash: t.reason for t in engine.ledger.trials(study.id)}[ex.reported[0]] or ""
    assert "kept on this machine's disk" in reason and "by this process or the next" in reason, reason

    # the process ends; a new one (its own engine, as a restarted server's) runs the study
    spoiled = ex.reported[-1]
    (folder / f"{spoiled}.result.pt").write_bytes(b"not a result")
    again = Engine(engine.settings, tracker=MemoryTracker)  # type: ignore[arg-type]
    again._executor = InProcess()
    again.run_study(study.id)
    trained = [h for units in again._executor.rounds for unit in units for h in unit]
    assert set(trained) & set(ex.reported) == {spoiled}, "a kept result was trained again"
    final = {t.config_hash: t for t in again.ledger.trials(study.id)}
    assert again.ledger.study(study.id).state == "done"
    assert all(final[h].status == "done" and final[h].runs == 1 for h in ex.reported if h != spoiled)
    assert (final[spoiled].status, final[spoiled].runs) == ("done", 2)
    assert [p.name for p in folder.iterdir()] == [f"{spoiled}.result.pt.unreadable"]  # set aside, said


def test_kept_results_read_back_whole_across_a_record_change_and_a_disk_that_refuses(tmp_path: Path) -> None:
    """A kept result reads back as it was written, W and V included; one written by a memsweep whose
    record had another field reads with what this one knows; a wrong file is set aside, not read again;
    a disk that refuses the file keeps the result in memory; a save a crash cut short leaves nothing."""
    import torch

    import trainers
    from service.study.kept import SUFFIX, KeptResults, packed
    from trainers.result import Evaluation

    result = trainers.TrialResult(
        final_val_loss=0.25, final_metric=0.5, metric_name="recall_accuracy", steps=20, budget_steps=20,
        history=[Evaluation(10, 1.0, 0.5, 0.4, 0.3, 1.5), Evaluation(20, 2.0, 0.3, 0.25, 0.5, 3.0)],
        provenance={"numerics": "portable"}, recurrent_matrix=torch.randn(4, 4), input_matrix=torch.randn(4, 2),
    )  # fmt: skip
    kept = KeptResults(tmp_path / "unwritten" / "s1")
    kept["a1"] = result
    back = KeptResults(tmp_path / "unwritten" / "s1")["a1"]  # another process's view of the same folder
    assert back.to_dict() == result.to_dict()
    assert torch.equal(back.recurrent_matrix, result.recurrent_matrix)
    assert torch.equal(back.input_matrix, result.input_matrix)
    other = packed(result)
    other["fields"] = other["fields"][:-1] + ', "a_field_of_another_version": 1}'
    torch.save(other, kept.folder / f"b2{SUFFIX}")
    assert kept["b2"].to_dict() == result.to_dict()
    torch.save({"not": "a result"}, kept.folder / f"c3{SUFFIX}")
    assert kept.get("c3") is None and "c3" not in kept and (kept.folder / f"c3{SUFFIX}.unreadable").exists()
    (kept.folder / f"d4{SUFFIX}.part").write_bytes(b"cut short")
    assert sorted(kept) == ["a1", "b2"]
    del kept["a1"], kept["b2"]
    assert not kept and not (kept.folder / f"d4{SUFFIX}.part").exists()

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    in_memory = KeptResults(blocked / "s2")  # its folder cannot be made
    in_memory["e5"] = result
    assert list(in_memory) == ["e5"] and in_memory["e5"] is result and "e5" in in_memory
    del in_memory["e5"]
    assert not in_memory


def test_a_result_written_just_before_an_outage_stays_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger stopping right after a result's write (before the child run's id and the counts) read
    as if the write had failed: the result was kept and its `done` row written back to `pending`, saying
    it was held in memory, and it would have been written again (or, after a restart, trained again)."""
    from ray.tune.error import TuneError

    engine = outage_engine(tmp_path, monkeypatch)
    ex = DownAfterACommit(engine._executor.ledger)
    engine._executor = ex
    study = engine.create_study(grid(bundle_size=2))
    with pytest.raises(TuneError):
        engine.run_study(study.id)
    rows = {t.config_hash: t for t in engine.ledger.trials(study.id)}
    first, second = ex.members[:2]
    assert (rows[first].status, rows[first].runs) == ("done", 1), (rows[first].status, rows[first].reason)
    assert set(engine.unwritten[study.id]) == {second}  # only the result the ledger did not take
    engine.run_study(study.id)
    rows = {t.config_hash: t for t in engine.ledger.trials(study.id)}
    assert (rows[first].status, rows[first].runs, rows[second].status, rows[second].runs) == (
        "done",
        1,
        "done",
        1,
    )


def test_a_cancel_while_the_runner_waits_out_an_outage_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long outage ate the failure's writes and the claim's release (the study still `running` under
    this process); a cancel while the runner waited for the ledger was answered, but only an unclaimed
    study's cancel was tried, which a held one refuses: nothing was written, and the next start trained
    the study its user had cancelled. The cancel is written by one more run, which finds its stop set."""
    import concurrent.futures

    import service.runner as runner_module
    from service.runner import Active, StudyRunner
    from service.study.claim import this_process
    from service.study.engine import Engine
    from tests.service.test_lifecycle import MemoryTracker

    monkeypatch.setattr(runner_module, "LEDGER_POLL", (0.2, 0.2))
    engine = Engine(Settings(home=tmp_path, mlflow_tracking_uri="memory://x"), tracker=MemoryTracker)  # type: ignore[arg-type]
    engine._executor = InProcess()  # (Ray's stand-in: the run ends before it would train)
    study = engine.create_study(grid(bundle_size=1))
    engine.ledger.update_study(study.id, state="running", owner=this_process(), owner_beat=time.time())
    runner, a = StudyRunner(engine, workers=1), Active()
    with runner._lock:
        runner._active[study.id] = a
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        a.future = pool.submit(runner._after_outage, study.id, a)
        time.sleep(0.1)
        assert runner.cancel(study.id)
        assert a.future.result(timeout=30) is True  # to run once more, its stop set
    runner._run(study.id, a)
    row = engine.ledger.study(study.id)
    assert (row.state, row.owner) == ("cancelled", None)
    runner.shutdown()


def test_the_runner_resumes_a_paused_study_only_once_the_ledger_takes_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database that answers but refuses writes (read-only, full) passed the runner's check that it
    answered: the study ran again, its claim's write failed after the whole patience, and so on for
    ever. The runner waits until the ledger takes writes."""
    import concurrent.futures

    from sqlalchemy import event

    import service.runner as runner_module
    from service.runner import Active, StudyRunner
    from service.study.engine import Engine
    from tests.service.test_lifecycle import MemoryTracker

    def read_only(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.execute("PRAGMA query_only = ON")  # SQLite's refusal of a read-only file's writes

    monkeypatch.setattr(runner_module, "LEDGER_POLL", (0.1, 0.1))
    engine = Engine(Settings(home=tmp_path, mlflow_tracking_uri="memory://x"), tracker=MemoryTracker)  # type: ignore[arg-type]
    study = engine.create_study(grid(bundle_size=1))
    database = engine.ledger.database
    runner, a = StudyRunner(engine, workers=1), Active()
    event.listen(database, "connect", read_only)
    database.dispose()
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waited = pool.submit(runner._after_outage, study.id, a)
            time.sleep(1.0)
            assert not waited.done()  # it answers, and refuses writes: still waiting
            event.remove(database, "connect", read_only)
            database.dispose()
            assert waited.result(timeout=10) is True
    finally:
        if event.contains(database, "connect", read_only):
            event.remove(database, "connect", read_only)
        runner.shutdown()
