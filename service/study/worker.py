"""What a worker does with a unit: trains its members — as one fused bundle when the unit says so, or
side by side in lockstep, else one after the other — and only reports, through a callable its
executor gives it (Ray Tune's `tune.report` on a Ray worker: `service.study.ray_tune.run_unit`). The
driver records the reports (`service.study.book`)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trainers
from service.core.trial import Evaluated, Event, Finished, TrialSpec, Unit, objective
from trainers import plugins
from trainers.numerics import NumericsError, ProcessNumericsError, provenance
from trainers.numerics import use as use_numerics
from trainers.runtime import resolve_device
from trainers.schedule import Ending


@dataclass(frozen=True)
class Placement:
    """Where a unit's worker trains its members, as a member's result records it: the node, the device
    and where its numbers come from (`trainers.numerics.provenance`). A unit's first report carries it,
    once (`Reports`): the driver records it on the members a scheduler stops, whose results never come
    (`service.study.book.TrialBook.placed`)."""

    node: str
    device: str
    provenance: Mapping[str, str]

    @classmethod
    def of(cls, member: TrialSpec, node: str) -> Placement | None:
        """Where `member` trains in this process, once it took its numerics mode (which the provenance
        names), as `trainers.runtime.record_device` records it but its plugins (each member's own: the
        driver adds them). A unit's members share their device (the study's). None when the device
        cannot say: its members fail with the reason."""
        try:
            device = resolve_device(member.resolved.config.device)
            return cls(node, str(device), provenance(device))
        except Exception:
            return None


def _course(resolved: trainers.Resolved) -> Ending | None:
    """The member's ending rules, with its task's baseline (None: a file-backed task without its
    files; the trial itself reports why)."""
    try:
        return Ending.of(resolved)
    except Exception:
        return None


class Reports:
    """What a unit reports to its executor, and when.

    Every report carries `objective` (the searcher and the scheduler read it: the mean over the unit's
    members of each one's latest objective — an evaluation's loss over the baseline, or a finished
    member's final one — members finished before the unit counted as they stood after as many
    evaluations: `Known.at`), `evaluations` (the most evaluations any member trained here has had:
    the scheduler's time), `complete` (every member has its result, none of them pruned; a unit's last
    report without it was cut short, by a scheduler or a cancel), `pruned_at` (when a member finished
    before was pruned: its evaluations then) and its `events`; the first report after the worker took
    its numerics mode carries its `placement` too, once (a bundle's hundreds of members share it).

    A round in which some member's evaluation ends it (its budget's end, its early stop or its
    failure: `trainers.schedule.Ending`), or that comes just before members' results (one failed its
    training-loss check at that step), is held and goes out with those results, so that an
    early-stopping scheduler deciding on the round cannot stop the unit between a member's last
    evaluation and its result: no member is recorded pruned after it has ended."""

    def __init__(self, report: Callable[[dict[str, Any]], None], unit: Unit, node: str) -> None:
        self.report, self.node = report, node
        self.todo = [m for m in unit.members if m.config_hash not in unit.known]
        self.known = list(unit.known.values())
        self.courses: list[Ending | None] = []
        self.latest: dict[int, float] = {}  # member (index into todo) → its latest objective
        self.counts: dict[int, int] = {}  # member → its evaluations reported
        self.left = len(self.todo)  # members without a result
        self.held: list[Event] = []
        self.placement: Placement | None = None  # where the members train, until a report carried it

    def learn_courses(self) -> None:
        """Each member's ending rules (builds its task: under the study's numerics mode)."""
        self.courses = [_course(m.resolved) for m in self.todo]

    def evaluated(self, evaluations: Sequence[tuple[int, trainers.Evaluation]], hold: bool = False) -> None:
        """A round of evaluations, (member, its evaluation) each; `hold`: results follow at once."""
        for k, e in evaluations:
            course = self.courses[k] if k < len(self.courses) else None
            self.latest[k] = objective(e.val_loss, course.baseline if course else None, "done")
            self.counts[k] = self.counts.get(k, 0) + 1
            hold = hold or (course is not None and course.at(e))
        events: list[Event] = [Evaluated(self.todo[k].config_hash, e) for k, e in evaluations]
        if hold:
            self.held += events
        else:
            self._send(events)

    def finished(self, final: Sequence[tuple[int, trainers.TrialResult]]) -> None:
        """Members' results, after their evaluations (and any round held for them)."""
        events, self.held = self.held, []
        for k, result in final:
            result.node = self.node
            self.latest[k] = objective(result.final_val_loss, result.baseline_loss, result.status)
            events.append(Finished(self.todo[k].config_hash, result))
        self.left -= len(final)
        self._send(events)

    def _send(self, events: list[Event]) -> None:
        # the most any member trained here has had (a bundle split after running out of memory trains
        # its halves one after the other: their seeds are then judged on their latest evaluations); a
        # unit with nothing to train reports none, so a scheduler records nothing of it again
        evaluations = max(self.counts.values(), default=0)
        values = [v for k in self.known if (v := k.at(evaluations)) is not None] + list(self.latest.values())
        pruned = [k.pruned_at for k in self.known if k.pruned_at is not None]
        placement, self.placement = self.placement, None
        self.report({
            "objective": statistics.fmean(values) if values else 0.0,
            "evaluations": evaluations,
            "complete": self.left == 0 and not pruned,
            **({"pruned_at": max(pruned)} if pruned else {}),
            **({"placement": placement} if placement else {}),
            "events": events,
        })  # fmt: skip


class OtherCodeError(RuntimeError):
    """A worker whose code is not the code its trials were planned with: it trains none of them."""


def check_code(members: Sequence[TrialSpec], node: str) -> None:
    """Refuse to train a trial whose identity here is not the one it was planned under: a plugin's code
    edited after the server loaded it (a worker process imports the code now on disk), or another
    version on this node. Its result would have been stored under the hash of code that did not
    compute it, and reused for that code later. The unit fails as an infrastructure fault: its trials
    go back to pending, and end as `error` with this reason after their attempts."""
    for m in members:
        here = m.resolved.config_hash()
        if here != m.config_hash:
            cfg = m.resolved.config
            used = plugins.identities(cfg.cell, cfg.task)
            raise OtherCodeError(
                f"other code on node {node} than the study was planned with: restart `memsweep serve` after "
                "editing a plugin, and run the same memsweep and plugin versions on every node (trial "
                f"{m.config_hash} hashes to {here} here, under TRAINER_VERSION {trainers.TRAINER_VERSION}"
                f"{', plugins ' + ', '.join(used.values()) if used else ', no plugin'})"
            )


def train_unit(unit: Unit, report: Callable[[dict[str, Any]], None], node: str) -> None:
    """Train the unit's members — as one fused bundle when the unit says so, or side by side in
    lockstep (`trainers.train_lockstep`: each to its next evaluation in turn; a point's seeds judged
    together at a scheduler's rungs), else one after the other — reporting its rounds of evaluations
    and its results to `report` (Ray Tune's, on a worker) as `Reports` says. A bundle reports its members' evaluations in rounds (one report per round), so
    a bundle of K costs Ray no more reports than one trial. `node` is written into each result (where
    it ran)."""
    reports = Reports(report, unit, node)
    todo = reports.todo
    if not todo:  # every member was already finished: the searcher still needs the objective
        reports.finished([])
        return
    # this worker process computes with the study's numerics mode from before its first computation
    # (the ending rules build tasks; the code check below loads the plugins, whose import may compute).
    # A process that cannot because of what it computed before (another mode first) fails the unit as
    # a fault, as a lost worker does: its members run again in a new process (failed each with the
    # reason, they were counted as failed runs of their points and never run again, for this process's
    # state). A machine that cannot (no AVX2, not x86-64) fails each member with the reason, once.
    try:
        use_numerics(todo[0].resolved.config.numerics)
    except ProcessNumericsError:
        raise
    except NumericsError:
        pass  # the machine's: each member meets it again in `trainers.train` and fails with it
    else:
        reports.placement = Placement.of(todo[0], node)
    check_code(todo, node)
    reports.learn_courses()

    if len(todo) == 1 or not (unit.fused or unit.lockstep):  # one after another: each result as it ends
        for k, member in enumerate(todo):

            def evaluated(e: trainers.Evaluation, k: int = k) -> None:
                reports.evaluated([(k, e)])

            reports.finished([(k, trainers.train(member.resolved, evaluated))])
        return
    if unit.fused:
        from trainers.fused import train_fused as train_members
    else:  # solo trials side by side, each to its next evaluation in turn: judged by round as a bundle
        train_members = trainers.train_lockstep

    buffer: list[tuple[int, trainers.Evaluation]] = []  # this round's evaluations so far
    sent: set[int] = set()  # members whose result went out

    def flush() -> None:
        reports.evaluated(list(buffer))
        buffer.clear()

    def report_member(k: int, e: trainers.Evaluation) -> None:
        # members evaluate at the same steps: a round is complete when every member without a
        # result reported, or when a new step begins (a bundle split after running out of memory)
        if buffer and e.step != buffer[0][1].step:
            flush()
        buffer.append((k, e))
        if len(buffer) >= len(todo) - len(sent):
            flush()

    def members_finished(final: list[tuple[int, trainers.TrialResult]]) -> None:
        # as soon as members' results are final (they stopped early or failed, or the unit ended),
        # after their evaluations, in one report: a worker lost later in a long unit loses none
        if buffer:  # its round (a member left at this step): held, to go out with the results
            reports.evaluated(list(buffer), hold=True)
            buffer.clear()
        sent.update(k for k, _ in final)
        reports.finished(final)

    results = train_members([m.resolved for m in todo], report_member, members_finished)
    unsent = [(k, r) for k, r in enumerate(results) if k not in sent]
    if unsent or buffer or reports.held:  # every member is settled by then: a safeguard
        members_finished(unsent)
