"""One process runs a study at a time (`service.study.claim`): a claim taken from its owner only when
that owner is gone, at once on this host, after the lease from another."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from service.store.ledger import Ledger
from service.study.claim import LEASE_SECONDS, StudyBusyError, StudyClaim, _started, gone, this_process


def test_an_owner_on_this_host_is_gone_when_its_process_is():
    assert not gone(this_process(), beat=None)  # alive, whatever its beat says
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = _started(child.pid)
    child.wait()
    host = socket.gethostname()
    assert started is not None and _started(child.pid) is None
    assert gone(f"{host}/{child.pid}/{started}", beat=time.time())  # its beat is fresh: the process tells
    # its pid now another process's (one that started at another time)
    assert gone(f"{host}/{os.getpid()}/{int(_started(os.getpid()) or 0) + 1}", beat=time.time())


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
    assert ledger.claim_study(study.id, other, gone) is None  # its own claim again (a retried commit)
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
