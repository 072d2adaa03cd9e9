"""Calibration: a few real training steps of each distinct shape a study trains, timed where its
trials would run, and kept in the ledger per shape and node type (a second plan is instant).

A *shape* is what sets a unit's cost per step: its trials' resolved config without the values a
grid varies (seed, learning rate and the optimiser's constants, the initialiser and its scale, the
budget and thresholds, and a cell's settings declared as floats: `coefficients`), whether it trains
fused, and its bundle size. A calibration trains one real
unit of the shape — the members of the study's largest unit of it: a fused bundle at the study's
bundle size, or one trial — for `STEPS` timed steps with the trainers themselves (`train_fused` or
`train`), as a task with the study's resources (`Executor.run_tasks`: a Ray task; a GPU study
calibrates on a GPU node), and times

- every training step but the warm-ups (the first; on a GPU, a graphed bundle's eager warm-ups and
  the step that captures it: `trainers.fused.steps_to_pace`), between the moments the trainer asks its task for
  a training batch (`Task.encode` with gradients on: the task class is wrapped for the calibration,
  the trainers are unchanged), so the spread of the steps is known;
- one validation pass over at most `VAL` sequences (from its first `encode` without gradients to the
  evaluation's report), to be scaled to the real validation set;
- the set-up before the first step (data, models, and the warm-up steps' excess) and the finish after
  the last report (the trained matrices' analyses).

The trainers' own numbers do not enter: only the configs' budget, evaluation cadence, validation set
size and learning rate (the smallest of the unit's, so no member diverges) are changed.

Node type: the CPU model and count, and the GPU for a GPU study (`node_type`); the cache key adds
the shape and TRAINER_VERSION (kernels set the speed).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import platform
import statistics
import threading
import time
import types
import typing
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trainers
from service.core.settings import Settings
from service.study.executor import Executor, Task
from service.study.nodes import embedded, embedded_resources, unplaceable_here
from trainers import TRAINER_VERSION

if TYPE_CHECKING:
    from trainers.cells.base import Cell

log = logging.getLogger(__name__)

#: training steps a calibration times, after the unit's warm-up steps (one; a graphed GPU bundle's
#: eager warm-ups and capture: `trainers.fused.steps_to_pace`)
STEPS = 6
#: seconds of timed steps under which a calibration runs again with more steps (at most MAX_STEPS)
TIMED_SECONDS = 1.0
MAX_STEPS = 200
#: validation sequences a calibration evaluates at most (the time is scaled to the real set)
VAL = 64
#: seconds a plan waits for its calibrations (a busy cluster may have no free slot)
TIMEOUT = 180.0
#: trial fields that set a trial's values, not its cost per step (the budget is counted separately)
VALUE_FIELDS = (
    "seed", "lr", "lr_drop_epochs", "lr_drop_factor", "lr_decay_steps", "rho", "betas", "eps", "clip_norm",
    "steps", "epochs", "eval_every", "early_stop_loss", "divergence_guard",
)  # fmt: skip
#: cell fields that set only initial weights
VALUE_CELL_FIELDS = ("init", "scale")


def shape_of(resolved: trainers.Resolved) -> dict[str, Any]:
    """A trial's config without the values a grid varies: what its cost per step depends on."""
    config = resolved.to_dict()
    shape = {k: v for k, v in config.items() if k not in VALUE_FIELDS}
    values = {*VALUE_CELL_FIELDS, *coefficients(resolved.cell_cls)}
    shape["cell_params"] = {k: v for k, v in config["cell_params"].items() if k not in values}
    return shape


@functools.cache
def coefficients(cell: type[Cell]) -> frozenset[str]:
    """A cell's settings declared as floats (`float`, `float | None`) but its `cost_settings`: numbers in
    its recurrence or its initial weights (a step size, a damping, a gain, a gate's bias), never a size or
    an operation, which are ints, strings and flags; so a grid over them trains one shape (a plugin's
    coRNN at two `dt` was calibrated twice, for the same compute). A float that does change the cost (a
    density, a `float | None` that skips an operation) is the cell's to declare in `cost_settings`."""
    return (
        frozenset(
            name
            for name, tp in typing.get_type_hints(cell.Config).items()
            if tp is float
            or (
                typing.get_origin(tp) in (typing.Union, types.UnionType)
                and set(typing.get_args(tp)) <= {float, type(None)}
            )
        )
        - cell.cost_settings
    )


def shape_key(shape: Mapping[str, Any], fused: bool, bundle_size: int) -> str:
    """The cache key of a shape trained fused (or not) in bundles of `bundle_size`."""
    ident = {"shape": shape, "fused": fused, "bundle_size": bundle_size, "trainer_version": TRAINER_VERSION}
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]


def describe_shape(shape: Mapping[str, Any]) -> str:
    """A shape as people read it: `copy seq_len=500 · rnn nonlinearity=elu · hidden 100 · batch 16`."""
    shown = ("seq_len", "data", "embed_dim")  # embed_dim: copy's inputs embedded (none: not shown)
    task = " ".join(
        f"{k}={v}" for k, v in sorted(shape["task_params"].items()) if k in shown and v is not None
    )
    cell = " ".join(f"{k}={v}" for k, v in sorted(shape["cell_params"].items()) if k in ("nonlinearity",))
    return (
        f"{shape['task']} {task} · {shape['cell']} {cell} · hidden {shape['hidden']} · "
        f"batch {shape['batch_size']} · {shape['threads']} thread(s)"
    ).replace("  ", " ")


def describe_shapes(shapes: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each shape as `describe_shape` puts it, and where two would read the same, the task's and the
    cell's settings in which they differ (a plugin cell's own field its grid varies: `rank=4`)."""
    described = [describe_shape(shape) for shape in shapes]
    for text in set(described):
        same = [i for i, d in enumerate(described) if d == text]
        if len(same) < 2:
            continue
        for part in ("task_params", "cell_params"):
            names = sorted({k for i in same for k in shapes[i][part]})
            differ = [k for k in names if len({repr(shapes[i][part].get(k)) for i in same}) > 1]
            for i in same:
                extra = " ".join(f"{k}={shapes[i][part].get(k)}" for k in differ)
                described[i] += f" · {extra}" if extra else ""
    return described


def node_type(gpu: bool) -> str:
    """This machine as a calibration's cache knows it: CPU model × logical CPUs (+ the GPU)."""
    from trainers.numerics import cpu_model

    kind = f"{cpu_model()} ×{os.cpu_count()}"
    if gpu:
        import torch

        kind += f" + {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else " + no GPU"
    return kind


@dataclass(frozen=True)
class Probe:
    """One shape to calibrate: a real unit's members (resolved configs), trained fused or alone."""

    key: str
    members: tuple[trainers.Resolved, ...]
    fused: bool


# ----- in the worker -------------------------------------------------------------------------------


def calibrate(probe: Probe, gpu: bool = False) -> dict[str, Any]:
    """Train the probe's unit for its warm-up steps and `STEPS` timed ones (see the module docstring) — again for
    more steps, up to `MAX_STEPS`, when its timed steps took under `TIMED_SECONDS` in all (a cheap
    shape's few steps say little) — never raises: a failure is the answer's `error`."""
    started = time.perf_counter()
    out: dict[str, Any] = {"bundle_size": len(probe.members), "fused": probe.fused, "error": None}
    try:
        out["node_type"] = node_type(gpu)
        out["node"] = platform.node()
        out.update(_run(probe, STEPS))
        timed = sum(out["step_seconds"])
        if timed < TIMED_SECONDS:
            more = min(
                MAX_STEPS, math.ceil(TIMED_SECONDS / max(statistics.median(out["step_seconds"]), 1e-6))
            )
            out.update(_run(probe, max(more, STEPS)))
    except Exception as exc:  # a calibration never takes its caller down
        out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    out["seconds"] = time.perf_counter() - started
    return out


def _run(probe: Probe, steps: int) -> dict[str, Any]:
    """One timed run of the probe's unit for `steps` steps."""
    from trainers.fused import steps_to_pace, train_fused

    marks: list[tuple[int, float, bool]] = []
    reports: list[float] = []
    fused = probe.fused and len(probe.members) > 1
    warm = steps_to_pace(probe.members[0].config) if fused else 1
    real_val, members = _short(probe.members, warm + steps, marks)
    begin = time.perf_counter()
    if fused:
        results = train_fused(members, lambda k, e: reports.append(time.perf_counter()))
    else:
        results = [trainers.train(members[0], lambda e: reports.append(time.perf_counter()))]
    end = time.perf_counter()
    failed = [r.reason for r in results if r.status != "done"]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(results)} calibration trial(s) failed: {failed[0]}")
    val_sequences = _val_size(members[0])
    return {
        **_timings(marks, reports, begin, end, warm),
        "device": results[0].device,
        "val_sequences": val_sequences,
        "val_scale": real_val / val_sequences,
    }


def _short(
    members: Sequence[trainers.Resolved], steps: int, marks: list[tuple[int, float, bool]]
) -> tuple[int, list[trainers.Resolved]]:
    """(the real validation set's size, the members cut to a calibration: `steps` steps evaluated at
    the end on at most `VAL` sequences, the unit's smallest learning rate, and the timed task class)."""
    first = members[0]
    real_val = _val_size(first)
    changes: dict[str, Any] = {"steps": steps, "eval_every": steps, "lr": min(m.config.lr for m in members)}
    if hasattr(first.task_config, "n_val"):
        changes["task.n_val"] = min(real_val, VAL)
    timed = _timed_task(first.task_cls, marks)
    return real_val, [
        dataclasses.replace(trainers.resolve(trainers.apply_overrides(m.config, changes)), task_cls=timed)
        for m in members
    ]


def _val_size(resolved: trainers.Resolved) -> int:
    n = getattr(resolved.task_config, "n_val", None)
    return int(n) if isinstance(n, int) else len(resolved.make_task().val_split())


def _timed_task(task_cls: type[Any], marks: list[tuple[int, float, bool]]) -> type[Any]:
    """`task_cls` whose `encode` notes (instance, time, gradients on) — a training batch with gradients,
    a validation batch without — after waiting for a GPU's queued work."""

    class Timed(task_cls):  # type: ignore[misc]
        def encode(self, batch: Any, device: Any) -> Any:
            import torch

            if getattr(device, "type", None) == "cuda":
                torch.cuda.synchronize(device)
            marks.append((id(self), time.perf_counter(), torch.is_grad_enabled()))
            return super().encode(batch, device)

    Timed.__name__ = Timed.__qualname__ = task_cls.__name__
    return Timed


def _timings(
    marks: Sequence[tuple[int, float, bool]],
    reports: Sequence[float],
    begin: float,
    end: float,
    warm: int = 1,
) -> dict[str, Any]:
    """Step, evaluation, set-up and finish times from the marks of one calibration run whose first
    `warm` steps are warm-ups (their excess over the timed steps' median counts as set-up)."""
    train: dict[int, list[float]] = defaultdict(list)
    val = sorted(t for _, t, grad in marks if not grad)
    for who, t, grad in marks:
        if grad:
            train[who].append(t)
    if not train:
        raise RuntimeError("the trainer asked for no training batch; nothing to time")
    starts = max(train.values(), key=len)  # one task's batches: one a step (a bundle's seeds share steps)
    steps: list[float] = []
    evals: list[float] = []
    for i, t in enumerate(starts):
        nxt = starts[i + 1] if i + 1 < len(starts) else None
        v = next((x for x in val if x > t and (nxt is None or x < nxt)), None)
        if v is not None:
            stop = nxt if nxt is not None else next((r for r in reports if r > v), end)
            evals.append(stop - v)
        finish = v if v is not None else nxt
        if finish is not None:
            steps.append(finish - t)
    if len(steps) < warm + 1:
        raise RuntimeError(f"only {len(steps)} step(s) after {warm} warm-up(s); a calibration needs more")
    warmups, timed = steps[:warm], steps[warm:]
    first = min(t for ts in train.values() for t in ts)
    return {
        "step_seconds": timed,
        "eval_seconds": statistics.fmean(evals) if evals else None,
        "setup_seconds": first - begin + max(0.0, sum(warmups) - warm * statistics.median(timed)),
        "finish_seconds": max(0.0, end - (reports[-1] if reports else end)),
    }


# ----- in the driver -------------------------------------------------------------------------------


def where_trials_run(
    executor: Executor,
    settings: Settings,
    cpus: float,
    gpus: float,
    start: bool = True,
    cancel: threading.Event | None = None,
    timeout: float = TIMEOUT,
) -> tuple[str, int]:
    """(the node type a study's trials run on, how many of its units fit on the cluster at once).
    An embedded Ray is this machine (nothing starts); a cluster is asked with a small task of a unit's
    resources (`Executor.run_tasks`), after joining it when `start` (else a cluster not joined yet is
    an error), within `timeout` or until `cancel` is set (the study's: cancelled, or its server
    stopping)."""
    if embedded(settings):
        why = unplaceable_here(settings, {"cpu": cpus, "gpu": gpus})
        if why is not None:  # its calibration would wait for a slot that never comes
            raise RuntimeError(why)
        have_cpus, have_gpus = embedded_resources(settings)
        capacity = int(have_cpus // max(cpus, 1e-9))
        if gpus > 0:
            capacity = min(capacity, int(have_gpus // gpus))
        return node_type(gpus > 0), capacity
    total = executor.resources()
    if total is None:
        if not start:
            raise RuntimeError("Ray is not up yet: a cluster's node type is asked of the cluster")
        executor.start()
        total = executor.resources() or {}
    capacity = int(total.get("cpu", 0) // max(cpus, 1e-9))
    if gpus > 0:
        capacity = min(capacity, int(total.get("gpu", 0) // gpus))
    if capacity < 1:
        raise RuntimeError(
            f"no node of the Ray cluster offers a unit's resources (cpus={cpus:g}, gpus={gpus:g}; the "
            f"cluster has {total.get('cpu', 0):g} CPUs and {total.get('gpu', 0):g} GPUs)"
        )
    (answer,) = executor.run_tasks(
        [Task(node_type, (gpus > 0,))], {"cpu": cpus, "gpu": gpus}, 1, timeout, cancel
    )
    if answer is not None:
        if answer.error is not None:
            raise answer.error
        return str(answer.value), capacity
    raise TimeoutError(
        "stopped: the study was cancelled, or its server stopped"
        if cancel is not None and cancel.is_set()
        else f"no node answered within {timeout:g} s: the cluster's slots are busy (other studies?) or "
        "no node offers the study's resources; plan again when a slot is free"
    )


def run_calibrations(
    executor: Executor,
    probes: Sequence[Probe],
    cpus: float,
    gpus: float,
    slots: int,
    timeout: float = TIMEOUT,
    cancel: threading.Event | None = None,
) -> dict[str, dict[str, Any]]:
    """Each probe calibrated as a task with a unit's resources (`Executor.run_tasks`), at most `slots`
    at once (as the study would run); key → the calibration (its `error` when it failed, did not
    finish in time, or was stopped by `cancel`: the study's, cancelled or its server stopping)."""
    from trainers.numerics import environment as numerics_environment

    # a worker process computes with one numerics mode: each mode's probes get workers of their own
    tasks = [
        Task(calibrate, (probe, gpus > 0), numerics_environment(probe.members[0].config.numerics))
        for probe in probes
    ]
    results = executor.run_tasks(tasks, {"cpu": cpus, "gpu": gpus}, slots, timeout, cancel)
    out: dict[str, dict[str, Any]] = {}
    for probe, result in zip(probes, results, strict=True):
        if result is None:
            out[probe.key] = {
                "error": "stopped: the study was cancelled, or its server stopped"
                if cancel is not None and cancel.is_set()
                else f"no result within {timeout:g} s: the cluster's slots are busy (other studies?) or no "
                "node offers the study's resources; plan again when a slot is free"
            }
        elif result.error is not None:  # the task itself died (out of memory, a lost node)
            exc = result.error
            out[probe.key] = {"error": f"the calibration task failed: {type(exc).__name__}: {exc}"[:2000]}
        else:
            out[probe.key] = result.value
    return out


Calibrate = Callable[[Sequence[Probe]], dict[str, dict[str, Any]]]
