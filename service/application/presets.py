"""A paper's grid as the service answers it (`GET /presets/{name}`, `memsweep presets NAME`): the preset's
summary (`search_spaces.describe`) and each model's trainable parameters, counted on the models its points
build (the trainers', from the shapes alone: no data is read), so that a count can be held against the
paper's without writing the model's settings out by hand."""

from __future__ import annotations

import functools
import itertools
from typing import Any

from search_spaces import describe, get_preset
from search_spaces.space import Model, SearchSpace, Values

#: dimensions that can change a model's parameters beside its cell's own settings (the hidden size, the
#: copy task's embedding); any other dimension (a rate, a sequence length, a teacher's seed) is counted at
#: its first value
SHAPE_SETTINGS = frozenset({"hidden", "embed_dim"})


def preset_summary(name: str) -> dict[str, Any]:
    """`describe`'s summary of preset `name` (a sampled space's size: None)."""
    detail = describe(get_preset(name))
    detail.setdefault("size", None)
    detail.setdefault("size_per_model", None)
    return detail


@functools.cache
def preset_detail(name: str) -> dict[str, Any]:
    """`preset_summary`, each model with `param_counts`: the distinct numbers of trainable parameters over
    its points, ascending ([] where the trainers cannot build it from its settings alone: a task whose
    vocabulary comes from its data files)."""
    space = get_preset(name)
    detail = preset_summary(name)
    for model in space.models:
        detail["models"][model.name]["param_counts"] = param_counts(space, model)
    return detail


def param_counts(space: SearchSpace, model: Model) -> list[int]:
    """The distinct parameter counts of `model`'s points: its cell's settings and `SHAPE_SETTINGS` at each
    of their values, every other dimension at its first."""
    import trainers
    from trainers.cells import CELLS
    from trainers.model import build_model, count_params
    from trainers.params import field_names

    base = {**space.base, **model.fixed}
    cell = str(base.get("cell", trainers.TrainConfig.cell))
    shaping = SHAPE_SETTINGS | (set(field_names(CELLS.get(cell).Config)) if cell in CELLS else set())
    axes = {
        k: (d.values if k in shaping else d.values[:1])
        for k, d in model.dims.items()
        if isinstance(d, Values)
    }
    counts = set()
    for values in itertools.product(*axes.values()):
        settings = {**base, **dict(zip(axes, values, strict=True))}
        try:
            cfg = trainers.TrainConfig(task=str(settings.pop("task")), cell=str(settings.pop("cell", cell)))
            resolved = trainers.resolve(trainers.apply_overrides(cfg, settings))
            counts.add(count_params(build_model(resolved, resolved.make_task())))
        except (FileNotFoundError, OSError):  # its shapes come from its data files (PTB's vocabulary)
            return []
    return sorted(counts)
