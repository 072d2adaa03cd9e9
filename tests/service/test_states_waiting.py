"""A study whose plan's calibrations waited for the CPUs another study held showed `queued` and
nothing more, for as long as that study ran: its answer says what it waits for (`waiting`), as
`GET /studies/{id}` and `memsweep status` show it. In-process stand-ins for Ray and MLflow
(test_lifecycle's)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from service.application.study_service import StudyService
from tests.service.test_lifecycle import grid, make_engine  # noqa: F401  (a fixture)


def test_a_study_calibrating_behind_a_running_one_says_what_it_waits_for(
    make_engine: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import service.runner as runner_module
    from service.runner import StudyRunner

    engine, ex, _ = make_engine()
    running, planned = engine.create_study(grid(name="running")), engine.create_study(grid(name="planned"))
    training, calibrating, release = threading.Event(), threading.Event(), threading.Event()

    def plan_run(engine: Any, study_id: str, cancel: threading.Event | None) -> None:
        if study_id == planned.id:  # its calibrations wait for the CPUs the other study holds
            calibrating.set()
            assert release.wait(30)

    def holding() -> None:
        training.set()
        assert release.wait(30)

    monkeypatch.setattr(runner_module, "plan_run", plan_run)
    ex.after_unit = holding
    runner = StudyRunner(engine, workers=2)
    runner.start_ray()
    studies = StudyService(engine, runner)
    try:
        assert runner.submit(running.id) and training.wait(30)
        assert runner.submit(planned.id) and calibrating.wait(30)
        answer = studies.get(planned.id)
        assert answer.queued
        assert (
            answer.waiting
            == f"calibrating its plan: its calibrations may wait for the CPUs that study {running.id} holds"
        )
        assert studies.get(running.id).waiting is None
    finally:
        release.set()
        runner.shutdown(timeout=30)
    assert studies.get(planned.id).waiting is None  # no longer queued here
