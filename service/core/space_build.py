"""A spec's space against the trainers' registries: the settings its trials take, a preset's task or cell
changed, the cells added beside a preset's models (arms), each model's settings of its own cell.

`StudySpec.search_space` (`service.core.spec`) assembles its space with these. The registries
(`trainers.cells`, `trainers.tasks`: torch) are imported inside them, so a stored spec is read and judged
without torch (the CLI's reads of its ledger).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Collection, Mapping
from typing import Any

from search_spaces import PRESETS, Model, SearchSpace, SpaceError, Values, dim_from_dict
from search_spaces.space import did_you_mean
from trainers.config import TOP_FIELDS, TrainConfig
from trainers.params import ConfigError, coerce, field_names
from trainers.registry import PluginError, Registry, UnknownNameError


def check_trial_values(base: Mapping[str, Any]) -> None:
    """Refuse a trial field of `base` whose value the field cannot take (`--set optimizer=adamw`), naming the
    values it can: before a preset's model that fixes the field is blamed for overriding it ("model 'nru'
    fixes optimizer …", which never said the name was wrong)."""
    hints = _trial_field_types()
    for key, value in base.items():
        if key in hints:
            try:
                coerce(value, hints[key], f"base.{key}")
            except ConfigError as exc:
                raise SpaceError(str(exc)) from None


@functools.cache
def _trial_field_types() -> dict[str, Any]:
    """A trial's own fields (not its task's or cell's) → their declared types."""
    hints = typing.get_type_hints(TrainConfig)  # the task and cell are names, refused by their registries
    return {k: hints[k] for k in TOP_FIELDS if k not in ("task", "cell", "task_params", "cell_params")}


def cell_arms(preset: SearchSpace, names: list[str], dims: Mapping[str, Any] | None = None) -> list[Model]:
    """An arm for each name in `names` that is no model of the preset but a registered cell: the cell on the
    preset's protocol, spanning the dimensions every model of the preset shares with the same values (Orhan
    & Pitkow's learning rates; not their initialisers' scales) and the cell's own `grid`; and those of the
    study's `dims` that are settings of its cell and no dimension of the preset (AntisymmetricRNN's γ
    swept beside its grid's ε: refused before, "not a dimension of space")."""
    from trainers.cells import CELLS

    have = {m.name for m in preset.models}
    shared = {
        k: d
        for k, d in preset.models[0].dims.items()
        if all(m.dims.get(k) == d for m in preset.models) and k not in CELL_CHOICE_FIELDS
    }
    arms = []
    for name in dict.fromkeys(names):
        if name in have:
            continue
        try:
            cell = CELLS.get(name)
        except UnknownNameError as exc:  # unknown, or a plugin that could not join: the registry says which
            # a typo of one of the preset's models is as likely as a cell's: the nearest of either
            why = exc if isinstance(exc, PluginError) else CELLS.unknown(name, also=have)
            raise SpaceError(
                f"models: {name!r} is no model of preset {preset.name!r} ({', '.join(sorted(have))}) and {why}"
            ) from None
        own: dict[str, Any] = {k: Values(tuple(v)) for k, v in cell.grid.items()}
        preset_dims = {k for m in preset.models for k in m.dims}
        for key, value in (dims or {}).items():
            if key not in preset_dims and key not in own and key in field_names(cell.Config):
                own[key] = dim_from_dict(value, f"dims.{key}")
        arms.append(Model(name, {"cell": name}, {**shared, **own}))
    return arms


def check_preset_choice(preset: SearchSpace, base: Mapping[str, Any], models: list[str] | None) -> None:
    """Refuse a study's `task` or `cell` (`base`, `--set task=addition`) over the one a preset fixes for its
    models, when the preset's settings of it are none of the new one's (the copy grid's `layout` on
    addition; Orhan's `nonlinearity` on lstm): said as the preset's, not as an unknown field the user never
    set. A cell beside the preset's models is an arm of its own (`models`)."""
    from trainers.cells import CELLS
    from trainers.tasks import TASKS

    registries: dict[str, Registry[Any]] = {"task": TASKS, "cell": CELLS}
    ours = [m.name for m in preset.models if models is None or m.name in models]
    for key, registry in registries.items():
        new, old = base.get(key), preset.base.get(key)
        if not ours or new == old or not isinstance(new, str) or not isinstance(old, str):
            continue  # (a name that is no text is refused naming it, where the trials are resolved)
        if new not in registry or old not in registry:
            continue  # (an unknown name is refused naming it, where the trials are resolved)
        fields = set(field_names(registry.get(str(new)).Config)) | set(TOP_FIELDS)
        own = field_names(registry.get(str(old)).Config)
        stranded = [k for k in preset.base if k in own and k not in fields and k not in base]
        if not stranded:
            continue
        why = (
            f"base.{key} = {new!r}: preset {preset.name!r} fixes {key} {old!r} for its models, with "
            f"{', '.join(f'{k} = {preset.base[k]!r}' for k in stranded)} ({old}'s settings, none of {new}'s)"
        )
        if key == "task":
            grids = [p.name for p in PRESETS.values() if p.base.get("task") == new]
            other = (
                f"run one of its presets, {', '.join(grids)} (`memsweep presets` lists them), or an explicit `space`"
                if grids
                else f"give an explicit `space` with base: {{task: {new}}} (no preset is a grid of {new})"
            )
            raise SpaceError(
                f"{why}; the task is the preset's: leave task out of base, and for task {new!r} {other}"
            )
        arms = list(dict.fromkeys([*(models or ours), str(new)]))
        raise SpaceError(
            f"{why}; the cell is the preset's: leave cell out of base, and to train {new} beside its models "
            f"on its protocol, add {new} as a model: models: [{', '.join(arms)}] (on the command line: "
            f"--models {','.join(arms)})"
        )


def trial_settings(space: SearchSpace) -> set[str] | None:
    """The settings a trial of `space` takes: a trial's, its tasks' and its models' cells' (also written
    `task.x`, `cell.x`); None when one of its tasks or cells is not registered (refused, naming it, where
    its trials are resolved)."""
    from trainers.cells import CELLS
    from trainers.tasks import TASKS

    names = set(TOP_FIELDS) - {"task_params", "cell_params"}
    for key, registry, default in (("task", TASKS, TrainConfig.task), ("cell", CELLS, TrainConfig.cell)):
        chosen: list[Any] = [m.fixed[key] for m in space.models if key in m.fixed]
        chosen += [v for m in space.models if isinstance(d := m.dims.get(key), Values) for v in d.values]
        if any(key not in m.fixed and key not in m.dims for m in space.models):  # theirs: the base's
            chosen.append(space.base.get(key, default))
        for name in chosen:
            if not (isinstance(name, str) and name in registry):
                return None
            own = field_names(registry.get(name).Config)
            names |= {*own, *(f"{key}.{n}" for n in own)}
    return names


#: fields that pick a preset model's cell or initialiser: never shared with an added cell's arm
CELL_CHOICE_FIELDS = ("cell", "init", "scale")


def cell_settings_per_model(
    space: SearchSpace,
    arms: Collection[str] = (),
    preset_own: Collection[str] = (),
    beside: Collection[str] = (),
    spanning: Collection[str] = (),
) -> SearchSpace:
    """A space whose models train different cells, with `base` settings of one cell's own fields moved into
    the models whose cell takes them; the `arms` (cells added beside a preset's models) take none of the
    `preset_own` settings (the preset's, for its own cell: Orhan's `nonlinearity`), so an arm's cell runs at
    its own defaults but for what the study sets; the models `beside` a preset's (a `space`'s) take those
    their cell takes. A space of one cell is returned as it is, unless its models are all arms or models
    beside (a preset's models left out: its own settings go with them, and reach only the cells that
    take them). `spanning`: the study's own `dims` over every model (`cell_dims_per_model`)."""
    from trainers.cells import CELLS
    from trainers.tasks import TASKS

    default = str(space.base.get("cell", TrainConfig.cell))
    cells = {m.name: str(m.fixed.get("cell", default)) for m in space.models}
    added = {*arms, *beside}
    only_added = bool(added) and all(m.name in added for m in space.models)
    if any("cell" in m.dims for m in space.models):
        return space
    general = set(TOP_FIELDS)
    tasks = {space.base.get("task", TrainConfig.task), *(m.fixed.get("task") for m in space.models)}
    tasks |= {v for m in space.models if isinstance(d := m.dims.get("task"), Values) for v in d.values}
    for task in tasks:
        if isinstance(task, str) and task in TASKS:
            general |= set(field_names(TASKS.get(task).Config))
    fields = {c: set(field_names(CELLS.get(c).Config)) if c in CELLS else set() for c in set(cells.values())}
    if all(
        isinstance(t, str) and t in TASKS for t in tasks if t is not None
    ):  # else refused, naming it, at resolve
        space = cell_dims_per_model(space, cells, general, fields, spanning)
    if len(set(cells.values())) < 2 and not only_added:
        return space
    cell_only = [k for k in space.base if k not in general]
    if not cell_only:
        return space
    taken = set().union(*fields.values())
    unknown = [k for k in cell_only if k not in taken and k not in preset_own]
    if unknown:  # a typo: before, it was dropped without a word (no model's cell takes it)
        trial = general - {"task_params", "cell_params"}  # (where a task's and a cell's settings are held)
        near = did_you_mean(unknown[0], trial | taken)
        raise SpaceError(
            f"base.{unknown[0]} is a setting of none of this study's cells ({', '.join(sorted(fields))}), "
            f"nor of a trial or its task; {near + ' ' if near else ''}the trials' and their tasks' settings: "
            f"{', '.join(sorted(trial))}; the cells' settings: {', '.join(sorted(taken))}"
        )
    models = tuple(
        Model(
            m.name,
            {
                **{
                    k: space.base[k]
                    for k in cell_only
                    if k in fields[cells[m.name]] and not (m.name in arms and k in preset_own)
                },
                **m.fixed,
            },
            m.dims,
        )
        for m in space.models
    )
    base = {k: v for k, v in space.base.items() if k not in cell_only}
    return dataclasses.replace(space, models=models, base=base)


def cell_dims_per_model(
    space: SearchSpace,
    cells: Mapping[str, str],
    general: Collection[str],
    fields: Mapping[str, set[str]],
    spanning: Collection[str],
) -> SearchSpace:
    """A space whose models each vary only the cell settings their own cell takes: a dimension of the
    study's (`spanning`: its `dims`, over every model) of one cell's setting (`dims: {initial_state:
    [uniform, zero]}` over srnn2020's urnn and srnn) stays with the models whose cell takes it, and the
    others train once at each of their points (the plan says so: `service.planning.notes.cell_setting_notes`);
    refused when it then reaches none of them. A model's own dimension is its own, refused where its
    cell lacks it; and a key that is no registered cell's setting (a typo) is left to the resolution's
    refusal, which names the nearest field. `cells`: each model's cell; `general`: the trials' and their
    tasks' settings; `fields`: each registered cell's settings (a cell not registered here keeps its
    dimensions, refused where resolved)."""
    from trainers.cells import CELLS

    any_cell = {name for c in CELLS.names() for name in field_names(CELLS.get(c).Config)} - set(general)

    def setting(key: str) -> str | None:
        """The cell setting a dimension's key names (also written `cell.x`), or None."""
        scope, _, name = key.rpartition(".")  # (a task's, `task.x`, is no cell's)
        return name if scope in ("", "cell") and name in any_cell else None

    def lacks(model: Model, key: str) -> bool:
        cell, name = cells[model.name], setting(key)
        return name is not None and cell in CELLS and name not in fields[cell]

    keys = sorted(k for k in spanning if setting(k) is not None and any(lacks(m, k) for m in space.models))
    if not keys:
        return space
    for key in keys:
        carrying = [m for m in space.models if key in m.dims]
        if carrying and all(lacks(m, key) for m in carrying):
            name = setting(key)
            theirs = sorted(c for c in CELLS.names() if name in field_names(CELLS.get(c).Config))
            study = sorted({cells[m.name] for m in carrying})
            raise SpaceError(
                f"dims.{key} is a setting of none of this study's cells ({', '.join(study)}): it is "
                f"{', '.join(theirs)}'s; choose a model that trains {'one of them' if len(theirs) > 1 else 'it'} "
                f"(`models`), or leave {key} out of dims"
            )
    models = tuple(
        dataclasses.replace(m, dims={k: d for k, d in m.dims.items() if k not in keys or not lacks(m, k)})
        for m in space.models
    )
    return dataclasses.replace(space, models=models)
