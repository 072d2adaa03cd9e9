"""A study queued behind another kept what a dead process left `running` until its turn came (its
claim set them `pending`): they read `pending`, with the reason, as soon as the runner queues it (at
a server's start too, which queues every unfinished study), while a live process's rows (a
`memsweep run` in another shell on the same ledger) stay as they are. In-process stand-ins for Ray and
MLflow (test_lifecycle's)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from service.store.ledger import Ledger
from service.study.claim import this_process
from service.study.engine import ORPHAN_NOTE
from tests.service.test_lifecycle import grid, make_engine  # noqa: F401  (a fixture)
from tests.service.test_stops import dead_owner


def left_running(ledger: Ledger, study_id: str, owner: str, count: int) -> list[str]:
    """The study run by `owner` (through another connection, as its process wrote it), `count` of its
    trials started; their config hashes."""
    assert ledger.claim_study(study_id, owner, lambda owner, beat: True) is None
    ledger.update_study(study_id, state="running")
    hashes = [t.config_hash for t in ledger.trials(study_id)[:count]]
    for h in hashes:
        assert ledger.start_trial(study_id, h) is not None
    return hashes


def test_a_queued_study_reads_a_dead_processs_trials_pending_before_its_turn(
    make_engine: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import service.runner as runner_module
    from service.runner import StudyRunner

    engine, _, _ = make_engine()
    busy, orphaned, live = (engine.create_study(grid(name=n)) for n in ("busy", "orphaned", "live"))
    killed, live_owner = dead_owner(), this_process()
    dead = left_running(Ledger(engine.ledger.url), orphaned.id, killed, 2)
    running = left_running(Ledger(engine.ledger.url), live.id, live_owner, 1)
    inside, release = threading.Event(), threading.Event()

    def planning(engine: Any, study_id: str, cancel: threading.Event | None) -> None:
        if study_id == busy.id:  # holds the runner's one worker
            inside.set()
            assert release.wait(30)

    monkeypatch.setattr(runner_module, "plan_run", planning)
    runner = StudyRunner(engine, workers=1)
    runner.start_ray()
    watch = Ledger(engine.ledger.url)
    try:
        assert runner.submit(busy.id) and inside.wait(30)
        assert runner.submit(orphaned.id) and runner.submit(live.id)
        assert runner.is_queued(orphaned.id) and runner.is_queued(live.id)
        assert watch.study(orphaned.id).owner == killed  # not claimed yet: its turn has not come
        rows = {t.config_hash: t for t in watch.trials(orphaned.id)}
        assert [(rows[h].status, rows[h].reason) for h in dead] == [("pending", ORPHAN_NOTE)] * 2
        assert [t.status for t in watch.trials(live.id) if t.config_hash in running] == ["running"]
    finally:
        release.set()
        runner.shutdown(timeout=30)
