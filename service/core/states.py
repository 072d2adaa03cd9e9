"""The states of a study and of a trial: one list each, from the ledger to the REST answers.

A study is `pending` until a runner takes it, `running`, then `done`, `failed` (it could not run:
its error says why) or `cancelled`. A trial is `pending`, `running`, then `done` (trained to the
end, or stopped early below its loss), `failed` (diverged, or a bad config: a result, counted as not
succeeding), `pruned` (by a scheduler), `cancelled` (with its study) or `error` (its worker, node or
process died and the retries did too: an infrastructure fault, not a result, never counted; a later
run of the study tries it again).
"""

from __future__ import annotations

from enum import StrEnum


class StudyState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class TrialStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    PRUNED = "pruned"
    CANCELLED = "cancelled"
    ERROR = "error"


#: the trials with a result (trained to the end, failed in training, or pruned by a scheduler)
FINISHED: tuple[str, ...] = (TrialStatus.DONE, TrialStatus.FAILED, TrialStatus.PRUNED)
#: the trials a run takes up: never started, interrupted by a crash (running) or a fault (pending
#: again), stopped with their study (cancelled), or left as error by an earlier run's faults
UNFINISHED: tuple[str, ...] = (
    TrialStatus.PENDING,
    TrialStatus.RUNNING,
    TrialStatus.CANCELLED,
    TrialStatus.ERROR,
)
#: the states a study ends in (a server's study may still hold running units: its answer's `active`)
FINAL: tuple[str, ...] = (StudyState.DONE, StudyState.FAILED, StudyState.CANCELLED)
#: the studies a starting server takes up again (a crash leaves them so)
RESUMABLE: tuple[str, ...] = (StudyState.PENDING, StudyState.RUNNING)
#: what a study listing shows, and filters on, for a study a server has accepted and not started yet
#: (its runner's queue, not a state of the ledger: such a study is `pending`, or `running` when a
#: restart queued it again)
QUEUED = "queued"
#: what a study listing filters on: each study state, and `queued`
LISTED_STATES: tuple[str, ...] = (*(s.value for s in StudyState), QUEUED)
