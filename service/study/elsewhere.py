"""Trials another running study trains now: a study waits for their results instead of training them
a second time (two studies that hold one trial, run at once: a researcher's own cells beside a
paper's model, posted while the paper's study runs).

The first study to start a shared trial trains it. A study looks elsewhere (`look_elsewhere`) when a
round begins and again as each unit leaves its queue (`service.study.ray_tune.UnitQueue`): a trial
another study has finished `done` since takes that result (`Ledger.take_results`, as a trial made
after it would have at its creation); a trial another study trains at that moment, whose process is
alive (`service.study.claim.gone`), is left out of the unit and waited for (`trained_elsewhere`,
`wait_for_others`); what that study ends otherwise than `done` (failed, pruned, cancelled, or its
process died) this one trains itself. A trial another study only holds still to train is this
study's to train when it comes to it: the other takes the result, or waits for it, when it comes to
that trial in turn. A study never waits on a trial its own earlier run left running (a crash): that
one is its own to take up again.

A study waits only for trials being trained, and a study training a trial waits on no one for it, so
no two studies wait on each other. Two studies that start one trial within the same moment (between
one's look and its worker's start) both train it: the same numbers, twice the compute."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from service.core.states import FINISHED
from service.store.ledger import Holder, Ledger
from service.store.models import Study, utc
from service.study.claim import gone

log = logging.getLogger(__name__)

#: seconds between two looks at the trials a study waits for
POLL_SECONDS = 2.0


def trained_elsewhere(mine: Mapping[str, str], holders: Sequence[Holder]) -> dict[str, str]:
    """Config hash → the study training it now, among this study's trials still to train (`mine`: hash
    → status) that `holders` (`Ledger.holders`) hold running in a process that is alive."""
    waits: dict[str, str] = {}
    for h in sorted(holders, key=lambda h: (utc(h.created_at), h.study_id)):
        status = mine.get(h.config_hash)
        if h.config_hash in waits or h.status != "running" or status in (None, "running", *FINISHED):
            continue
        if h.owner is None or gone(h.owner, h.owner_beat):
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
    left = set(waits)
    log.info(
        "study %s: %d of its trials are being trained by %s; it takes their results when they finish",
        study.id, len(left), ", ".join(sorted(set(waits.values()))),
    )  # fmt: skip
    while left and not cancel.is_set():
        done, still = look_elsewhere(ledger, study.id, sorted(left))
        if done:
            taken(len(done))
        left = set(still)
        if left:
            cancel.wait(POLL_SECONDS)
