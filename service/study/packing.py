"""Packing a grid's pending trials into Ray units: fused bundles of same-shape trials (issue 7).

A *unit* is what one Ray trial runs (`service.study.worker.train_unit`); a bundle is a unit of K members
that `trainers.fused.train_fused` trains as one model. Members agree on `fusable_key` (task, cell,
hidden size, batch, budget, schedule …) and differ in what a paper grid varies: learning rate,
initialiser and its scale, seed. The cells that fuse (rnn, urnn, crnn, vprnn, fastrnn, sgornn, srnn)
are listed in `trainers.fused.FUSED_CELLS`; the others' trials run one per unit. Each member stays its own trial in the ledger, in MLflow and in
every REST answer, and its numbers are bit for bit those of its solo run (tests/trainers/test_fused.py),
so packing changes the speed of a study, never its results or its config hashes.

Bundle size, unless the spec fixes `bundle_size`: small enough that every concurrency slot gets a
bundle (a 2-slot study of 8 trials runs two bundles of 4, not one of 8 and an idle core) and that a
bundle's working memory — the recurrence's saved states for a training batch, its gradients and
the optimiser state — fits in its share of the memory of the device it trains on, as measured on a
node that runs the study's units (`service.study.nodes.unit_memory`); on the CPU also at most
`MAX_BUNDLE` (beyond it a bundle gains little per trial there: `benchmarks/fused.py`, figures in the
docs/speed.md), on a GPU as large as its memory allows (a bundle replaces kernel launches there).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from service.core.states import TrialStatus
from service.core.trial import PointKey, TrialSpec, Unit, point_key
from trainers.fused import fusable_key, member_bytes

if TYPE_CHECKING:
    from service.core.spec import StudySpec
    from service.store.models import Trial

#: members per bundle at most when the spec does not say (see the module docstring)
MAX_BUNDLE = 32
#: share of the memory a bundle may plan to use, of what the device has per concurrency slot
MEMORY_SHARE = 0.5
#: a GPU's memory when the driver cannot ask the worker's device (a Ray cluster's GPUs are remote)
ASSUMED_GPU_BYTES = 16 * 2**30


def unit_share(free_bytes: int, units_at_once: float) -> int:
    """Bytes one unit may plan to use: `MEMORY_SHARE` of the device's free memory, split among the
    units that train on it at once (a node's CPUs / a unit's CPUs; 1 / a unit's GPU fraction)."""
    return int(MEMORY_SHARE * free_bytes / max(units_at_once, 1.0))


def memory_per_slot(device: str, slots: int, gpus_per_unit: float) -> int:
    """Bytes a unit may plan to use when no node was asked (`unit_share` of this machine's memory,
    or of an assumed GPU's)."""
    if device == "cuda":
        return unit_share(ASSUMED_GPU_BYTES, 1.0 / gpus_per_unit if gpus_per_unit > 0 else 1.0)
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # not on Linux: assume a modest machine
        available = 4 * 2**30
    return unit_share(available, slots)


def bundle_size(n: int, slots: int, per_member: int, memory: int, cap: int | None = MAX_BUNDLE) -> int:
    """Members per bundle for a group of n fusable trials: every slot a bundle, within the memory,
    at most `cap` (None: no cap, a GPU's)."""
    by_slots = math.ceil(n / max(slots, 1))
    by_memory = max(1, memory // max(per_member, 1))
    return max(1, min(cap or by_slots, by_slots, by_memory))


def pack(
    trials: Sequence[TrialSpec],
    *,
    fused: bool,
    slots: int,
    size: int | None = None,
    device: str = "cpu",
    gpus_per_unit: float = 0.0,
    memory: int | None = None,
) -> list[Unit]:
    """The trials as units: fusable trials in bundles, the rest one per unit; every trial exactly once.
    `memory`: the bytes a unit may use, measured where it trains (default: `memory_per_slot`).

    The size comes from the whole fusable group; bundles are then cut per initialiser (the
    orthogonal initialiser's W has another memory layout and would train as its own sub-bundle,
    one after the other), with neighbouring grid points together, in parts as equal as the size
    allows (`even_parts`)."""
    if not fused or size == 1:
        return [Unit((t,)) for t in trials]
    groups: dict[Any, list[TrialSpec]] = {}
    singles: list[Unit] = []
    for trial in trials:
        key = fusable_key(trial.resolved)
        if key is None:
            singles.append(Unit((trial,)))
        else:
            groups.setdefault(key, []).append(trial)
    units: list[Unit] = []
    memory = memory if memory is not None else memory_per_slot(device, slots, gpus_per_unit)
    cap = MAX_BUNDLE if device == "cpu" else None
    for members in groups.values():
        k = size or bundle_size(len(members), slots, member_bytes(members[0].resolved), memory, cap)
        by_init: dict[str, list[TrialSpec]] = {}
        for trial in sorted(members, key=lambda t: _grid_order(t.params)):
            by_init.setdefault(str(trial.resolved.config.cell_params.get("init")), []).append(trial)
        for same_init in by_init.values():
            units += [Unit(tuple(part), fused=True) for part in even_parts(same_init, k)]
    return units + singles


def even_parts(items: Sequence[TrialSpec], k: int) -> list[Sequence[TrialSpec]]:
    """`items` in consecutive parts of at most k, as few as that allows and as equal as they can be:
    594 points at k = 315 are two bundles of 297, not 315 and 279 (a straggler's members cost more
    each: on an H100 a bundle of 8 takes 2.3 ms a member-step, one of 462 0.25, docs/gpu.md)."""
    n = len(items)
    if n == 0:
        return []
    parts = math.ceil(n / max(k, 1))
    base, extra = divmod(n, parts)
    out, start = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        out.append(items[start : start + size])
        start += size
    return out


def pack_study(
    spec: StudySpec, trials: Sequence[TrialSpec], measured: tuple[str, int] | None = None
) -> list[Unit]:
    """A grid study's trials as its run packs them: one unit per point under asha (`by_point`), else
    the spec's fusing, concurrency, bundle size and device; `measured`: (device kind, bytes a unit may use) on a node that would run it
    (`service.study.nodes.unit_memory`). The engine and a study's plan both pack through here."""
    if spec.scheduler == "asha":
        return by_point(trials, fused=spec.fuses)
    device = measured[0] if measured else ("cuda" if spec.resources.gpus > 0 else "cpu")
    return pack(
        trials, fused=spec.fuses, slots=spec.concurrency, size=spec.bundle_size, device=device,
        gpus_per_unit=spec.resources.gpus, memory=measured[1] if measured else None,
    )  # fmt: skip


def by_point(trials: Sequence[TrialSpec], *, fused: bool) -> list[Unit]:
    """The trials as one unit per point (model and values, every seed), fused where they share
    `fusable_key`: what an early-stopping scheduler judges and stops as one (asha)."""
    points: dict[PointKey, list[TrialSpec]] = {}
    for t in trials:
        points.setdefault(point_key(t.model, t.params), []).append(t)
    return [bundle(members, fused=fused, lockstep=True) for members in points.values()]


def stopped_points(rows: Iterable[Trial]) -> set[PointKey]:
    """The points a scheduler stopped early (asha): those of the rows' pruned trials. Seeds added to
    such a point later are pruned with it, untrained (`Engine`), and a plan does not count them."""
    return {point_key(r.model, r.params) for r in rows if r.status == TrialStatus.PRUNED}


def bundle(trials: Sequence[TrialSpec], *, fused: bool, lockstep: bool = False) -> Unit:
    """The trials as one unit, fused when fusing is on and they share `fusable_key` (a sampled
    point's seeds); else in `lockstep` when a scheduler judges them together (asha), else one after
    another."""
    keys = {fusable_key(t.resolved) for t in trials}
    together = fused and len(trials) > 1 and len(keys) == 1 and None not in keys
    return Unit(tuple(trials), fused=together, lockstep=lockstep and not together and len(trials) > 1)


def _grid_order(params: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The order bundles are cut in (neighbouring grid points together), not a point's identity
    (`point_key`)."""
    return tuple(sorted((k, repr(v)) for k, v in params.items()))
