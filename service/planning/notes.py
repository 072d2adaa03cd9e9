"""What a plan says beside its figures (`StudyPlan.notes`): of the study's spec and its space, of the
ledger's trials (training in another study, finished under other code), and of asha.
`service.planning.plan` makes the plan and adds them, with its own notes of its calibrations and of a
GPU the study leaves idle (`idle_gpu_note`, which plans the study again on one).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from search_spaces import SearchSpace, dim_to_dict, get_preset
from service.core.spec import DEFAULT_MODEL, StudySpec
from service.core.trial import TrialSpec, Unit, seeded_point_key
from service.core.values import repr_value
from service.planning.estimate import Schedules
from service.store.ledger import Ledger
from service.store.models import Trial
from service.study.elsewhere import trained_elsewhere
from service.study.other_code import hash_today, other_code
from trainers.config import EXECUTION_FIELDS, TrainConfig


def elsewhere_notes(
    ledger: Ledger, spec: StudySpec, study_id: str | None, todo: Sequence[TrialSpec]
) -> list[str]:
    """The trials to run that another running study trains now (`service.study.elsewhere`): the run
    waits for them and takes their results (the plan counted them among its units, to train). An asha
    study waits for none (a point's seeds train and are judged together): nothing to say. `study_id`
    None: a spec not created yet."""
    hashes = [t.config_hash for t in todo]
    if not hashes or spec.scheduler == "asha":
        return []
    mine = ledger.statuses(study_id, hashes) if study_id else dict.fromkeys(hashes, "pending")
    waits = trained_elsewhere(mine, ledger.holders(study_id or "", hashes))
    counts: dict[str, int] = defaultdict(int)
    for holder in waits.values():
        counts[holder] += 1
    return [
        f"{n} of the trials to run {'is' if n == 1 else 'are'} training now in study {holder}: this study "
        "waits for them and takes their results, training them itself only if that study stops first (they "
        "are counted above as if trained here)"
        for holder, n in sorted(counts.items())
    ]


def other_code_notes(ledger: Ledger, todo: Sequence[TrialSpec]) -> list[str]:
    """The trials to run that this ledger holds finished under other code: a done trial of the same
    model and point whose stored config resolves today to the trial's hash, under another stored hash (a
    TRAINER_VERSION since, or a plugin's code edited). It is not reused, as its numbers are another
    code's; a grid that trains again what a user ran before now says why (it said only how many)."""
    wanted = {seeded_point_key(t.model, t.params): t.config_hash for t in todo}
    if not wanted:
        return []
    found: dict[str, Trial] = {}  # the trial's hash today → one row made under other code
    for row in ledger.done_of_models(sorted({t.model for t in todo})):
        want = wanted.get(seeded_point_key(row.model, row.params))
        if want is None or want in found or row.config_hash == want:
            continue
        try:
            today = hash_today(row.config)
        except Exception:  # an old config this code cannot read at all: not the trial to run
            continue
        if today == want:
            found[want] = row
    if not found:
        return []
    rows = list(found.values())
    causes, _ = other_code(rows, len(rows))
    studies = sorted({r.study_id for r in rows})
    n = len(rows)
    return [
        f"{n} of the trials to run {'was' if n == 1 else 'were'} finished in this ledger under other code "
        f"(study {', '.join(studies[:3])}{', …' if len(studies) > 3 else ''}): {'; '.join(causes)}. "
        f"{'It trains' if n == 1 else 'They train'} again, as {'its' if n == 1 else 'their'} results there "
        "are that code's numbers (CHANGELOG.md says what each TRAINER_VERSION moved); the old results stay "
        "in their studies"
    ]


def discrete_space_notes(spec: StudySpec, space: SearchSpace) -> list[str]:
    """A sampler's budget over a space of lists with fewer points: a point drawn again trains once, so
    the study ends with fewer trials than the plan's (it promised them, and the study ended `done`
    short of them without a word)."""
    if spec.sampler == "grid" or not space.is_grid:
        return []
    points, seeds = sum(m.grid_points() for m in space.models), len(space.seeds)
    budget = math.ceil((spec.max_trials or 0) / seeds)
    if budget <= points:
        return []
    return [
        f"sampled: the space holds {points} points ({points * seeds} trials with the seeds), fewer than the "
        f"{budget} points max_trials asks: a point drawn again trains once, so the study ends with at most "
        f"{points * seeds} trials (a grid runs them all: sampler grid)"
    ]


#: a trial's settings an added cell's arm is never told about: its identity, and how it runs
NOT_ARM_SETTINGS = {"cell", "task", "seed", "numerics", "task_params", "cell_params", *EXECUTION_FIELDS}


def spec_notes(spec: StudySpec, space: SearchSpace) -> list[str]:
    """What a plan says of the study's spec and its space, before the ledger's notes: a sampled space
    smaller than its budget, an added cell's defaults, a cell's setting that reaches some models only."""
    return discrete_space_notes(spec, space) + added_cell_notes(spec, space) + cell_setting_notes(spec, space)


def cell_setting_notes(spec: StudySpec, space: SearchSpace) -> list[str]:
    """A cell's own setting given in base reaches the models whose cell takes it, and no other
    (`service.core.space_build.cell_settings_per_model`), and so does a dimension over one
    (`service.core.space_build.cell_dims_per_model`): where some of the study's models take it and some do
    not (`--set initial_state=zero` or `--dim initial_state=uniform,zero` over srnn2020's urnn and srnn),
    which, so that it is not read as set, or swept, for all."""
    from trainers.cells import CELLS
    from trainers.params import field_names

    notes = []
    default = space.base.get("cell", TrainConfig.cell)
    cells = {m.name: str(m.fixed.get("cell", default)) for m in space.models}
    fields = {c: set(field_names(CELLS.get(c).Config)) for c in set(cells.values()) if c in CELLS}
    for key in spec.dims:
        name = key.removeprefix("cell.")  # also written `cell.x`
        took = [m.name for m in space.models if key in m.dims]
        left = [
            m.name
            for m in space.models
            if "cell" not in m.dims and cells[m.name] in fields and name not in fields[cells[m.name]]
        ]
        if took and left and any(name in f for f in fields.values()):
            notes.append(
                f"{key} (dims) is a setting of a cell: it spans {', '.join(took)}; the cells of "
                f"{', '.join(left)} have no {key}, and train once at each of their points"
            )
    for key, value in spec.base.items():
        if key in space.base:  # every trial's setting, not moved into the models
            continue
        took = [m.name for m in space.models if key in m.fixed or key in m.dims]
        left = [m.name for m in space.models if m.name not in took]
        if took and left:
            notes.append(
                f"{key} = {repr_value(value)} (base) is a setting of a cell: it reaches {', '.join(took)}; the "
                f"cells of {', '.join(left)} have no {key}, and train without it"
            )
    return notes


def added_cell_notes(spec: StudySpec, space: SearchSpace) -> list[str]:
    """A cell added beside a preset's models (`service.core.space_build.cell_arms`) takes memsweep's default
    for a trial or task setting that the preset's models each fix for themselves (nru2019-copy100's
    `hidden`: 80 to 143; the arm's 100), and `--set` is refused there: which, their values, and how to set
    it."""
    if spec.preset is None:
        return []
    from trainers.tasks import TASKS

    theirs = {m.name for m in get_preset(spec.preset).models}
    own = (set(spec.space.models) | ({DEFAULT_MODEL} if spec.space.dims else set())) if spec.space else set()
    # the study's models of the preset (all of them where it keeps none)
    ours = [m for m in space.models if m.name in theirs] or list(get_preset(spec.preset).models)
    notes = []
    for arm in space.models:
        if arm.name in theirs or arm.name in own:
            continue
        task = str(arm.fixed.get("task", space.base.get("task", TrainConfig.task)))
        defaults = {k: (v, "memsweep's default") for k, v in _defaults(TrainConfig).items()}
        if task in TASKS:
            defaults |= {
                k: (v, f"task {task}'s default") for k, v in _defaults(TASKS.get(task).Config).items()
            }
        left = {  # setting → the value each of the study's preset models fixes
            key: used
            for key in defaults
            if key not in NOT_ARM_SETTINGS and key not in space.base and key not in {**arm.fixed, **arm.dims}
            and (used := {m.name: m.fixed[key] for m in ours if key in m.fixed})
        }  # fmt: skip
        if not left:
            continue
        model: dict[str, Any] = {"fixed": {**arm.fixed, **dict.fromkeys(left, "VALUE")}}
        if arm.dims:  # a space's model spans only the dimensions it names
            model["dims"] = {k: _dimension(d) for k, d in arm.dims.items()}
        said = "; ".join(
            f"{key} {repr_value(defaults[key][0])} ({defaults[key][1]}; "
            f"{', '.join(f'{m} {repr_value(v)}' for m, v in used.items())})"
            for key, used in left.items()
        )
        it = "it" if len(left) == 1 else "them"
        notes.append(
            f"{arm.name}, a cell added beside preset {spec.preset}'s models, takes the default where those "
            f"models each fix their own: {said}. --set cannot change {it} (a preset's model fixes {it}); in a spec "
            f"file, make {arm.name} a model of a `space` beside the preset: space: {{models: {{{arm.name}: "
            f"{_flow(model)}}}}} with models: [{', '.join(m.name for m in space.models)}]"
            + (", with the dimensions the arm spans now" if arm.dims else "")
        )
    return notes


def _defaults(config: type) -> dict[str, Any]:
    """A config dataclass's fields → their defaults."""
    return {
        f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(config)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }


def _dimension(dim: Any) -> Any:
    """A dimension as a spec writes it: a list of values, else its range (`dim_to_dict`)."""
    written = dim_to_dict(dim)
    return written.get("values", written)


def _flow(value: Any) -> str:
    """`value` in YAML's flow style, as a spec writes it."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return repr_value(value)


def asha_notes(spec: StudySpec, units: Sequence[Unit], schedules: Schedules) -> list[str]:
    """What asha will do with these units: the evaluations after which it may stop a point (its rungs
    before a trial's last evaluation), or that it can stop none; the estimate's assumption."""
    notes = []
    course = schedules.of(units[0].members[0]) if units else None
    if course is not None:
        evaluations = course[1]
        g, rf = spec.asha.grace_period, spec.asha.reduction_factor
        rungs: list[int] = []
        k = 0
        while (at := math.ceil(g * rf**k)) < evaluations:
            rungs += [at] if at not in rungs else []  # a fractional factor: one decision per evaluation
            k += 1
        notes.append(
            f"asha: a point may be stopped after {', '.join(map(str, rungs))} of its {evaluations} evaluations "
            f"(grace_period {g}, reduction_factor {rf:g}: each rung keeps the best 1/{rf:g} so far)"
            if rungs
            else f"asha: grace_period {g} is not before a trial's last evaluation ({evaluations}): it stops "
            f"nothing early; lower grace_period, or evaluate more often (eval_every)"
        )
    notes.append("asha: the estimate trains every point to its end; the points asha stops cost less")
    lockstep = sum(1 for u in units if u.lockstep)
    if lockstep:
        notes.append(
            f"asha: {lockstep} point{'s' * (lockstep > 1)} of {len(units)} cannot train fused: their seeds train in "
            "lockstep, one after the other to each evaluation in one process (each as it trains alone)"
        )
    if spec.bundle_size is not None:
        notes.append("bundle_size does not apply under asha: a unit is one point's seeds")
    models = sorted({m.model for u in units for m in u.members})
    if len(models) > 1:  # each rung ranks every point, whatever its model: early arrivals are judged on less
        notes.append(
            f"asha: the points of {', '.join(models)} are ranked together at each rung, first come first "
            "judged: a model whose points reach a rung later (units run in model order; an added cell's "
            "last) is held to the others' rung, and one whose loss starts higher is stopped more. To compare "
            "models, run a study per model (or fifo), then `memsweep compare` (docs/studies.md, asha)"
        )
    return notes
