"""Which process runs a study: one at a time.

A server resumes every study its ledger holds as pending or running (a crash leaves them so), and
`memsweep run` runs one in its own process, on the same ledger as a server may be: without a claim, a
server started beside a running `memsweep run` would have run the same study again, each process
training the same trials and overwriting the other's results. So a process *claims* a study before
it plans or runs it (`StudyClaim`), says every `BEAT_SECONDS` that it still runs it, and lets it go
when the run ends. A claim is taken from its owner only when that owner is gone:

- on this host, when the owner's process no longer exists (its pid gone, or taken by a process that
  started at another time: `/proc/PID/stat`), at once: a killed `memsweep run` or a restarted server
  (a container restarted keeps its host name) resumes without waiting;
- elsewhere (another host or container), when it has not beaten for `LEASE_SECONDS`.

Refused, a run starts nothing and says which process holds the study and since when it last beat.

A sync of the study's MLflow runs (`Engine.sync_tracking`) claims it too, as `OWNER/sync`: it
rebuilds the child runs and deletes those no finished trial owns, so a run starting beside it would
lose the runs it was writing, and a sync beside a run would mark the run's parent ended. A run that
finds a sync holding the study waits for it (a sync takes seconds); a sync that finds a run refuses.

A process that lost its claim while it still ran (paused, or cut off from the database past the lease)
is fenced: the ledger refuses its writes of the study (`Ledger`, `ClaimLostError`), and its beat, once
it finds the claim gone, tells the run to stop (`on_lost`).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType

from service.core import processes
from service.store.ledger import Ledger

log = logging.getLogger(__name__)

#: seconds without a beat after which a claim held from another host is taken over
LEASE_SECONDS = 60.0
#: seconds between two beats of a running study's owner
BEAT_SECONDS = 15.0


#: the suffix of a sync's owner (`this_process()/sync`)
SYNC = "sync"
#: seconds between two tries of a run waiting for a sync to let its study go
SYNC_POLL_SECONDS = 0.5


@functools.cache
def this_process() -> str:
    """This process as a study's owner: host/pid/start time."""
    return f"{socket.gethostname()}/{os.getpid()}/{processes.started(os.getpid()) or ''}"


def syncing(owner: str) -> bool:
    """Whether the owner is a sync of the study's MLflow runs, not a run."""
    return owner.endswith(f"/{SYNC}")


def gone(owner: str, beat: float | None, now: float | None = None, lease: float = LEASE_SECONDS) -> bool:
    """Whether the process `owner` no longer runs the study it claimed (its last beat at `beat`, on
    another host gone `lease` seconds after it). A sync that has not beaten for the lease is stuck (its
    release failed, say), wherever its process is."""
    now = now if now is not None else time.time()
    if syncing(owner) and beat is not None and now - beat > lease:
        return True
    host, pid, since, *_ = [*owner.split("/"), "", ""]
    if host == socket.gethostname() and pid.isdigit() and since and os.path.isdir("/proc"):
        return not processes.alive(int(pid), since)  # exited (a zombie too), or its pid given to another
    return beat is None or now - beat > lease


class StudyBusyError(RuntimeError):
    """The study is claimed by another process that still runs it."""


class StudyClaim:
    """This process's claim on a study, for one run: `with StudyClaim(ledger, id):` claims it (or raises
    `StudyBusyError`), beats while the run lasts, and lets it go after."""

    def __init__(
        self,
        ledger: Ledger,
        study_id: str,
        owner: str | None = None,
        on_lost: Callable[[], None] | None = None,
        until: threading.Event | None = None,
    ) -> None:
        """`on_lost`: called (from the beat's thread) when another process took the study over. A run
        finding a sync holding the study waits for it to end, or for `until` to be set (then refused)."""
        self.ledger, self.study_id, self.owner = ledger, study_id, owner or this_process()
        self.on_lost = on_lost
        self.until = until
        self._stop = threading.Event()
        self._beats: threading.Thread | None = None

    @classmethod
    def for_sync(cls, ledger: Ledger, study_id: str) -> StudyClaim:
        """The claim a sync of the study's MLflow runs holds while it rebuilds them."""
        return cls(ledger, study_id, owner=f"{this_process()}/{SYNC}")

    def __enter__(self) -> StudyClaim:
        held = self.ledger.claim_study(self.study_id, self.owner, gone)
        waits = not syncing(self.owner)
        if held is not None and waits and syncing(held[0]):
            log.info(
                "study %s: waiting for a sync of its MLflow runs (%s) to let it go", self.study_id, held[0]
            )
        stop = self.until or threading.Event()  # no `until`: wait for the sync, however long it takes
        while held is not None and waits and syncing(held[0]):  # a sync takes seconds: its study after it
            if stop.wait(SYNC_POLL_SECONDS):
                break
            held = self.ledger.claim_study(self.study_id, self.owner, gone)
        if held is not None:
            holder, beat = held
            since = f", {time.time() - beat:.0f} s ago" if beat is not None else ""
            what = "synced" if syncing(self.owner) else "started"
            if syncing(holder):
                raise StudyBusyError(
                    f"study {self.study_id}'s MLflow runs are being rebuilt by a sync ({holder}, its last "
                    f"beat{since}); nothing was {what} here. Run it again once the sync ends"
                )
            who = "this process" if holder.startswith(f"{this_process()}") else "another process"
            raise StudyBusyError(
                f"study {self.study_id} is being run by {who} ({holder}, its last beat{since}); "
                f"nothing was {what} here. Wait for it to end, or stop it (its claim lapses when its process "
                f"is gone, or {LEASE_SECONDS:.0f} s after its last beat on another host), then "
                + ("sync the study" if syncing(self.owner) else "resume the study")
            )
        self._beats = threading.Thread(target=self._beat, name=f"claim-{self.study_id}", daemon=True)
        self._beats.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._beats is not None:
            self._beats.join()
        self.ledger.release_study(self.study_id, self.owner)

    def _beat(self) -> None:
        while not self._stop.wait(BEAT_SECONDS):
            try:
                if not self.ledger.beat_study(self.study_id, self.owner):
                    log.error(
                        "study %s: another process took it over (this one's beats had stopped for over %.0f s)",
                        self.study_id,
                        LEASE_SECONDS,
                    )
                    if self.on_lost is not None:
                        self.on_lost()
                    return
            except Exception:  # the ledger is down past its patience: beat again later
                log.exception("study %s: its claim's beat failed; trying again", self.study_id)
