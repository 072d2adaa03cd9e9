"""What a plan's units cost: budgets from the trials' schedules, and the time estimate.

The estimate. A unit of K members, B steps and E evaluations of a shape calibrated at K₀ members takes

    T = set-up + B·step·K/K₀ + E·evaluation·(validation set / calibrated part)·K/K₀ + finish·K/K₀

(K₀ is the shape's largest unit; a smaller one of the same shape — the last bundle of an initialiser —
is taken to cost as much per member). Trial-hours: every unit's T plus UNIT_OVERHEAD, summed — a
bundle is one Ray trial on one slot, so its time counts once; multiply by the resources per unit for
CPU- or GPU-hours. Wall-clock: the units placed in order on min(concurrency, what the cluster fits)
slots, as Ray Tune starts them, plus STUDY_OVERHEAD and the MLflow child runs still to write after the
last units (CHILD_RUNS_PER_SECOND).

Uncertainty. The range runs the whole budget at the fastest and at the slowest of the calibration's
timed steps, and the overhead model at both ends of what was measured here (the figures below). It
does not cover the node's load changing after the calibration (a shared machine), early stops (a run
below `early_stop_loss` ends before its budget: the estimate is for full budgets) or failed trials;
those make a study shorter, a busier node longer. Ray and MLflow start-up are not included.
"""

from __future__ import annotations

import heapq
import json
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from service.core.trial import TrialSpec, Unit
from service.planning.types import PlanBudget, PlanEstimate, PlanModel
from trainers.optim import LearningRate
from trainers.schedule import Schedule

#: seconds a slot spends on a unit beyond training it (Ray Tune's trial start and reports, the driver's
#: ledger writes), low–high. benchmarks/engine_overhead.py here: 100 one-trial units took 2.7 s more
#: wall on 2 slots than 4 bundles of the same trials, ≈ 0.06 s a unit; real studies here up to ~0.5 s.
UNIT_OVERHEAD = (0.05, 0.6)
#: seconds a study takes beyond its units, low–high: Ray Tune's start, the summary, plots and parent run
#: (`run_study`'s phases on the demo study here: 3–6 s)
STUDY_OVERHEAD = (2.0, 8.0)
#: MLflow child runs written a second (four writer threads), fast–slow: the README's ~20 a second
CHILD_RUNS_PER_SECOND = (25.0, 12.0)

HOW = (
    "per unit: set-up + steps × the calibrated step (median; range: fastest–slowest step) + evaluations × "
    "the calibrated validation pass scaled to the validation set + finish, per member as calibrated; "
    "trial-hours: units' times + per-unit overhead, summed; wall: units in order on the slots + "
    "per-study overhead + MLflow writes left at the end. For full budgets: early stops and failures "
    "shorten a study, a busier node lengthens it; Ray and MLflow start-up not included"
)


class Schedules:
    """Each trial's schedule (`trainers.schedule.Schedule`) and (budget in steps, evaluations), computed
    once per task, batch and budget."""

    def __init__(self) -> None:
        self.known: dict[str, Schedule | None] = {}
        self.notes: list[str] = []

    def schedule(self, t: TrialSpec) -> Schedule | None:
        """The trial's schedule; None (and a note) when its task cannot say its training set's size."""
        cfg = t.resolved.config
        key = json.dumps([cfg.task, dict(cfg.task_params), cfg.batch_size, cfg.steps, cfg.epochs, cfg.eval_every],
                         sort_keys=True, default=str)  # fmt: skip
        if key not in self.known:
            try:
                self.known[key] = Schedule.of_trial(t.resolved)
            except Exception as exc:  # a task whose data files are missing
                self.known[key] = None
                self.notes.append(f"{cfg.task}: budget unknown ({type(exc).__name__}: {exc})"[:500])
        return self.known[key]

    def of(self, t: TrialSpec) -> tuple[int, int] | None:
        """The trial's (budget in steps, evaluations)."""
        s = self.schedule(t)
        if s is None:
            return None
        return s.budget, s.evaluations


def lr_course_notes(trials: Sequence[TrialSpec], schedules: Schedules) -> list[str]:
    """Where the trials' learning-rate drops (`lr_drop_epochs`, `trainers.optim.LearningRate`) never act,
    one note per model and cause: a drop after an epoch count the budget never completes (epochs ×
    steps_per_epoch ≥ budget: the last step is the budget's), or a `lr_drop_factor` of 1."""
    per_model = Counter(t.model for t in trials)
    past: dict[tuple[str, tuple[int, ...], tuple[int, ...]], list[Schedule]] = defaultdict(list)
    still: dict[tuple[str, tuple[int, ...]], int] = defaultdict(int)
    for t in trials:
        cfg = t.resolved.config
        drops = tuple(cfg.lr_drop_epochs)
        if not drops:
            continue
        if cfg.lr_drop_factor == 1:
            still[(t.model, drops)] += 1
            continue
        s = schedules.schedule(t)
        if s is not None and (beyond := LearningRate.of(cfg, s.steps_per_epoch).drops_past(s.budget)):
            past[(t.model, drops, beyond)].append(s)
    notes = []
    for (model, drops), n in still.items():
        notes.append(
            f"lr_drop_factor 1 with lr_drop_epochs {list(drops)} of model {model!r}"
            f"{_some(n, per_model[model], ' (in {})')}: "
            "its rate never moves (each drop multiplies it by 1); give a factor below 1 (0.1: ÷10), or "
            "leave lr_drop_epochs out"
        )
    for (model, drops, beyond), found in past.items():
        s = max(found, key=lambda s: s.budget / s.steps_per_epoch)  # the one that reaches furthest
        reach = (
            f"{'up to ' if len({(f.budget, f.steps_per_epoch) for f in found}) > 1 else ''}{s.budget:,} steps "
            f"= {_epochs(s.budget / s.steps_per_epoch)} epochs of {s.steps_per_epoch:,} steps"
            f"{_some(len(found), per_model[model], '; {}')}"
        )
        acting = [e for e in drops if e not in beyond]
        notes.append(
            f"lr_drop_epochs {list(drops)} lies past the budget of model {model!r} ({reach}): its rate never drops"
            if not acting
            else f"lr_drop_epochs {list(drops)}: the drop after epoch {', '.join(map(str, beyond))} lies past the "
            f"budget of model {model!r} ({reach}): its rate drops only after epoch {', '.join(map(str, acting))}"
        )
    return notes


def _some(n: int, total: int, said: str) -> str:
    """`said` with `{n} of its {total} trials` filled in, where a note is of some of a model's trials;
    "" where it is of all of them."""
    return said.format(f"{n} of its {total} trials") if n < total else ""


def _epochs(count: float) -> str:
    """A count of epochs as a note says it: 0.08, 2.5, 100, 1,250."""
    return f"{count:,.0f}" if count >= 100 else f"{count:.3g}"


def model_rows(
    trials: Sequence[TrialSpec], todo: Sequence[TrialSpec], units: Sequence[Unit], schedules: Schedules
) -> dict[str, PlanModel]:
    """Per model: its trials, those to run, its units and the range of its budgets in steps. A sampled
    study not yet run has no trials: its units' members are its trials and those to run. `todo` is
    counted as given, not looked up in `trials` by hash (a resumed sampled study's planned draws, each
    model's first point, may share a hash with a point it holds)."""
    out: dict[str, PlanModel] = {}
    drawn = [m for u in units for m in u.members]
    for t in trials or drawn:
        row = out.setdefault(t.model, PlanModel(trials=0, to_run=0, units=0, budget_steps=None))
        row.trials += 1
        budget = schedules.of(t)
        if budget is not None:
            low, high = row.budget_steps or (budget[0], budget[0])
            row.budget_steps = [min(low, budget[0]), max(high, budget[0])]
    for t in todo if trials else drawn:
        out[t.model].to_run += 1
    for u in units:  # a model with no unit left keeps `fused` None: how it trains is not planned
        for model in {m.model for m in u.members}:
            row = out[model]
            row.units += 1
            row.fused = bool(row.fused) or (u.fused and len(u.members) > 1)  # a bundle of one trains alone
    return out


def unit_sizes(units: Sequence[Unit]) -> dict[str, int]:
    """How many units of each size (members), largest first: every unit, fused or not."""
    sizes: dict[str, int] = defaultdict(int)
    for u in units:
        sizes[str(len(u.members))] += 1
    return dict(sorted(sizes.items(), key=lambda kv: -int(kv[0])))


def step_budget(trials: Sequence[TrialSpec], units: Sequence[Unit], schedules: Schedules) -> PlanBudget:
    """The budget in optimiser steps: per trial, over the trials, over the units the slots run."""
    per_trial = [b[0] for t in trials if (b := schedules.of(t)) is not None]
    per_unit = [b[0] for u in units if (b := schedules.of(u.members[0])) is not None]
    return PlanBudget(
        steps_per_trial=[min(per_trial), max(per_trial)] if per_trial else None,
        trial_steps=sum(per_trial),
        unit_steps=sum(per_unit),
        evaluations=sum(b[1] for t in trials if (b := schedules.of(t)) is not None),
    )


def unit_seconds(unit: Unit, m: Mapping[str, Any], schedule: tuple[int, int]) -> tuple[float, float, float]:
    """(fastest, median, slowest) seconds of training one unit, from its shape's calibration `m`."""
    share = len(unit.members) / int(m["bundle_size"])
    budget, evaluations = schedule
    evaluation = (m.get("eval_seconds") or 0.0) * float(m.get("val_scale") or 1.0) * share
    fixed = float(m["setup_seconds"]) + evaluations * evaluation + float(m["finish_seconds"]) * share
    steps = [float(s) for s in m["step_seconds"]]
    return tuple(fixed + budget * s * share for s in (min(steps), statistics.median(steps), max(steps)))  # type: ignore[return-value]


def makespan(durations: Sequence[float], slots: int) -> float:
    """Seconds until the last of these units ends when each starts on the first free slot, in order."""
    ends = [0.0] * max(1, slots)
    for d in durations:
        heapq.heappush(ends, heapq.heappop(ends) + d)
    return max(ends)


def time_estimate(
    units: Sequence[Unit],
    unit_key: Mapping[int, str],
    found: Mapping[str, Mapping[str, Any]],
    schedules: Schedules,
    slots: int,
) -> PlanEstimate:
    """The units' time on `slots`, from their shapes' calibrations (`found`, by `unit_key`), at the
    fastest, median and slowest step and both ends of the overheads."""
    times: list[tuple[float, float, float]] = []
    for u in units:
        m = found.get(unit_key[id(u)])
        schedule = schedules.of(u.members[0])
        if m is not None and m.get("error") is None and schedule is not None:
            times.append(unit_seconds(u, m, schedule))
    tail = sum(len(u.members) for u in units[-slots:])  # the last units' child runs, written at the end
    scenarios: dict[
        str, tuple[int, float, float, float]
    ] = {  # (which time, unit and study overheads, runs/s)
        "low": (0, UNIT_OVERHEAD[0], STUDY_OVERHEAD[0], CHILD_RUNS_PER_SECOND[0]),
        "mid": (
            1,
            statistics.fmean(UNIT_OVERHEAD),
            statistics.fmean(STUDY_OVERHEAD),
            statistics.fmean(CHILD_RUNS_PER_SECOND),
        ),
        "high": (2, UNIT_OVERHEAD[1], STUDY_OVERHEAD[1], CHILD_RUNS_PER_SECOND[1]),
    }
    found_: dict[str, dict[str, float]] = {}
    for name, (i, per_unit, per_study, rate) in scenarios.items():
        slot_seconds = [t[i] + per_unit for t in times]
        found_[name] = {
            "training_seconds": sum(t[i] for t in times),
            "trial_hours": sum(slot_seconds) / 3600,
            "wall_seconds": makespan(slot_seconds, slots) + per_study + tail / rate if times else 0.0,
        }
    low, mid, high = found_["low"], found_["mid"], found_["high"]
    return PlanEstimate(
        complete=len(times) == len(units),
        units_estimated=len(times),
        units_missing=len(units) - len(times),
        training_seconds=mid["training_seconds"],
        training_seconds_range=(low["training_seconds"], high["training_seconds"]),
        trial_hours=mid["trial_hours"],
        trial_hours_range=(low["trial_hours"], high["trial_hours"]),
        wall_seconds=mid["wall_seconds"],
        wall_seconds_range=(low["wall_seconds"], high["wall_seconds"]),
        how=HOW,
    )
