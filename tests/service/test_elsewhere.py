"""Two studies that hold one trial, run at once: the later one waits for the earlier one's result
instead of training the trial a second time (`service.study.elsewhere`)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import trainers
from service.core.spec import StudySpec
from service.store.ledger import Holder
from service.study import elsewhere
from service.study.claim import this_process
from service.study.elsewhere import trained_elsewhere
from tests.service.conftest import TINY

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def holder(h: str, status: str, study: str, minutes: int, owner: str | None = None) -> Holder:
    return Holder(h, status, study, T0 + timedelta(minutes=minutes), owner or this_process(), time.time())


def test_a_study_waits_on_an_older_study_or_on_one_training_the_trial_now_and_never_in_a_circle():
    me = SimpleNamespace(id="me", created_at=T0 + timedelta(minutes=5))
    mine = {h: "pending" for h in "abcdefg"} | {"own": "running"}
    gone = "elsewhere/1/1"  # another host's process that has not beaten for the lease
    holders = [
        holder("a", "pending", "older", 1),  # older, still to train: waited for
        holder("b", "pending", "newer", 9),  # newer, not started: this one trains it
        holder("c", "running", "newer", 9),  # newer, training it now: waited for
        Holder("d", "pending", "dead", T0, gone, time.time() - 3600),  # its process is gone
        Holder("e", "pending", "unowned", T0, None, None),  # no process holds that study
        holder("own", "pending", "older", 1),  # this study's own, left running by its crash
    ]
    assert trained_elsewhere(me, mine, holders) == {"a": "older", "c": "newer"}  # type: ignore[arg-type]
    # the older study does not wait on this one for a trial it holds and neither trains yet
    older = SimpleNamespace(id="older", created_at=T0 + timedelta(minutes=1))
    assert trained_elsewhere(older, {"a": "pending"}, [holder("a", "pending", "me", 5)]) == {}  # type: ignore[arg-type]
    # a study training the trial now waits on no one for it
    assert trained_elsewhere(me, {"c": "running"}, [holder("c", "running", "x", 1)]) == {}  # type: ignore[arg-type]


def two_studies(engine: Any) -> tuple[Any, Any, str, str]:
    """A (older): lr 1e-3 and 1e-2, marked running in this process; B: lr 1e-3 (A's trial) and 3e-3."""

    def spec(lrs: list[float]) -> StudySpec:
        return StudySpec.model_validate({"space": {"dims": {"lr": lrs}}, "base": TINY, "seeds": [1]})

    a = engine.create_study(spec([1e-3, 1e-2]))
    b = engine.create_study(spec([1e-3, 3e-3]))
    shared = {t.config_hash for t in engine.ledger.trials(a.id)} & {
        t.config_hash for t in engine.ledger.trials(b.id)
    }
    (h,) = shared
    (own,) = {t.config_hash for t in engine.ledger.trials(b.id)} - shared
    engine.ledger.update_study(a.id, state="running", owner=this_process(), owner_beat=time.time())
    return a, b, h, own


def run_in_thread(engine: Any, study_id: str) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.update(engine.run_study(study_id)), daemon=True)
    thread.start()
    return thread, out


def wait_until(check: Any, what: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_study_takes_the_result_of_a_trial_an_older_running_study_trains(engine, monkeypatch):
    """It trained it a second time (the same numbers, twice the compute): a researcher's own cell swept
    beside a paper's model, posted while the paper's study ran. It trains its own trials, waits for the
    shared one, and takes the older study's result: trained once, by the older study."""
    monkeypatch.setattr(elsewhere, "POLL_SECONDS", 0.2)
    ledger = engine.ledger
    a, b, shared, own = two_studies(engine)
    thread, summary = run_in_thread(engine, b.id)
    wait_until(lambda: ledger.statuses(b.id, [own])[own] == "done", "B to train its own trial")
    time.sleep(1.0)
    assert ledger.statuses(b.id, [shared])[shared] == "pending"  # waiting for A, not training it
    # A trains the shared trial (as its own run would)
    (row,) = [t for t in ledger.trials(a.id) if t.config_hash == shared]
    ledger.start_trial(a.id, shared)
    ledger.finish_trial(row.id, trainers.train(row.config))
    thread.join(timeout=180)
    assert not thread.is_alive() and summary["state"] == "done"
    taken = {t.config_hash: t for t in ledger.trials(b.id)}
    assert taken[shared].status == "done" and taken[shared].reused_from == row.id and taken[shared].runs == 0
    assert taken[shared].final_val_loss == ledger.trial(row.id).final_val_loss
    assert taken[own].runs == 1


def test_a_study_trains_the_trial_itself_when_the_study_it_waited_for_stops(engine, monkeypatch):
    """With one round to spend (`trial_attempts` 1), the round that trained its own trial was its last:
    the trial the other study left was never trained, and the study ended `done` with it pending."""
    monkeypatch.setattr(elsewhere, "POLL_SECONDS", 0.2)
    monkeypatch.setattr(engine.settings, "trial_attempts", 1)
    ledger = engine.ledger
    a, b, shared, own = two_studies(engine)
    thread, summary = run_in_thread(engine, b.id)
    wait_until(lambda: ledger.statuses(b.id, [own])[own] == "done", "B to train its own trial")
    assert ledger.statuses(b.id, [shared])[shared] == "pending"
    ledger.update_study(a.id, state="cancelled", owner=None)  # A stops before training it
    thread.join(timeout=180)
    assert not thread.is_alive() and summary["state"] == "done"
    trained = {t.config_hash: t for t in ledger.trials(b.id)}[shared]
    assert trained.status == "done" and trained.reused_from is None and trained.runs == 1


def test_a_trial_another_study_finished_since_this_one_was_made_takes_its_result(engine):
    """Reuse was decided once, when the study was made: a trial another study finished while this one
    waited in the queue was trained again."""
    ledger = engine.ledger
    a, b, shared, _own = two_studies(engine)
    (row,) = [t for t in ledger.trials(a.id) if t.config_hash == shared]
    ledger.start_trial(a.id, shared)
    ledger.finish_trial(row.id, trainers.train(row.config))
    ledger.update_study(a.id, state="done", owner=None)
    assert engine.run_study(b.id)["state"] == "done"
    taken = {t.config_hash: t for t in ledger.trials(b.id)}[shared]
    assert taken.reused_from == row.id and taken.runs == 0
