"""A study's plan and its cost, before anything runs — and, once it ran, what it really took.

    plan = plan_spec(engine, spec)                   # POST /studies?dry_run=true · memsweep plan
    record_plan(engine, study_id, calibrate=False)   # the estimate a study keeps in `studies.plan`
    record_actual(ledger, study_id, phases)          # beside it, what its run took (service.runner)

A plan holds the trials per model (trials some study of the ledger finished already are reused, not
run), how they pack into Ray units — fused bundles and single trials — exactly as the run packs them
(`service.study.packing.pack_study`), the budget in optimiser steps (per trial, over the trials, over the
units the slots run) and an estimate of compute and wall-clock time. Nothing is stored or trained,
but the calibrations (`service.planning.calibration`), which the ledger caches per shape and node type.

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
import logging
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy import select

from service.core.settings import Settings
from service.core.spec import StudySpec
from service.core.states import FINISHED
from service.core.trial import StaleTrialError, TrialSpec, Unit
from service.planning.calibration import (
    Calibrate,
    Probe,
    describe_shape,
    run_on_ray,
    shape_key,
    shape_of,
    where_trials_run,
)
from service.planning.types import (
    CalibrationPublic,
    PlanBudget,
    PlanEstimate,
    PlanModel,
    PlanShape,
    StudyPlan,
    UnitMemory,
)
from service.store.ledger import Ledger
from service.store.models import Calibration, Trial
from service.study.nodes import device_on_this_node, embedded
from service.study.packing import bundle, pack_study
from service.study.search import execution, first_point, grid_trials, point_trials, study_space
from trainers import TRAINER_VERSION
from trainers.numerics import PORTABLE_COST
from trainers.schedule import Schedule

log = logging.getLogger(__name__)


class Ground(Protocol):
    """What a plan stands on: the settings, the ledger (reusable trials, cached calibrations) and a
    node's memory for a unit, measured as the run measures it (`Engine` has all three)."""

    settings: Settings
    ledger: Ledger

    def node_memory(self, resources: Mapping[str, float]) -> tuple[str, int] | None: ...


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


# ----- the plan ------------------------------------------------------------------------------------


def plan_spec(
    engine: Ground,
    spec: StudySpec,
    *,
    calibrate: bool = True,
    recalibrate: bool = False,
    calibrator: Calibrate | None = None,
    start_ray: Callable[[], None] | None = None,
) -> StudyPlan:
    """The plan of a study from `spec`, as if created now: nothing is stored (but calibrations).

    `calibrate`: measure shapes the cache lacks (on Ray); else they stay uncalibrated.
    `recalibrate`: measure every shape again. `calibrator`: how to measure (default: on Ray).
    `start_ray`: brings Ray up where it should live (the server's runner thread), called only when
    the plan needs it — a cluster to ask, a shape to measure — so that a spec refused at its checks,
    or planned from the cache, starts no Ray (issue 35); None: started here when needed."""
    space = study_space(spec, engine.settings.max_grid_size)  # a created study's checks
    if spec.sampler == "grid":
        trials = grid_trials(space, execution(spec))
        reusable = _done(engine.ledger, [t.config_hash for t in trials])
        todo = [t for t in trials if t.config_hash not in reusable]
        measured = unit_memory_here(engine, spec)
        units = pack_study(spec, todo, measured)
    else:
        trials, todo, units, measured = [], [], _sampled_units(spec, space, spec.max_trials or 0), None
    planned = _plan(
        engine, spec, space.name, trials, todo, units, calibrate, recalibrate, calibrator, start_ray
    )
    return _with_memory(planned, measured)


def _with_memory(planned: StudyPlan, measured: tuple[str, int] | None) -> StudyPlan:
    """The plan with the unit memory its bundles were packed for."""
    if measured is not None:
        planned.unit_memory = UnitMemory(device=measured[0], bytes=measured[1])
    return planned


def plan_study(
    engine: Ground, study_id: str, *, calibrate: bool, calibrator: Calibrate | None = None
) -> tuple[StudyPlan, list[Unit] | None]:
    """The plan of a stored study: what is left of it to run; and a grid's units as the run would
    pack them now (None when they could not be packed as the run packs them: a sampled study, whose
    units are drawn as it runs, or a cluster whose nodes' memory could not be measured yet)."""
    study = engine.ledger.study(study_id)
    spec = study.validated_spec()
    space = study_space(spec, engine.settings.max_grid_size)
    rows = engine.ledger.trials(study_id)
    trials = [_spec_of(r) for r in rows]
    todo = [t for t, r in zip(trials, rows, strict=True) if r.status not in FINISHED and t is not None]
    packed: list[Unit] | None = None
    measured: tuple[str, int] | None = None
    if spec.sampler == "grid":
        measured = unit_memory_here(engine, spec)
        units = pack_study(spec, [t for t in todo if t is not None], measured)
        packed = units if measured is not None or not spec.fuses else None
    else:
        left = (spec.max_trials or 0) - sum(r.status in FINISHED for r in rows)
        units = _sampled_units(spec, space, max(left, 0))
    kept = [t for t in trials if t is not None]
    planned = _plan(
        engine,
        spec,
        study.name,
        kept,
        [t for t in todo if t is not None],
        units,
        calibrate,
        False,
        calibrator,
    )
    return _with_memory(planned, measured), packed


def unit_memory_here(engine: Ground, spec: StudySpec) -> tuple[str, int] | None:
    """(device, bytes a unit may use) as the run measures it before packing (`Engine.run_study`), so
    that the plan's bundles are the run's: on this machine for an embedded Ray, on a node when the
    cluster is joined already; else None (the packer's assumptions, as a run whose probe failed)."""
    if not spec.fuses:
        return None
    resources = {"cpu": spec.resources.cpus, "gpu": spec.resources.gpus}
    try:
        if embedded(engine.settings):
            return device_on_this_node(spec.resources.gpus, spec.resources.cpus)
        import ray

        if ray.is_initialized():
            return engine.node_memory(resources)
    except Exception as exc:  # a plan is information: the packer's defaults then
        log.warning("no node's memory for the plan's bundles (%s)", exc)
    return None


def _spec_of(row: Trial) -> TrialSpec | None:
    try:
        return row.spec()
    except StaleTrialError:  # made under another trainer version: it will not run as it is
        return None


def _done(ledger: Ledger, hashes: Sequence[str]) -> set[str]:
    """The hashes some study of the ledger finished (`done`): a new study reuses them."""
    found: set[str] = set()
    with ledger.session() as s:
        for i in range(0, len(hashes), 500):
            chunk = hashes[i : i + 500]
            found.update(
                s.scalars(
                    select(Trial.config_hash).where(Trial.config_hash.in_(chunk), Trial.status == "done")
                )
            )
    return found


def _sampled_units(spec: StudySpec, space: Any, trials: int) -> list[Unit]:
    """A sampled study's units ahead of its sampler: each model's first point × the seeds, the models
    in turn (the sampler picks the points; their cost is taken to be the first point's)."""
    seeds = len(space.seeds)
    units: list[Unit] = []
    for i in range(math.ceil(trials / seeds)):
        model = space.models[i % len(space.models)]
        units.append(
            bundle(point_trials(space, model, first_point(model), execution(spec)), fused=spec.fuses)
        )
    return units


def _plan(
    engine: Ground,
    spec: StudySpec,
    name: str,
    trials: Sequence[TrialSpec],
    todo: Sequence[TrialSpec],
    units: Sequence[Unit],
    calibrate: bool,
    recalibrate: bool,
    calibrator: Calibrate | None,
    start_ray: Callable[[], None] | None = None,
) -> StudyPlan:
    settings = engine.settings
    cpus, gpus = spec.resources.cpus, spec.resources.gpus
    notes: list[str] = []
    schedules = _Schedules()
    node: str | None = None
    capacity: int | None = None
    try:
        if calibrate and start_ray is not None and not embedded(settings):
            start_ray()  # a cluster's node type is asked of the cluster
        node, capacity = where_trials_run(settings, cpus, gpus, start=calibrate and start_ray is None)
    except Exception as exc:
        notes.append(f"where the trials run is unknown ({type(exc).__name__}: {exc}); no estimate")
    slots = max(1, min(spec.concurrency, capacity or spec.concurrency))

    # shapes: one calibration per distinct shape, at its largest unit
    shape_units: dict[str, list[Unit]] = defaultdict(list)
    shapes: dict[str, dict[str, Any]] = {}
    for unit in units:
        fused = unit.fused and len(unit.members) > 1
        shape = shape_of(unit.members[0].resolved)
        ident = json.dumps({"shape": shape, "fused": fused}, sort_keys=True, default=str)
        shape_units[ident].append(unit)
        shapes.setdefault(ident, shape)
    probes: dict[str, Probe] = {}
    unit_key: dict[int, str] = {}
    for ident, group in shape_units.items():
        largest = max(group, key=lambda u: len(u.members))
        fused = largest.fused and len(largest.members) > 1
        key = shape_key(shapes[ident], fused, len(largest.members))
        probes[key] = Probe(key, tuple(m.resolved for m in largest.members), fused)
        for u in group:
            unit_key[id(u)] = key

    found: dict[str, dict[str, Any]] = {}
    cached: set[str] = set()
    spent = 0.0
    if node is not None:
        if not recalibrate:
            for key in probes:
                row = engine.ledger.calibration(key, node)
                if row is not None:
                    found[key] = row.measurement
                    cached.add(key)
        missing = [p for k, p in probes.items() if k not in found]
        if missing and calibrate:
            measure = calibrator or (lambda ps: run_on_ray(settings, ps, cpus, gpus, slots))
            if calibrator is None and start_ray is not None:
                start_ray()
            began = time.perf_counter()
            for key, measured in measure(missing).items():
                found[key] = measured
                if measured.get("error") is None:
                    _keep(engine.ledger, key, probes[key], measured, replace=recalibrate)
            spent = time.perf_counter() - began
        elif missing:
            notes.append(
                f"{len(missing)} shape(s) not calibrated on this node type yet: the estimate waits for a "
                "calibration (a dry run, `memsweep plan`, or the study's run makes one)"
            )

    shape_rows = []
    for ident, group in shape_units.items():
        key = unit_key[id(group[0])]
        m = found.get(key)
        calibrated = m is not None and m.get("error") is None
        shape_rows.append(
            PlanShape(
                key=key,
                description=describe_shape(shapes[ident]),
                fused=probes[key].fused,
                bundle_size=len(probes[key].members),
                units=len(group),
                trials=sum(len(u.members) for u in group),
                cached=key in cached,
                calibration=CalibrationPublic.model_validate(m) if calibrated else None,
                error=m.get("error") if m is not None else None,
            )
        )

    estimate = _estimate(units, unit_key, found, schedules, slots) if node is not None else None
    if estimate is not None and units and not estimate.units_estimated:
        estimate = None  # nothing calibrated: no figures rather than zeros
    if not gpus and units:
        idle = idle_gpu_note(engine, spec, estimate, calibrate, calibrator, start_ray)
        notes += [idle] if idle else []
    return StudyPlan(
        name=spec.name or name,
        sampler=spec.sampler,
        trainer_version=TRAINER_VERSION,
        trials=len(trials) if spec.sampler == "grid" else spec.max_trials,
        to_run=len(todo) if spec.sampler == "grid" else sum(len(u.members) for u in units),
        reused=len(trials) - len(todo),
        by_model=_by_model(trials, todo, units, schedules),
        units=len(units),
        bundles=sum(u.fused and len(u.members) > 1 for u in units),
        bundle_sizes=_sizes(units),
        budget=_budget(todo if spec.sampler == "grid" else [m for u in units for m in u.members], units, schedules),
        concurrency=spec.concurrency,
        slots=slots,
        resources={"cpus": cpus, "gpus": gpus},
        node_type=node,
        shapes=shape_rows,
        cached=bool(probes) and cached == set(probes),
        calibration_seconds=spent,
        estimate=estimate,
        notes=notes + (["sampled: the units are each model's first point × the seeds, the models in turn"]
                       if spec.sampler != "grid" else []) + schedules.notes
              + ([PORTABLE_COST] if spec.numerics == "portable" and not gpus else []),
    )  # fmt: skip


def cluster_gpus(settings: Settings) -> float:
    """The GPUs Ray can give this server's studies: the embedded Ray's (this machine's, as CUDA sees
    them) or a joined cluster's; 0 when there are none or that is not known yet."""
    try:
        if embedded(settings):
            import torch

            return float(torch.cuda.device_count())
        import ray

        if ray.is_initialized():
            return float(ray.cluster_resources().get("GPU", 0.0))  # type: ignore[no-untyped-call]
    except Exception as exc:  # a plan is information: no note then
        log.warning("could not ask the cluster for its GPUs (%s)", exc)
    return 0.0


def idle_gpu_note(
    engine: Ground,
    spec: StudySpec,
    estimate: PlanEstimate | None,
    calibrate: bool,
    calibrator: Calibrate | None,
    start_ray: Callable[[], None] | None = None,
) -> str | None:
    """A study that asks no GPU where the cluster has one trains on the CPUs (Ray hides a GPU from a
    task that asks none): say so, with the plan of the same study at one GPU a unit (issue 34)."""
    have = cluster_gpus(engine.settings)
    if have <= 0:
        return None
    on_gpu = spec.model_copy(update={"resources": spec.resources.model_copy(update={"gpus": 1.0})})
    try:
        there = plan_spec(
            engine, on_gpu, calibrate=calibrate, calibrator=calibrator, start_ray=start_ray
        ).estimate
    except Exception as exc:  # a plan is information: the note without the figure then
        log.warning("no plan of the study on a GPU (%s)", exc)
        there = None
    here = f"{estimate.wall_seconds:,.0f} s on the CPUs" if estimate else "the CPUs' time not estimated yet"
    cost = (
        f"about {there.wall_seconds:,.0f} s ({there.wall_seconds_range[0]:,.0f}–{there.wall_seconds_range[1]:,.0f} s)"
        + ("" if there.complete else ", for the shapes calibrated so far")
        if there
        else "not estimated yet (its shapes are not calibrated on the GPU: `memsweep plan` with it calibrates them)"
    )
    return (
        f"the cluster has {have:g} GPU(s) and this study asks none (resources.gpus = 0): its trials train on "
        f"the CPUs, and the GPU stays idle. With `resources: {{gpus: 1}}` in the spec the same study would take "
        f"{cost}, against {here}"
    )


def _keep(ledger: Ledger, key: str, probe: Probe, measurement: Mapping[str, Any], replace: bool) -> None:
    row = Calibration(
        shape_key=key,
        node_type=str(measurement["node_type"]),
        trainer_version=TRAINER_VERSION,
        bundle_size=len(probe.members),
        shape=json.loads(json.dumps(shape_of(probe.members[0]), default=str)),
        measurement=dict(measurement),
    )
    ledger.save_calibration(row, replace=replace)


class _Schedules:
    """Each trial's (budget in steps, evaluations), computed once per task, batch and budget."""

    def __init__(self) -> None:
        self.known: dict[str, tuple[int, int] | None] = {}
        self.notes: list[str] = []

    def of(self, t: TrialSpec) -> tuple[int, int] | None:
        cfg = t.resolved.config
        key = json.dumps([cfg.task, dict(cfg.task_params), cfg.batch_size, cfg.steps, cfg.epochs, cfg.eval_every],
                         sort_keys=True, default=str)  # fmt: skip
        if key not in self.known:
            try:
                s = Schedule.of(cfg, t.resolved.make_task().train_size)
                self.known[key] = (s.budget, s.budget // s.eval_every + (1 if s.budget % s.eval_every else 0))
            except Exception as exc:  # a task whose data files are missing
                self.known[key] = None
                self.notes.append(f"{cfg.task}: budget unknown ({type(exc).__name__}: {exc})"[:500])
        return self.known[key]


def _by_model(
    trials: Sequence[TrialSpec], todo: Sequence[TrialSpec], units: Sequence[Unit], schedules: _Schedules
) -> dict[str, PlanModel]:
    out: dict[str, PlanModel] = {}
    running = {t.config_hash for t in todo}
    for t in trials or [m for u in units for m in u.members]:
        row = out.setdefault(t.model, PlanModel(trials=0, to_run=0, units=0, budget_steps=None))
        row.trials += 1
        row.to_run += t.config_hash in running or not trials
        budget = schedules.of(t)
        if budget is not None:
            low, high = row.budget_steps or (budget[0], budget[0])
            row.budget_steps = [min(low, budget[0]), max(high, budget[0])]
    for u in units:
        for model in {m.model for m in u.members}:
            out[model].units += 1
    return out


def _sizes(units: Sequence[Unit]) -> dict[str, int]:
    sizes: dict[str, int] = defaultdict(int)
    for u in units:
        sizes[str(len(u.members))] += 1
    return dict(sorted(sizes.items(), key=lambda kv: -int(kv[0])))


def _budget(trials: Sequence[TrialSpec], units: Sequence[Unit], schedules: _Schedules) -> PlanBudget:
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


def _estimate(
    units: Sequence[Unit],
    unit_key: Mapping[int, str],
    found: Mapping[str, Mapping[str, Any]],
    schedules: _Schedules,
    slots: int,
) -> PlanEstimate:
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


# ----- what a study keeps --------------------------------------------------------------------------


def record_plan(
    engine: Ground, study_id: str, *, calibrate: bool
) -> tuple[StudyPlan, list[Unit] | None] | None:
    """Keep the study's plan (what is left of it to run, its estimate) in `studies.plan["planned"]`;
    the plan and its units (`plan_study`), or None without one: never raises (a plan is information,
    not a condition of running)."""
    try:
        planned, units = plan_study(engine, study_id, calibrate=calibrate)
        study = engine.ledger.get_study(study_id)
        kept = dict(study.plan or {}) if study is not None else {}
        if kept.get("actual"):  # an earlier run's estimate and cost, kept beside the next run's
            estimate = (kept.get("planned") or {}).get("estimate")
            earlier = {"planned_at": kept.get("planned_at"), "estimate": estimate}
            earlier |= {k: kept.pop(k) for k in ("actual", "accuracy") if k in kept}
            kept["earlier"] = [*kept.get("earlier", []), earlier]
        rows = engine.ledger.trials(study_id)
        kept.update(
            planned=planned.model_dump(mode="json"),
            planned_at=datetime.now(UTC).isoformat(),
            # what this run will train: the unfinished rows now, and any a sampler adds (a higher id)
            unfinished_ids=[t.id for t in rows if t.status not in FINISHED],
            last_id=max((t.id for t in rows), default=0),
        )
        engine.ledger.update_study(study_id, plan=kept)
        return planned, units
    except Exception as exc:
        log.warning("study %s: no plan (%s: %s)", study_id, type(exc).__name__, exc)
        return None


def plan_run(engine: Ground, study_id: str) -> list[Unit] | None:
    """Before each run of a study (the first, a resume, an extension): its plan of what is left to run,
    calibrating the shapes the cache lacks, kept so that `record_actual` compares the run with it. The
    units it packed, for the run to train (packed once), or None (the run packs: `plan_study`)."""
    kept = record_plan(engine, study_id, calibrate=True)
    return kept[1] if kept is not None else None


def record_actual(
    ledger: Ledger, study_id: str, phases: Mapping[str, float], units_run: Sequence[Sequence[str]] = ()
) -> None:
    """After a run: what it took — its wall seconds, the training time of the units it ran (each unit's
    slowest member: `units_run`, the units the run packed, as their members' config hashes; a sampled
    study's points) — beside the estimate kept before it,
    in `studies.plan["actual"]` and `["accuracy"]` (`record_plan` moves them to `["earlier"]` before
    the next run); never raises."""
    try:
        study = ledger.get_study(study_id)
        if study is None:
            return
        spec = study.validated_spec()
        kept = dict(study.plan or {})
        planned_ids = set(kept.get("unfinished_ids") or [])
        last_id = int(kept.get("last_id") or 0)
        ran = [
            t
            for t in ledger.trials(study_id)
            if t.status in FINISHED and t.reused_from is None and (t.id in planned_ids or t.id > last_id)
        ]
        seconds = {t.config_hash: t.seconds or 0.0 for t in ran}
        units: list[Sequence[str]]
        if spec.sampler == "grid":  # a unit's finished members (an interrupted one ran again later)
            units = [m for m in ([h for h in u if h in seconds] for u in units_run) if m]
        else:
            specs = [s for s in (_spec_of(t) for t in ran) if s is not None]
            points: dict[Any, list[str]] = defaultdict(list)
            for s in specs:
                points[
                    (s.model, tuple(sorted((k, repr(v)) for k, v in s.params.items() if k != "seed")))
                ].append(s.config_hash)
            units = list(points.values())
        actual = {
            "runs": len(kept.get("earlier", [])) + 1,
            "wall_seconds": sum(phases.values()),
            "phases": dict(phases),
            "training_seconds": sum(max(seconds[h] for h in u) for u in units if u),
            "trials_run": len(ran),
            "units": len(units),
            "finished_at": datetime.now(UTC).isoformat(),
        }
        kept["actual"] = actual
        estimate = (kept.get("planned") or {}).get("estimate")
        if estimate and estimate.get("complete"):
            kept["accuracy"] = {
                key: {
                    "estimate": estimate[key],
                    "range": estimate[f"{key}_range"],
                    "actual": actual[key],
                    "ratio": actual[key] / estimate[key] if estimate[key] else None,
                    "within_range": estimate[f"{key}_range"][0] <= actual[key] <= estimate[f"{key}_range"][1],
                }
                for key in ("training_seconds", "wall_seconds")
            }
        ledger.update_study(study_id, plan=kept)
    except Exception as exc:
        log.warning("study %s: its cost was not recorded (%s: %s)", study_id, type(exc).__name__, exc)
