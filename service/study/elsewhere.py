"""Trials another running study holds: a study takes their results instead of training them a second
time (two studies that hold one trial, run at once: a researcher's own cells beside a paper's model,
posted while the paper's study runs).

The first study to reserve a shared trial trains it. A study looks elsewhere when a round begins
(`look_elsewhere`) and again as each unit leaves its queue (`Engine._dispatch`,
`service.study.ray_tune.UnitQueue`): a trial another study has finished `done` since takes that
result (`Ledger.take_results`, as a trial made after it would have at its creation); a trial another
study holds `running` in a process that is alive (`alive`) is left to it and waited for after the
round (`trained_elsewhere`, `wait_for_others`); the unit's other members are marked `running` at
once, in the transaction that looked (`Ledger.reserve_trials`), so that from then on the other study
sees them held here, also while the unit waits for a free slot. What the other study ends otherwise
than `done` (failed, pruned, cancelled, or its process died) this one trains itself. A trial another
study only holds still to train (pending) is this study's to train when it comes to it. A study's
own rows a process that died left `running` are sent back to pending when its next run begins
(`Ledger.pend_running`), and the members of units that never started when its round ends.

A study waits only for trials another holds running, and a study holding a trial running waits on no
one for it, so no two studies wait on each other; two studies reserve one trial one after the other,
never both (the reservation's transaction locks the trial's rows)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from service.core.states import FINISHED
from service.store.ledger import Holder, Ledger
from service.store.models import Study, utc
from service.study.claim import gone

log = logging.getLogger(__name__)

#: seconds between two looks at the trials a study waits for
POLL_SECONDS = 2.0


def alive(owner: str, beat: float | None) -> bool:
    """Whether the process `owner` (its last beat at `beat`) still runs the study it claimed."""
    return not gone(owner, beat)


@dataclass
class Held:
    """What a round's units did as they left the queue (`Engine._dispatch`), by config hash: the
    members they reserved, those that took another study's result, and those left to the study that
    holds them running."""

    reserved: set[str] = field(default_factory=set)
    taken: set[str] = field(default_factory=set)
    deferred: set[str] = field(default_factory=set)

    def clear(self) -> None:
        self.reserved.clear()
        self.taken.clear()
        self.deferred.clear()


def trained_elsewhere(mine: Mapping[str, str], holders: Sequence[Holder]) -> dict[str, str]:
    """Config hash → the study training it now, among this study's trials still to train (`mine`: hash
    → status) that `holders` (`Ledger.holders`) hold running in a process that is alive."""
    waits: dict[str, str] = {}
    for h in sorted(holders, key=lambda h: (utc(h.created_at), h.study_id)):
        status = mine.get(h.config_hash)
        if h.config_hash in waits or h.status != "running" or status in (None, "running", *FINISHED):
            continue
        if h.owner is None or not alive(h.owner, h.owner_beat):
            continue
        waits[h.config_hash] = h.study_id
    return waits


def look_elsewhere(ledger: Ledger, study_id: str, hashes: Sequence[str]) -> tuple[set[str], dict[str, str]]:
    """Among the study's trials of `hashes`: (those that took a result another study has finished `done`
    since, those another study trains now: config hash → that study). The waits are read before the
    results are taken, so a trial that finishes elsewhere in between is taken, not trained again."""
    if not hashes:
        return set(), {}
    waits = trained_elsewhere(ledger.statuses(study_id, hashes), ledger.holders(study_id, hashes))
    taken = set(ledger.take_results(study_id, hashes))
    return taken, {h: other for h, other in waits.items() if h not in taken}


def wait_for_others(
    ledger: Ledger,
    study: Study,
    waits: Mapping[str, str],
    cancel: threading.Event,
    taken: Callable[[int], None],
) -> None:
    """Until every trial in `waits` has the other study's result (`taken`: how many more did, each
    time some do) or is no longer trained elsewhere (this study trains it in its next round), or
    the study is cancelled."""
    left, said = set(waits), False
    while left and not cancel.is_set():
        done, still = look_elsewhere(ledger, study.id, sorted(left))
        if done:
            taken(len(done))
        left = set(still)
        if left and not said:  # as they are now (`waits` was looked at before this study's round)
            log.info(
                "study %s: %d of its trials are being trained by %s; it takes their results when they finish",
                study.id, len(left), ", ".join(sorted(set(still.values()))),
            )  # fmt: skip
            said = True
        if left:
            cancel.wait(POLL_SECONDS)
