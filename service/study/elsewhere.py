"""Trials another running study trains now: a study waits for their results instead of training them
a second time (two studies that hold one trial, run at once: a researcher's own cells beside a
paper's model, posted while the paper's study runs).

A study waits for a trial (`trained_elsewhere`) held by another study that runs now, whose process is
alive (`service.study.claim.gone`), and that holds it still to train, when that study is the older of
the two (it created its trials first) or is training it now while this study's own is not running. It
then takes that study's result once it is `done` (`Ledger.take_results`, as a trial made after it
would have at its creation); a trial the other study ends otherwise (failed, pruned, cancelled, or its
process died) it trains itself. A study never waits on a trial its own earlier run left running (a
crash): that one is its own to take up again.

The waits go one way, so no two studies wait on each other: a study waits on an older one, or on one
training the trial now, and a study training it now waits on no one for it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from service.store.ledger import Holder, Ledger
from service.store.models import Study, utc
from service.study.claim import gone

log = logging.getLogger(__name__)

#: seconds between two looks at the trials a study waits for
POLL_SECONDS = 2.0


def trained_elsewhere(study: Study, mine: Mapping[str, str], holders: Sequence[Holder]) -> dict[str, str]:
    """Config hash → the study this one waits for, among its trials still to train (`mine`: hash →
    status) that `holders` (`Ledger.holders`) hold."""
    order = (utc(study.created_at), study.id)
    waits: dict[str, str] = {}
    for h in sorted(holders, key=lambda h: (utc(h.created_at), h.study_id)):
        if h.config_hash in waits or mine.get(h.config_hash, "running") == "running":
            continue
        if h.owner is None or gone(h.owner, h.owner_beat):
            continue
        if (utc(h.created_at), h.study_id) < order or h.status == "running":
            waits[h.config_hash] = h.study_id
    return waits


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
        mine = ledger.statuses(study.id, sorted(left))
        still = set(trained_elsewhere(study, mine, ledger.holders(study.id, sorted(left))))
        done = set(ledger.take_results(study.id, sorted(left)))  # after: a result that came between
        if done:
            taken(len(done))
        left = still - done
        if left:
            cancel.wait(POLL_SECONDS)
