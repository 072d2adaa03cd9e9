"""Two studies that hold one trial, run at once: the first to start it trains it, and the other takes
its result instead of training the trial a second time (`service.study.elsewhere`)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import trainers
from service.application.reads import NoRuns, StudyReads
from service.core.spec import StudySpec
from service.store.ledger import Holder
from service.study import elsewhere
from service.study.claim import this_process
from service.study.elsewhere import trained_elsewhere
from tests.service.conftest import TINY

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def holder(h: str, status: str, study: str, minutes: int, owner: str | None = None) -> Holder:
    return Holder(h, status, study, T0 + timedelta(minutes=minutes), owner or this_process(), time.time())


def test_a_study_waits_only_for_a_trial_another_live_study_trains_now():
    mine = {h: "pending" for h in "abcdefg"} | {"own": "running", "fin": "done"}
    gone = "elsewhere/1/1"  # another host's process that has not beaten for the lease
    holders = [
        holder("a", "pending", "older", 1),  # older, still to train: this one trains it if it comes first
        holder("b", "pending", "newer", 9),  # newer, not started: the same
        holder("c", "running", "newer", 9),  # training it now: waited for
        holder("d", "running", "older", 1),  # training it now: waited for
        Holder("e", "running", "dead", T0, gone, time.time() - 3600),  # its process is gone
        Holder("f", "running", "unowned", T0, None, None),  # no process holds that study
        holder("own", "running", "older", 1),  # this study's own, left running by its crash: its own
        holder("fin", "running", "older", 1),  # this study has it already
    ]
    assert trained_elsewhere(mine, holders) == {"c": "newer", "d": "older"}
    # a study training the trial now waits on no one for it: no two studies wait on each other
    assert trained_elsewhere({"c": "running"}, [holder("c", "running", "x", 1)]) == {}


def two_studies(engine: Any, a_lrs: list[float], b_lrs: list[float], **both: Any) -> tuple[Any, Any]:
    """A (older) and B, studies of `TINY` over these learning rates (`both`: more of their specs); A
    marked running in this process, as a server running it would be."""

    def spec(lrs: list[float]) -> StudySpec:
        return StudySpec.model_validate({"space": {"dims": {"lr": lrs}}, "base": TINY, "seeds": [1], **both})

    a, b = engine.create_study(spec(a_lrs)), engine.create_study(spec(b_lrs))
    engine.ledger.update_study(a.id, state="running", owner=this_process(), owner_beat=time.time())
    return a, b


def hashes(engine: Any, study_id: str) -> dict[float, str]:
    return {t.params["lr"]: t.config_hash for t in engine.ledger.trials(study_id)}


def row_of(engine: Any, study_id: str, config_hash: str) -> Any:
    (row,) = [t for t in engine.ledger.trials(study_id) if t.config_hash == config_hash]
    return row


def train_in(engine: Any, study_id: str, config_hash: str) -> Any:
    """The trial trained by that study, as its own run would (started, trained, finished)."""
    row = row_of(engine, study_id, config_hash)
    engine.ledger.start_trial(study_id, config_hash)
    engine.ledger.finish_trial(row.id, trainers.train(row.config))
    return row


def run_in_thread(engine: Any, study_id: str) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.update(engine.run_study(study_id)), daemon=True)
    thread.start()
    return thread, out


def wait_until(check: Any, what: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_study_takes_the_result_of_a_trial_another_study_trains_now(engine, monkeypatch):
    """It trained it a second time (the same numbers, twice the compute): a researcher's own cell swept
    beside a paper's model, posted while the paper's study ran. It trains its own trials, waits for the
    one another study is training, and takes that result: trained once."""
    monkeypatch.setattr(elsewhere, "POLL_SECONDS", 0.2)
    ledger = engine.ledger
    a, b = two_studies(engine, [1e-3, 1e-2], [1e-3, 3e-3])
    shared, own = hashes(engine, b.id)[1e-3], hashes(engine, b.id)[3e-3]
    ledger.start_trial(a.id, shared)  # A trains it now
    thread, summary = run_in_thread(engine, b.id)
    wait_until(lambda: ledger.statuses(b.id, [own])[own] == "done", "B to train its own trial")
    time.sleep(1.0)
    assert ledger.statuses(b.id, [shared])[shared] == "pending"  # waiting for A, not training it
    # what B's trials answer says of it (REST, `memsweep trials`): A trains it (it said only pending)
    page = StudyReads(ledger, engine.settings, NoRuns(None)).trials(
        b.id, None, None, "id", False, 0, 10, False
    )
    assert {t.config_hash: t.trained_by for t in page.items} == {shared: a.id, own: None}
    row = row_of(engine, a.id, shared)
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
    a, b = two_studies(engine, [1e-3, 1e-2], [1e-3, 3e-3])
    shared, own = hashes(engine, b.id)[1e-3], hashes(engine, b.id)[3e-3]
    ledger.start_trial(a.id, shared)
    thread, summary = run_in_thread(engine, b.id)
    wait_until(lambda: ledger.statuses(b.id, [own])[own] == "done", "B to train its own trial")
    assert ledger.statuses(b.id, [shared])[shared] == "pending"
    ledger.update_study(a.id, state="cancelled", owner=None)  # A stops before it ends the trial
    thread.join(timeout=180)
    assert not thread.is_alive() and summary["state"] == "done"
    trained = {t.config_hash: t for t in ledger.trials(b.id)}[shared]
    assert trained.status == "done" and trained.reused_from is None and trained.runs == 1


def test_the_first_study_to_start_a_shared_trial_trains_it_and_the_other_takes_its_result(engine):
    """A trial another study only holds still to train (a paper's study of thousands of trials, which
    will come to it in hours) is trained by the study that comes to it first: the newer study waited
    for the older one's queue before, holding its server slot. The older one, coming to it, takes
    that result."""
    ledger = engine.ledger
    a, b = two_studies(engine, [1e-3, 1e-2], [1e-3, 3e-3])
    shared = hashes(engine, b.id)[1e-3]
    assert engine.run_study(b.id)["state"] == "done"  # A holds the shared trial pending all along
    mine = row_of(engine, b.id, shared)
    assert mine.status == "done" and mine.runs == 1 and mine.reused_from is None
    ledger.update_study(a.id, state="pending", owner=None)
    assert engine.run_study(a.id)["state"] == "done"
    theirs = row_of(engine, a.id, shared)
    assert theirs.reused_from == mine.id and theirs.runs == 0
    assert row_of(engine, a.id, hashes(engine, a.id)[1e-2]).runs == 1


def test_a_unit_leaves_out_a_trial_another_study_started_after_the_round_began(engine, monkeypatch):
    """The round's units are packed when it begins, and each is started later, as a slot frees: a
    trial another study has started meanwhile is left out of its unit as the unit leaves the queue
    (`RunRequest.dispatch`), waited for, and its result taken; before, both trained it."""
    monkeypatch.setattr(elsewhere, "POLL_SECONDS", 0.2)
    ledger = engine.ledger
    lrs = [1e-3, 1e-2]
    a, b = two_studies(engine, lrs, lrs, base={**TINY, "steps": 3000, "eval_every": 1000}, bundle_size=1,
                       concurrency=1)  # fmt: skip
    thread, summary = run_in_thread(engine, b.id)
    wait_until(lambda: any(t.status == "running" for t in ledger.trials(b.id)), "B to start its first unit")
    (first,) = [t.config_hash for t in ledger.trials(b.id) if t.status == "running"]
    (second,) = set(hashes(engine, b.id).values()) - {first}
    ledger.start_trial(a.id, second)  # A starts the trial B's next unit holds, while B trains its first
    wait_until(lambda: ledger.statuses(b.id, [first])[first] == "done", "B to finish its first unit")
    time.sleep(1.0)
    assert ledger.statuses(b.id, [second])[second] == "pending"  # left out of its unit: A trains it
    row = row_of(engine, a.id, second)
    ledger.finish_trial(row.id, trainers.train(row.config))
    thread.join(timeout=180)
    assert not thread.is_alive() and summary["state"] == "done"
    taken = {t.config_hash: t for t in ledger.trials(b.id)}
    assert taken[second].reused_from == row.id and taken[second].runs == 0 and taken[first].runs == 1


def test_a_trial_another_study_finished_since_this_one_was_made_takes_its_result(engine):
    """Reuse was decided once, when the study was made: a trial another study finished while this one
    waited in the queue was trained again."""
    a, b = two_studies(engine, [1e-3, 1e-2], [1e-3, 3e-3])
    shared = hashes(engine, b.id)[1e-3]
    row = train_in(engine, a.id, shared)
    engine.ledger.update_study(a.id, state="done", owner=None)
    assert engine.run_study(b.id)["state"] == "done"
    taken = row_of(engine, b.id, shared)
    assert taken.reused_from == row.id and taken.runs == 0


def test_a_plan_says_which_of_its_trials_another_study_trains_now(engine):
    """A study posted while another trained some of its trials sat queued, its plan counting those among
    its units to train; they were taken from the other study. The plan says so, before and after the
    study is created."""
    from service.planning.plan import plan_spec, plan_study

    a, b = two_studies(engine, [1e-3, 1e-2], [1e-3, 3e-3])
    shared = hashes(engine, b.id)[1e-3]
    engine.ledger.start_trial(a.id, shared)  # A trains it now
    said = f"1 of the trials to run is training now in study {a.id}: this study waits for them"
    planned, _ = plan_study(engine, b.id, calibrate=False)
    assert sum(said in note for note in planned.notes) == 1, planned.notes
    spec = StudySpec.model_validate({"space": {"dims": {"lr": [1e-3, 3e-3]}}, "base": TINY, "seeds": [1]})
    assert sum(said in note for note in plan_spec(engine, spec, calibrate=False).notes) == 1
    planned_a, _ = plan_study(engine, a.id, calibrate=False)  # A trains it itself: no one to wait for
    assert not any("training now in study" in note for note in planned_a.notes)
