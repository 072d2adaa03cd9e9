"""What a worker does with a unit: trains its members — as one fused bundle when the unit says so,
else one after the other — and only reports, through a callable its executor gives it (Ray Tune's
`tune.report` on a Ray worker: `service.study.ray_tune.run_unit`). The driver records the reports
(`service.study.book`)."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import trainers
from service.core.trial import Evaluated, Event, Finished, Unit, objective
from trainers.numerics import NumericsError
from trainers.numerics import use as use_numerics


def _baseline(resolved: trainers.Resolved) -> float | None:
    try:
        return resolved.make_task().baseline_loss
    except Exception:  # a file-backed task without its files: the trial itself reports why
        return None


def train_unit(unit: Unit, report: Callable[[dict[str, Any]], None], node: str) -> None:
    """Train the unit's members — as one fused bundle when the unit says so, else one after the
    other — reporting each evaluation and each result to `report` (Ray Tune's, on a worker).

    Every report carries `objective` (the searcher and the scheduler read it): an evaluation's loss
    over the baseline, or the mean objective of the unit's members so far, and its `events`. A bundle
    reports its members' evaluations in batches (one report per round of evaluations), so a bundle
    of K costs Ray no more reports than one trial. `node` is written into each result (where it ran)."""
    objectives = list(unit.known.values())
    todo = [m for m in unit.members if m.config_hash not in unit.known]
    if not todo:  # every member was already finished: the searcher still needs the objective
        report({"objective": statistics.fmean(objectives) if objectives else 0.0, "events": []})
        return
    # this worker process computes with the study's numerics mode from before its first computation
    # (the baselines below build tasks); a process that cannot fails each member with the reason
    with contextlib.suppress(NumericsError):
        use_numerics(todo[0].resolved.config.numerics)
    baselines = [_baseline(m.resolved) for m in todo]

    if unit.fused and len(todo) > 1:
        from trainers.fused import train_fused

        buffer: list[tuple[Evaluated, float]] = []

        def flush(events: Sequence[Event], objective_now: float) -> None:
            report({"objective": objective_now, "events": list(events)})

        def flush_buffer() -> None:
            flush([e for e, _ in buffer], statistics.fmean(o for _, o in buffer))
            buffer.clear()

        def report_member(k: int, e: trainers.Evaluation) -> None:
            # members evaluate at the same steps: a round is complete when every member reported, or
            # when a new step begins (members that stopped early or failed have left the bundle)
            if buffer and e.step != buffer[0][0].evaluation.step:
                flush_buffer()
            buffer.append((Evaluated(todo[k].config_hash, e), objective(e.val_loss, baselines[k], "done")))
            if len(buffer) >= len(todo):
                flush_buffer()

        sent: set[int] = set()  # members whose result went out

        def members_finished(final: list[tuple[int, trainers.TrialResult]]) -> None:
            # as soon as members' results are final (they stopped early or failed, or the bundle ended),
            # after their evaluations, in one report: a worker lost later in a long bundle loses none
            for k, result in final:
                result.node = node
                sent.add(k)
                objectives.append(objective(result.final_val_loss, result.baseline_loss, result.status))
            events: list[Event] = [e for e, _ in buffer]
            events += [Finished(todo[k].config_hash, r) for k, r in final]
            buffer.clear()
            flush(events, statistics.fmean(objectives))

        results = train_fused([m.resolved for m in todo], report_member, members_finished)
        unsent = [(k, r) for k, r in enumerate(results) if k not in sent]
        if unsent or buffer:  # every member is settled by then: a safeguard; the unit's objective last
            members_finished(unsent)
        return

    for member, baseline in zip(todo, baselines, strict=True):

        def evaluated(
            e: trainers.Evaluation, key: str = member.config_hash, baseline: float | None = baseline
        ) -> None:
            report({"objective": objective(e.val_loss, baseline, "done"), "events": [Evaluated(key, e)]})

        result = trainers.train(member.resolved, evaluated)
        result.node = node
        objectives.append(objective(result.final_val_loss, result.baseline_loss, result.status))
        report({"objective": statistics.fmean(objectives), "events": [Finished(member.config_hash, result)]})
