"""One process runs a study at a time (`service.study.claim`): a claim taken from its owner only when
that owner is gone, at once on this host, after the lease from another."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from service.core import processes
from service.store.ledger import ClaimLostError, Ledger
from service.study.claim import LEASE_SECONDS, SYNC, StudyBusyError, StudyClaim, gone, syncing, this_process
from service.study.engine import ORPHAN_NOTE
from tests.service.test_lifecycle import grid, make_engine  # noqa: F401  (a fixture)
from tests.service.test_stops import dead_owner


def test_an_owner_on_this_host_is_gone_when_its_process_is():
    assert not gone(this_process(), beat=None)  # alive, whatever its beat says
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = processes.started(child.pid)
    child.wait()
    host = socket.gethostname()
    assert started is not None and processes.started(child.pid) is None
    assert gone(f"{host}/{child.pid}/{started}", beat=time.time())  # its beat is fresh: the process tells
    # its pid now another process's (one that started at another time)
    assert gone(f"{host}/{os.getpid()}/{int(processes.started(os.getpid()) or 0) + 1}", beat=time.time())


def test_an_owner_on_another_host_is_gone_only_after_the_lease():
    now = time.time()
    assert not gone("elsewhere/12/345", beat=now - LEASE_SECONDS + 5, now=now)
    assert gone("elsewhere/12/345", beat=now - LEASE_SECONDS - 5, now=now)
    assert gone("elsewhere/12/345", beat=None, now=now)


def test_a_claimed_study_is_refused_to_another_process_until_released(tmp_path: Path):
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    study = ledger.create_study("s", {})
    other = f"elsewhere/1/{time.time()}"
    assert ledger.claim_study(study.id, other, gone) is None
    retried = Ledger(ledger.url)  # the call again, its commit's answer lost: it finds its own claim
    assert retried.claim_study(study.id, other, gone) is None
    assert ledger.claim_study(study.id, other, gone) == (other, None)  # a second run in one process
    busy = rf"study {study.id} is being run by another process \({re.escape(other)}"
    with pytest.raises(StudyBusyError, match=busy), StudyClaim(ledger, study.id):
        pass
    assert ledger.beat_study(study.id, other)
    ledger.release_study(study.id, other)
    with StudyClaim(ledger, study.id):
        row = ledger.study(study.id)
        assert row.owner == this_process() and row.owner_beat is not None
        assert not ledger.beat_study(study.id, other)  # no longer its owner
        held = ledger.claim_study(study.id, other, gone)
        assert held is not None and held[0] == this_process()
    assert ledger.study(study.id).owner is None  # let go after the run


def test_a_claim_past_its_lease_is_taken_over(tmp_path: Path):
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    study = ledger.create_study("s", {})
    assert ledger.claim_study(study.id, "elsewhere/1/2", lambda owner, beat: False) is None
    assert ledger.claim_study(study.id, "here/3/4", lambda owner, beat: True) is None  # its owner is gone
    assert ledger.study(study.id).owner == "here/3/4"


def _rows(ledger: Ledger, study_id: str) -> list[tuple]:
    study = ledger.study(study_id)
    trials = ledger.trials(study_id)
    return [(study.state, study.error, study.plan)] + [
        (t.status, t.reason, t.final_val_loss, t.runs, t.mlflow_run_id, t.updated_at) for t in trials
    ]


def test_a_process_that_lost_its_claim_writes_nothing_of_the_study(tmp_path: Path):
    """Fencing: this process claimed the study; another (a second Ledger on the database) took it over
    (`gone` said this one was). Every write of the study or its trials from here is refused with
    `ClaimLostError`, in its own transaction, and the database keeps what the new owner sees; the
    new owner writes, and a process that never claimed the study is not fenced."""
    import trainers
    from service.core.spec import StudySpec
    from service.study.search import grid_trials

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    here, there, bystander = Ledger(url), Ledger(url), Ledger(url)
    spec = StudySpec.model_validate(
        {"space": {"dims": {"lr": [1e-3, 3e-3, 1e-2]}}, "base": {"task": "addition"}}
    )
    trials = grid_trials(spec.search_space(), {})
    study = here.create_study("s", {}, trials[:2])
    assert here.claim_study(study.id, "here/1/2", lambda owner, beat: False) is None
    first = here.start_trial(study.id, trials[0].config_hash)  # held: written
    assert first is not None and here.trial(first).status == "running"

    assert there.claim_study(study.id, "there/3/4", lambda owner, beat: True) is None  # taken over
    before = _rows(there, study.id)
    result = trainers.TrialResult(status="done", final_val_loss=0.1, steps=3)
    refused = [
        lambda: here.start_trial(study.id, trials[1].config_hash),
        lambda: here.finish_trial(first, result),
        lambda: here.update_trial(first, mlflow_run_id="r"),
        lambda: here.stop_trial(first, "pending", "interrupted", []),
        lambda: here.update_study(study.id, state="failed", error="x"),
        lambda: here.add_trials(study.id, trials[2:]),
    ]
    for write in refused:
        with pytest.raises(
            ClaimLostError, match=rf"study {study.id} was taken over by another process \(there/3/4\)"
        ):
            write()
    assert _rows(there, study.id) == before
    assert len(there.trials(study.id)) == 2

    assert there.finish_trial(first, result).status == "done"  # the new owner writes
    bystander.update_study(study.id, name="renamed")  # never claimed it here: not fenced
    here.release_study(study.id, "here/1/2")  # lets go of nothing in the database: not its owner
    assert there.study(study.id).owner == "there/3/4"


def test_a_beat_that_finds_the_claim_taken_over_stops_the_run(tmp_path: Path, monkeypatch):
    import threading

    import service.study.claim as claim

    monkeypatch.setattr(claim, "BEAT_SECONDS", 0.05)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    here, there = Ledger(url), Ledger(url)
    study = here.create_study("s", {})
    lost = threading.Event()
    with StudyClaim(here, study.id, owner="here/1/2", on_lost=lost.set):
        time.sleep(0.3)
        assert not lost.is_set()  # its own beats
        assert there.claim_study(study.id, "there/3/4", lambda owner, beat: True) is None
        assert lost.wait(10), "the beat never said the claim was lost"
    assert here.study(study.id).owner == "there/3/4"  # leaving the claim let go of nothing


@pytest.mark.slow
def test_a_run_whose_study_is_taken_over_stops_and_writes_nothing_more(engine, monkeypatch):
    """A real run (embedded Ray, MLflow) loses its claim mid-study, as a process cut off from the
    database past the lease would: its beat stops the run, and its last writes — the trials it was
    training, the study's end — are refused, so the ledger holds exactly what the new owner found; the
    run ends refused, not failed."""
    import service.study.claim as claim
    from service.core.spec import StudySpec
    from service.runner import StudyRunner
    from tests.service.conftest import TINY

    monkeypatch.setattr(claim, "BEAT_SECONDS", 0.2)
    spec = StudySpec.model_validate({
        "name": "taken-over", "base": {**TINY, "steps": 4000, "eval_every": 1000},
        "space": {"dims": {"lr": [1e-3, 3e-4, 1e-4, 3e-5]}}, "bundle_size": 1,
    })  # fmt: skip
    study = engine.create_study(spec)
    runner = StudyRunner(engine, workers=1)
    other = Ledger(engine.ledger.url)  # the process that takes the study over
    try:
        runner.submit(study.id)
        deadline = time.monotonic() + 240
        while not any(t.status == "running" for t in other.trials(study.id)):
            assert time.monotonic() < deadline and runner.is_active(study.id), "no trial ever started"
            time.sleep(0.1)
        assert other.claim_study(study.id, "elsewhere/9/9", lambda owner, beat: True) is None
        taken = _rows(other, study.id)
        while runner.is_active(study.id):
            assert time.monotonic() < deadline, "the run went on after its claim was taken"
            time.sleep(0.2)
    finally:
        runner.shutdown()
    assert "was taken over by another process (elsewhere/9/9)" in runner.refused[study.id]
    assert _rows(other, study.id) == taken  # nothing written after the takeover
    assert taken[0][0] == "running" and any(row[0] == "running" for row in taken[1:])
    assert other.study(study.id).owner == "elsewhere/9/9"


def test_the_fences_check_and_its_write_are_one_transaction(tmp_path: Path, monkeypatch):
    """A takeover that falls between the fence's check and the write it guards (a pause there) waits
    for that write's commit: the write lands while this process still holds the study, and the takeover
    after it. (SQLite ignores SELECT … FOR UPDATE and the driver begins a transaction only at the first
    write: a check that only read let the takeover in first, and the write landed over the new owner.)"""
    import threading

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    here, there = Ledger(url), Ledger(url)
    study = here.create_study("s", {})
    assert here.claim_study(study.id, "here/1/2", lambda owner, beat: False) is None
    fence, order = Ledger._fence, []

    def takeover() -> None:
        assert there.claim_study(study.id, "there/3/4", lambda owner, beat: True) is None
        order.append("taken over")

    def fence_then_pause(self: Ledger, s, study_id: str) -> None:
        fence(self, s, study_id)
        if self is here:
            taker = threading.Thread(target=takeover)
            taker.start()
            taker.join(timeout=1.0)  # the pause: the takeover waits on this transaction's lock
            order.append("written")

    monkeypatch.setattr(Ledger, "_fence", fence_then_pause)
    here.update_study(study.id, error="written while held")
    deadline = time.monotonic() + 30
    while "taken over" not in order and time.monotonic() < deadline:
        time.sleep(0.05)
    assert order == ["written", "taken over"]
    row = there.study(study.id)
    assert (row.owner, row.error) == ("there/3/4", "written while held")
    with pytest.raises(ClaimLostError):
        here.update_study(study.id, error="written after")
    assert here.claim_lost(study.id)


def test_a_syncs_owner_is_gone_when_its_process_is():
    assert syncing(f"{this_process()}/{SYNC}") and not syncing(this_process())
    assert not gone(f"{this_process()}/{SYNC}", beat=None)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = processes.started(child.pid)
    child.wait()
    assert gone(f"{socket.gethostname()}/{child.pid}/{started}/{SYNC}", beat=time.time())


def test_a_run_waits_for_a_sync_of_its_study_and_a_sync_refuses_a_run(tmp_path: Path, monkeypatch):
    """A sync of a study's MLflow runs holds its claim: a run that comes meanwhile starts once the sync
    lets go (a run beside a sync lost the child runs it was writing to the sync's clean-up); a sync that
    finds a run, or another sync, refuses, naming who holds the study."""
    import threading

    import service.study.claim as claim

    monkeypatch.setattr(claim, "SYNC_POLL_SECONDS", 0.05)
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    study = ledger.create_study("s", {})
    claimed = threading.Event()

    def run() -> None:
        with StudyClaim(ledger, study.id):
            claimed.set()
            assert ledger.study(study.id).owner == this_process()

    with StudyClaim.for_sync(ledger, study.id):
        assert ledger.study(study.id).owner == f"{this_process()}/{SYNC}"
        with (
            pytest.raises(StudyBusyError, match="being rebuilt by a sync"),
            StudyClaim.for_sync(ledger, study.id),
        ):
            pass
        runner = threading.Thread(target=run)
        runner.start()
        assert not claimed.wait(0.5), "the run started while the sync held its study"
        stopped = threading.Event()
        stopped.set()
        waiting = StudyClaim(Ledger(ledger.url), study.id, owner="here/5/6", until=stopped)
        with (
            pytest.raises(StudyBusyError, match=r"being rebuilt by a sync .*Run it again once the sync ends"),
            waiting,
        ):
            pass
    assert claimed.wait(10), "the run never started after the sync let its study go"
    runner.join(10)
    assert ledger.study(study.id).owner is None
    other = f"elsewhere/1/{time.time()}"
    assert Ledger(ledger.url).claim_study(study.id, other, gone) is None
    busy = rf"study {study.id} is being run by another process \({re.escape(other)}.*nothing was synced here"
    with pytest.raises(StudyBusyError, match=busy), StudyClaim.for_sync(ledger, study.id):
        pass
    assert ledger.study(study.id).owner == other


def test_a_run_cancelled_while_it_waits_for_a_sync_ends_cancelled_having_started_nothing(tmp_path: Path):
    from service.core.settings import Settings
    from service.runner import StudyRunner
    from service.study.engine import Engine

    engine = Engine(Settings(home=tmp_path, mlflow_tracking_uri="http://127.0.0.1:9"))
    study = engine.ledger.create_study("s", {})
    runner = StudyRunner(engine, workers=1)
    try:
        with StudyClaim.for_sync(engine.ledger, study.id):
            assert runner.submit(study.id)
            time.sleep(0.5)
            assert runner.is_active(study.id) and runner.cancel(study.id)
            deadline = time.monotonic() + 10
            while runner.is_active(study.id):
                assert time.monotonic() < deadline, "the cancelled run still waits"
                time.sleep(0.05)
    finally:
        runner.shutdown()
    row = engine.ledger.study(study.id)
    assert row.state == "cancelled" and row.owner is None
    assert not runner.refused and not runner.prepared.is_set()  # nothing started: no Ray, no MLflow


def test_a_stuck_sync_lapses_and_a_cancel_before_the_claim_touches_no_one_elses_study(tmp_path: Path):
    """A sync that stopped beating for the lease (its release failed) is gone even on this host, so
    a run waiting for it does not wait for ever. A run cancelled while it waited marks the study
    cancelled only while no run holds it: another process that claimed it meanwhile keeps it running."""
    now = time.time()
    assert gone(f"{this_process()}/{SYNC}", beat=now - LEASE_SECONDS - 1, now=now)
    assert not gone(f"{this_process()}/{SYNC}", beat=now, now=now)
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    study = ledger.create_study("s", {})
    ledger.update_study(study.id, state="pending")
    assert Ledger(ledger.url).claim_study(study.id, f"elsewhere/1/{now}", lambda owner, beat: False) is None
    Ledger(ledger.url).update_study(study.id, state="running")
    assert not ledger.cancel_unclaimed_study(study.id)
    assert ledger.study(study.id).state == "running"
    ledger.release_study(study.id, f"elsewhere/1/{now}")
    Ledger(ledger.url).release_study(study.id, f"elsewhere/1/{now}")
    ledger.update_study(study.id, state="pending")
    with StudyClaim.for_sync(ledger, study.id):
        assert ledger.cancel_unclaimed_study(study.id)  # held by a sync only: nobody runs it
    assert ledger.study(study.id).state == "cancelled"


def test_memsweep_run_of_a_study_another_process_runs_is_refused_before_anything_else(
    tmp_path: Path, monkeypatch, request, capsys
):
    """It printed the plan of the other process's run and a progress bar of it, then its refusal
    twice: the refusal comes first now, and alone."""
    from service.cli.commands import main
    from service.core.settings import Settings, get_settings
    from service.core.spec import StudySpec
    from service.study.engine import Engine

    monkeypatch.setenv("MEMSWEEP_HOME", str(tmp_path))
    monkeypatch.delenv("MEMSWEEP_API_URL", raising=False)
    get_settings.cache_clear()
    request.addfinalizer(get_settings.cache_clear)
    engine = Engine(Settings(home=tmp_path))
    spec = StudySpec.model_validate(
        {"space": {"dims": {"lr": [1e-3]}}, "base": {"task": "addition", "seq_len": 10}}
    )
    study = engine.create_study(spec)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    request.addfinalizer(other.kill)
    owner = f"{socket.gethostname()}/{other.pid}/{processes.started(other.pid)}"
    assert engine.ledger.claim_study(study.id, owner, gone) is None
    engine.ledger.update_study(study.id, state="running")
    with pytest.raises(SystemExit) as refused:
        main(["run", "--study", study.id])
    assert str(refused.value.code).startswith(
        f"error: study {study.id} is being run by another process ({owner}"
    )
    assert capsys.readouterr().err == ""  # no plan, no progress, no second refusal
    assert engine.ledger.study(study.id).owner == owner  # its claim untouched


def test_a_key_taken_over_is_not_released_by_its_first_owner_and_is_bound_once(tmp_path: Path):
    """The first creator of a key, slow rather than dead, failed after a retry had taken its key over:
    its release deleted the retry's claim, and a third request made a third study."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    assert ledger.claim_key("k", "digest", "first/1/1")[0]
    assert ledger.take_over_key("k", "first/1/1", "retry/2/2")
    assert not ledger.take_over_key("k", "first/1/1", "third/3/3")  # one takeover wins
    ledger.release_key("k", "first/1/1")  # the first owner's failure lets go of nothing now
    claimed, row = ledger.claim_key("k", "digest", "third/3/3")
    assert not claimed and row.owner == "retry/2/2"
    made = ledger.create_study("s", {}, [], key="k")
    assert ledger.create_study("s", {}, [], key="k").id == made.id  # bound once: the same study
    assert len(ledger.list_studies()) == 1


# A study queued behind another kept what a dead process left `running` until its turn came (its claim set
# them `pending`): they read `pending`, with the reason, as soon as the runner queues it (at a server's
# start too, which queues every unfinished study), while a live process's rows (a `memsweep run` in another
# shell on the same ledger) stay as they are. In-process stand-ins for Ray and MLflow (test_lifecycle's).


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
