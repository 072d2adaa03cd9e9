"""Why a study's run stops is one cause for the study and all its trials: a user's cancel that comes
while a server's shutdown stops the run ends them all `cancelled` (the user asked for the study to
end); before, the trials the shutdown had stopped read `pending` ("the next start resumes it") in a
study that read `cancelled`. In-process stand-ins for Ray and MLflow (test_lifecycle's)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from service.study.book import CANCEL_NOTE, SHUTDOWN_NOTE
from service.study.executor import RunRequest
from tests.service.test_lifecycle import InProcess, grid, make_engine  # noqa: F401  (a fixture)


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
