"""A study's plan and its cost, before anything runs — and, once it ran, what it really took.

    plan = plan_spec(engine, spec)                   # POST /studies?dry_run=true · memsweep plan
    record_plan(engine, study_id, calibrate=False)   # the estimate a study keeps (`planning.record`)
    record_actual(ledger, study_id, phases)          # beside it, what its run took (service.runner)

A plan holds the trials per model (trials some study of the ledger finished already are reused, not
run), how they pack into Ray units — fused bundles and single trials — exactly as the run packs them
(`service.study.packing.pack_study`), the budget in optimiser steps (per trial, over the trials, over the
units the slots run) and an estimate of compute and wall-clock time. Nothing is stored or trained,
but the calibrations (`service.planning.calibration`), which the ledger caches per shape and node type.

The estimate and its uncertainty: `service.planning.estimate`; what a plan says of the spec, the ledger's
trials and asha (its notes): `service.planning.notes`.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from service.core.settings import Settings
from service.core.spec import StudySpec
from service.core.states import FINISHED
from service.core.trial import StaleTrialError, TrialSpec, Unit, point_key
from service.planning.calibration import (
    Calibrate,
    Probe,
    describe_shapes,
    run_calibrations,
    shape_key,
    shape_of,
    where_trials_run,
)
from service.planning.estimate import (
    Schedules,
    lr_course_notes,
    model_rows,
    step_budget,
    time_estimate,
    unit_sizes,
)
from service.planning.notes import asha_notes, elsewhere_notes, other_code_notes, spec_notes
from service.planning.types import (
    CalibrationPublic,
    PlanEstimate,
    PlanShape,
    StudyPlan,
    UnitMemory,
)
from service.store.ledger import Ledger
from service.store.models import Calibration, Trial
from service.study.executor import Executor
from service.study.nodes import device_on_this_node, embedded
from service.study.packing import bundle, pack_study, stopped_points
from service.study.search import (
    check_numbers_as_text,
    execution,
    first_point,
    grid_trials,
    point_trials,
    points_left,
    study_space,
)
from trainers import TRAINER_VERSION
from trainers.numerics import PORTABLE_COST

log = logging.getLogger(__name__)


class Ground(Protocol):
    """What a plan stands on: the settings, the ledger (reusable trials, cached calibrations), the
    executor (its cluster, its tasks: the calibrations) and a node's memory for a unit, measured as the
    run measures it (`Engine` has all four)."""

    settings: Settings
    ledger: Ledger

    @property
    def executor(self) -> Executor: ...

    def node_memory(self, resources: Mapping[str, float]) -> tuple[str, int] | None: ...


# ----- the plan ------------------------------------------------------------------------------------


def plan_spec(
    engine: Ground,
    spec: StudySpec,
    *,
    calibrate: bool = True,
    recalibrate: bool = False,
    calibrator: Calibrate | None = None,
    start_ray: Callable[[], None] | None = None,
    cancel: threading.Event | None = None,
) -> StudyPlan:
    """The plan of a study from `spec`, as if created now: nothing is stored (but calibrations).

    `calibrate`: measure shapes the cache lacks (on Ray); else they stay uncalibrated.
    `recalibrate`: measure every shape again. `calibrator`: how to measure (default: on Ray).
    `start_ray`: brings Ray up where it should live (the server's runner thread), called only when
    the plan needs it — a cluster to ask, a shape to measure — so that a spec refused at its checks,
    or planned from the cache, starts no Ray (issue 35); None: started here when needed. `cancel`
    stops a calibration on Ray (its shapes stay uncalibrated)."""
    space = study_space(spec, engine.settings.max_grid_size)  # a created study's checks
    check_numbers_as_text(space)
    if spec.sampler == "grid":
        trials = grid_trials(space, execution(spec))
        reusable = engine.ledger.reusable([t.config_hash for t in trials])
        todo = [t for t in trials if t.config_hash not in reusable]
        measured = unit_memory_here(engine, spec)
        units = pack_study(spec, todo, measured)
    else:
        trials, todo, measured = [], [], None
        units = _sampled_units(spec, space, points_left(spec, space, []))
    planned = _plan(
        engine, spec, space.name, trials, todo, units, calibrate, recalibrate, calibrator, start_ray, cancel,
        seeds=len(space.seeds),
    )  # fmt: skip
    planned.notes += (
        spec_notes(spec, space)
        + elsewhere_notes(engine.ledger, spec, None, todo)
        + other_code_notes(engine.ledger, todo)
    )
    return _with_memory(planned, measured)


def _with_memory(planned: StudyPlan, measured: tuple[str, int] | None) -> StudyPlan:
    """The plan with the unit memory its bundles were packed for."""
    if measured is not None:
        planned.unit_memory = UnitMemory(device=measured[0], bytes=measured[1])
    return planned


def plan_study(
    engine: Ground,
    study_id: str,
    *,
    calibrate: bool,
    calibrator: Calibrate | None = None,
    cancel: threading.Event | None = None,
) -> tuple[StudyPlan, list[Unit] | None]:
    """The plan of a stored study: what is left of it to run; and a grid's units as the run would
    pack them now (None when they could not be packed as the run packs them: a sampled study, whose
    units are drawn as it runs, or a cluster whose nodes' memory could not be measured yet)."""
    study = engine.ledger.study(study_id)
    spec = study.validated_spec()
    space = study_space(spec, engine.settings.max_grid_size)
    rows = engine.ledger.trials(study_id)
    trials = [spec_of(r) for r in rows]
    todo = [t for t, r in zip(trials, rows, strict=True) if r.status not in FINISHED and t is not None]
    # a trial another study has finished since this one made it takes that result as the run begins
    # (`service.study.elsewhere`): reused, as at a study's creation, not run
    done = engine.ledger.reusable([t.config_hash for t in todo])
    todo = [t for t in todo if t.config_hash not in done]
    untrained: list[TrialSpec] = []
    if spec.scheduler == "asha":  # seeds added to points asha stopped: pruned with them, not trained
        stopped = stopped_points(rows)
        untrained = [t for t in todo if t is not None and point_key(t.model, t.params) in stopped]
        todo = [t for t in todo if t is None or point_key(t.model, t.params) not in stopped]
    packed: list[Unit] | None = None
    measured: tuple[str, int] | None = None
    kept = [t for t in trials if t is not None]
    again = [t for t in todo if t is not None]
    if spec.sampler == "grid":
        measured = unit_memory_here(engine, spec)
        units = pack_study(spec, again, measured)
        packed = units if measured is not None or not spec.sizes_bundles else None
    else:  # those it holds unfinished, then the points its budget leaves to draw, as the run trains them
        drawn = _sampled_units(spec, space, points_left(spec, space, rows), rows)
        if again:
            measured = unit_memory_here(engine, spec)
        units = (pack_study(spec, again, measured) if again else []) + drawn
        members = [m for u in drawn for m in u.members]
        kept, again = kept + members, again + members
    planned = _plan(
        engine,
        spec,
        study.name,
        kept,
        again,
        units,
        calibrate,
        False,
        calibrator,
        cancel=cancel,
        untrained=len(untrained),
        seeds=len(space.seeds),
    )
    planned.notes += (
        spec_notes(spec, space)
        + elsewhere_notes(engine.ledger, spec, study_id, again)
        + other_code_notes(engine.ledger, again)
    )
    return _with_memory(planned, measured), packed


def unit_memory_here(engine: Ground, spec: StudySpec) -> tuple[str, int] | None:
    """(device, bytes a unit may use) as the run measures it before packing (`Engine.run_study`), so
    that the plan's bundles are the run's: on this machine for an embedded Ray, on a node when the
    cluster is joined already; else None (the packer's assumptions, as a run whose probe failed)."""
    if not spec.sizes_bundles:
        return None
    resources = {"cpu": spec.resources.cpus, "gpu": spec.resources.gpus}
    try:
        if embedded(engine.settings):
            return device_on_this_node(spec.resources.gpus, spec.resources.cpus)
        if engine.executor.resources() is not None:  # the cluster is joined already
            return engine.node_memory(resources)
    except Exception as exc:  # a plan is information: the packer's defaults then
        log.warning("no node's memory for the plan's bundles (%s)", exc)
    return None


def spec_of(row: Trial) -> TrialSpec | None:
    try:
        return row.spec()
    except StaleTrialError:  # made under another trainer version: it will not run as it is
        return None


def _sampled_units(spec: StudySpec, space: Any, points: int, held: Sequence[Trial] = ()) -> list[Unit]:
    """A sampled study's `points` draws ahead of its sampler: each model's first point × the seeds, the
    models in turn, going on from the points the study holds (`held`: each draw is of a model with the
    fewest points so far). The sampler picks the models and points; their cost is taken to be the
    first point's."""
    count = {m.name: 0 for m in space.models}
    for model, _ in {point_key(t.model, t.params) for t in held}:
        if model in count:  # (an `arm` of the one unnamed model is not a model of the space: one model)
            count[model] += 1
    units: list[Unit] = []
    for _ in range(points):
        model = min(space.models, key=lambda m: count[m.name])  # the first of those with the fewest
        count[model.name] += 1
        units.append(
            bundle(
                point_trials(space, model, first_point(model), execution(spec)),
                fused=spec.fuses,
                lockstep=spec.scheduler == "asha",
            )
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
    cancel: threading.Event | None = None,
    untrained: int = 0,
    seeds: int = 1,
) -> StudyPlan:
    """`untrained`: trials of `trials` left out of `todo` because they will be recorded pruned with
    their points, untrained (asha); `seeds`: the seeds of each point (a sampled study draws
    max_trials rounded up to whole points)."""
    cpus, gpus = spec.resources.cpus, spec.resources.gpus
    notes: list[str] = []
    if untrained:
        notes.append(
            f"asha: {untrained} trials are seeds added to points it stopped before: they are recorded pruned "
            "with their points, not trained"
        )
    schedules = Schedules()
    node, capacity, where_unknown = _where(engine, spec, calibrate, start_ray, notes, cancel)
    slots = max(1, min(spec.concurrency, capacity or spec.concurrency))
    shapes = _Shapes(units)
    found: dict[str, dict[str, Any]] = {}
    cached: set[str] = set()
    spent = 0.0
    if node is not None:
        spent = _calibrations(engine, spec, shapes.probes, node, slots, found, cached, notes,
                              calibrate, recalibrate, calibrator, start_ray, cancel)  # fmt: skip
    estimate = time_estimate(units, shapes.unit_key, found, schedules, slots) if node is not None else None
    if estimate is not None and units and not estimate.units_estimated:
        estimate = None  # nothing calibrated: no figures rather than zeros
    if not (cancel is not None and cancel.is_set()):  # (a cancel's calibrations stopped: none failed)
        notes += failed_calibration_notes(shapes, found, estimate is not None)
    if not gpus and units and not (cancel is not None and cancel.is_set()):  # a cancel plans nothing more
        idle = idle_gpu_note(engine, spec, estimate, calibrate, calibrator, start_ray, cancel)
        notes += [idle] if idle else []
    return StudyPlan(
        name=spec.name or name,
        sampler=spec.sampler,
        trainer_version=TRAINER_VERSION,
        trials=len(trials) if spec.sampler == "grid" else math.ceil((spec.max_trials or 0) / seeds) * seeds,
        to_run=len(todo) if spec.sampler == "grid" else sum(len(u.members) for u in units),
        reused=len(trials) - len(todo) - untrained,
        pruned_untrained=untrained,
        by_model=model_rows(trials, todo, units, schedules),
        units=len(units),
        bundles=sum(u.fused and len(u.members) > 1 for u in units),
        unit_sizes=unit_sizes(units),
        bundle_sizes=unit_sizes(units),  # deprecated: its first name (it counts units, not bundles)
        budget=step_budget(todo if spec.sampler == "grid" else [m for u in units for m in u.members], units, schedules),
        concurrency=spec.concurrency,
        slots=slots,
        resources={"cpus": cpus, "gpus": gpus},
        node_type=node,
        where_unknown=where_unknown,
        shapes=shapes.rows(found, cached),
        cached=bool(shapes.probes) and cached == set(shapes.probes),
        calibration_seconds=spent,
        estimate=estimate,
        notes=notes + (["sampled: the units are each model's first point × the seeds, the models in turn"]
                       if spec.sampler != "grid" else [])
              + (asha_notes(spec, units, schedules) if spec.scheduler == "asha" else [])
              + schedules.notes
              + lr_course_notes(trials or [m for u in units for m in u.members], schedules)
              + ([PORTABLE_COST] if spec.numerics == "portable" and not gpus else []),
    )  # fmt: skip


def failed_calibration_notes(
    shapes: _Shapes, found: Mapping[str, Mapping[str, Any]], estimated: bool
) -> list[str]:
    """The calibrations that failed, one note per cause (the shapes table gave the error alone, and the
    plan's last line said no estimate for another reason): their units are left out of the estimate,
    and a trial of that shape is likely to fail as its calibration did."""
    failed: dict[str, list[str]] = defaultdict(list)  # error → the shape keys it failed
    for key in shapes.probes:
        error = (found.get(key) or {}).get("error")
        if error is not None:
            failed[str(error)].append(key)
    notes = []
    for error, keys in failed.items():
        units = sum(1 for k in shapes.unit_key.values() if k in keys)
        notes.append(
            f"calibration failed for {len(keys)} of {len(shapes.probes)} shape(s) ({error}): "
            f"{'the estimate leaves out' if estimated else 'no estimate for'} their {units} unit(s); their "
            "trials may fail the same way when the study runs: check their settings (the learning rate, "
            "clip_norm), or plan again to measure once more"
        )
    return notes


def _where(
    engine: Ground,
    spec: StudySpec,
    calibrate: bool,
    start_ray: Callable[[], None] | None,
    notes: list[str],
    cancel: threading.Event | None = None,
) -> tuple[str | None, int | None, str | None]:
    """(node type, how many units fit the cluster at once, None) of where the study's trials run; (None,
    None, why) and a note when that is unknown (the cluster could not be joined, say), (None, None,
    None) when `cancel` stopped the asking."""
    try:
        if calibrate and start_ray is not None and not embedded(engine.settings):
            start_ray()  # a cluster's node type is asked of the cluster
        node, capacity = where_trials_run(
            engine.executor, engine.settings, spec.resources.cpus, spec.resources.gpus,
            start=calibrate and start_ray is None, cancel=cancel,
        )  # fmt: skip
        return node, capacity, None
    except Exception as exc:
        cause = (
            exc.__cause__ or exc
        )  # a start of Ray says what failed, raised from it (`StudyRunner.start_ray`)
        why = (
            str(cause) if type(cause) is RuntimeError else f"{type(cause).__name__}: {cause}"
        )  # (ours say it)
        notes.append(f"where the trials run is unknown ({why}); no estimate")
        return None, None, None if cancel is not None and cancel.is_set() else why


class _Shapes:
    """The units' shapes: one calibration probe per distinct shape, at its largest unit (`probes`, by
    shape key; `unit_key`: each unit's, by `id`)."""

    def __init__(self, units: Sequence[Unit]) -> None:
        self.groups: dict[str, list[Unit]] = defaultdict(list)
        self.shapes: dict[str, dict[str, Any]] = {}
        for unit in units:
            fused = unit.fused and len(unit.members) > 1
            shape = shape_of(unit.members[0].resolved)
            ident = json.dumps({"shape": shape, "fused": fused}, sort_keys=True, default=str)
            self.groups[ident].append(unit)
            self.shapes.setdefault(ident, shape)
        self.probes: dict[str, Probe] = {}
        self.unit_key: dict[int, str] = {}
        for ident, group in self.groups.items():
            largest = max(group, key=lambda u: len(u.members))
            fused = largest.fused and len(largest.members) > 1
            # a unit that does not fuse trains its members one at a time (one after another, or in
            # lockstep): its probe is one member, whose cost each member pays (`unit_seconds`'s share);
            # the whole unit, of which the calibration trained only the first, was costed as one member
            members = largest.members if fused else largest.members[:1]
            key = shape_key(self.shapes[ident], fused, len(members))
            self.probes[key] = Probe(key, tuple(m.resolved for m in members), fused)
            for u in group:
                self.unit_key[id(u)] = key

    def rows(self, found: Mapping[str, Mapping[str, Any]], cached: set[str]) -> list[PlanShape]:
        """Each shape as the plan shows it, with its calibration (or why it has none)."""
        rows = []
        descriptions = dict(
            zip(self.groups, describe_shapes([self.shapes[i] for i in self.groups]), strict=True)
        )
        for ident, group in self.groups.items():
            key = self.unit_key[id(group[0])]
            m = found.get(key)
            calibrated = m is not None and m.get("error") is None
            rows.append(
                PlanShape(
                    key=key,
                    description=descriptions[ident],
                    fused=self.probes[key].fused,
                    bundle_size=len(self.probes[key].members),
                    units=len(group),
                    trials=sum(len(u.members) for u in group),
                    cached=key in cached,
                    calibration=CalibrationPublic.model_validate(m) if calibrated else None,
                    error=m.get("error") if m is not None else None,
                )
            )
        return rows


def _calibrations(
    engine: Ground,
    spec: StudySpec,
    probes: Mapping[str, Probe],
    node: str,
    slots: int,
    found: dict[str, dict[str, Any]],
    cached: set[str],
    notes: list[str],
    calibrate: bool,
    recalibrate: bool,
    calibrator: Calibrate | None,
    start_ray: Callable[[], None] | None,
    cancel: threading.Event | None = None,
) -> float:
    """Each probe's calibration on this node type into `found` (those the ledger had into `cached`),
    measuring the missing ones when `calibrate` (kept in the ledger); the seconds measuring took."""
    if not recalibrate:
        for key in probes:
            row = engine.ledger.calibration(key, node)
            if row is not None:
                found[key] = row.measurement
                cached.add(key)
    missing = [p for k, p in probes.items() if k not in found]
    if missing and calibrate:
        cpus, gpus = spec.resources.cpus, spec.resources.gpus
        measure = calibrator or (
            lambda ps: run_calibrations(engine.executor, ps, cpus, gpus, slots, cancel=cancel)
        )
        if calibrator is None and start_ray is not None:
            start_ray()
        began = time.perf_counter()
        for key, measured in measure(missing).items():
            found[key] = measured
            if measured.get("error") is None:
                _keep(engine.ledger, key, probes[key], measured, replace=recalibrate)
        return time.perf_counter() - began
    if missing:
        notes.append(
            f"{len(missing)} shape(s) not calibrated on this node type yet: the estimate waits for a "
            "calibration (a dry run, `memsweep plan`, or the study's run makes one)"
        )
    return 0.0


def cluster_gpus(engine: Ground) -> float:
    """The GPUs Ray can give this server's studies: the embedded Ray's (this machine's, as CUDA sees
    them) or a joined cluster's; 0 when there are none or that is not known yet."""
    try:
        if embedded(engine.settings):
            import torch

            return float(torch.cuda.device_count())
        have = engine.executor.resources()
        if have is not None:
            return have["gpu"]
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
    cancel: threading.Event | None = None,
) -> str | None:
    """A study that asks no GPU where the cluster has one trains on the CPUs (Ray hides a GPU from a
    task that asks none): say so, with the plan of the same study at one GPU a unit (issue 34)."""
    have = cluster_gpus(engine)
    if have <= 0:
        return None
    on_gpu = spec.model_copy(update={"resources": spec.resources.model_copy(update={"gpus": 1.0})})
    try:
        there = plan_spec(
            engine, on_gpu, calibrate=calibrate, calibrator=calibrator, start_ray=start_ray, cancel=cancel
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
