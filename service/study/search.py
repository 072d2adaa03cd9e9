"""The search adapter: a study's space → its trials, and the Optuna samplers that pick points of it.

One function makes trials from a point of a model (`point_trials`): the grid's enumeration
(`grid_trials`), the check of a space before a study is created (`check_space`) and the sampled
points of a model-based search (`service.study.ray_tune.UnitSearcher`) all go through it, so a trial's
settings are layered one way everywhere: the space's `base`, then the model's `fixed` fields, then
the point's values, then the study's execution settings (threads), then the seed.

The samplers are Optuna's, driven by Ray Tune's `OptunaSearch` over a define-by-run space (the
model when there are several, then that model's dimensions), warm-started with a study's finished
points. The searcher sees one objective per point: the mean over seeds of final loss / baseline.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import trainers
from search_spaces import Model, SearchSpace, Uniform, Values
from service.core.spec import DEFAULT_MODEL, StudyError, StudySpec
from service.core.trial import TrialSpec, objective

if TYPE_CHECKING:
    from service.store.models import Trial


def materialize(settings: Mapping[str, Any]) -> trainers.Resolved:
    """Flat trial settings (task, cell, seed and any field) → a resolved, validated trial config."""
    settings = dict(settings)
    base = trainers.TrainConfig(task=str(settings.pop("task", "copy")), cell=str(settings.pop("cell", "rnn")))
    return trainers.resolve(trainers.apply_overrides(base, settings))


def execution(spec: StudySpec) -> dict[str, Any]:
    """The study's execution settings of every trial (not part of a trial's identity)."""
    return {"threads": max(1, int(spec.resources.cpus))}


#: the fields that make an arm of a study (a model) when a space's single unnamed model varies them
ARM_FIELDS = ("cell", "init")


def arm(model: Model, point: Mapping[str, Any]) -> str:
    """The model a trial belongs to: the space's model, or — for the one unnamed model of a
    `space: {dims: …}` shorthand — the cell and initialiser it varies (so a sampled study that draws
    `init` keeps chain and orthogonal apart in its success table)."""
    if model.name != DEFAULT_MODEL:
        return model.name
    parts = [str(point[k]) for k in ARM_FIELDS if k in model.dims and k in point]
    return "-".join(parts) or model.name


def point_trials(
    space: SearchSpace, model: Model, point: Mapping[str, Any], settings: Mapping[str, Any]
) -> list[TrialSpec]:
    """The trials of one point of `model` (its dimensions' values): one per seed of the space."""
    varied = {k: point[k] for k in model.dims}
    trials = []
    for seed in space.seeds:
        resolved = materialize({**space.base, **model.fixed, **point, **settings, "seed": seed})
        trials.append(TrialSpec.of(arm(model, point), {**varied, "seed": seed}, resolved))
    return trials


def grid_trials(space: SearchSpace, settings: Mapping[str, Any]) -> list[TrialSpec]:
    """Every grid point × seed of the space, in order (models, then points, then seeds), each
    resolved and checked (`check_trials`): a grid a study accepts is one the trainers will run."""
    trials = [
        t
        for model in space.models
        for point in model.grid()
        for t in point_trials(space, model, point, settings)
    ]
    check_trials(trials)
    return trials


def first_point(model: Model) -> dict[str, Any]:
    """A model's first setting: each dimension's first value, or the low end of its range."""
    return {k: d.values[0] if isinstance(d, Values) else d.low for k, d in model.dims.items()}


def check_space(space: SearchSpace) -> None:
    """Every value a sampler may draw must make a trial the trainers accept: each model's first
    point, then each value of each dimension (both ends of a range) with the other dimensions at
    their first value — names, types, ranges, and what the task itself checks (`check_trials`).
    With the first seed only: a seed changes no setting, and the work stays the dimensions' lengths
    summed (a grid's size is checked before, from their product)."""
    space = replace(space, seeds=space.seeds[:1])
    for model in space.models:
        first = first_point(model)
        points = [first]
        for key, dim in model.dims.items():
            ends = dim.values[1:] if isinstance(dim, Values) else (dim.high,)
            points += [{**first, key: value} for value in ends]
        for point in points:
            try:
                check_trials(point_trials(space, model, point, {}))
            except (ValueError, KeyError) as exc:
                where = ", ".join(f"{k}={v!r}" for k, v in point.items() if k in model.dims)
                raise StudyError(
                    f"model {model.name!r}" + (f" at {where}" if where else "") + f": {exc}"
                ) from None


def study_space(spec: StudySpec, max_grid_size: int) -> SearchSpace:
    """The study's space, checked as a created study's is: a grid's size first (the product of its
    dimensions' lengths, nothing made), at most `max_grid_size` trials (or the spec's `max_trials`),
    then every model's first point resolved (`check_space`). The run and the plan both start here."""
    try:
        space = spec.search_space()
    except (ValueError, KeyError) as exc:
        raise StudyError(str(exc)) from None
    if spec.sampler == "grid":
        if not space.is_grid:
            raise StudyError(
                "sampler 'grid' needs lists of values in every dimension; use tpe/random/qmc for ranges"
            )
        size = space.size()
        limit = min(max_grid_size, spec.max_trials or max_grid_size)
        if size > limit:
            raise StudyError(
                f"the grid holds {size} trials (points × seeds), over the limit of {limit}; "
                "choose fewer models, values or seeds (or raise max_trials / MEMSWEEP_MAX_GRID_SIZE)"
            )
    check_execution(spec, space)
    check_space(space)
    return space


def check_execution(spec: StudySpec, space: SearchSpace) -> None:
    """The settings of where a trial runs that its study's `resources` decide, refused when the spec
    sets them otherwise (issue 35): a trial's `threads` are its unit's CPUs (`execution`), and a GPU
    `device` needs GPUs the unit asks for (Ray hides every GPU from a unit that asks none, and shows
    a unit ceil(gpus) of them, as cuda:0, cuda:1, …)."""
    places: list[tuple[str, Mapping[str, Any]]] = [("base", space.base)]
    for model in space.models:
        places += [(f"model {model.name!r}", model.fixed), (f"model {model.name!r} dims", model.dims)]
    cpus, gpus = execution(spec)["threads"], spec.resources.gpus
    for where, settings in places:
        for name in ("threads", "device"):
            if name not in settings:
                continue
            value = settings[name]
            values = value.values if isinstance(value, Values) else [value]
            for v in values:
                if name == "threads" and v != cpus:
                    raise StudyError(
                        f"{where}: threads = {v!r}, but a trial's threads are its unit's CPUs "
                        f"(resources.cpus, {cpus} here): set `resources: {{cpus: {v}}}` for {v} threads a trial, "
                        "and leave threads out"
                    )
                if name == "device" and str(v).startswith("cuda"):
                    seen = math.ceil(gpus)
                    suffix = str(v).partition(":")[2]
                    index = int(suffix) if suffix.isdigit() else 0
                    if seen == 0:
                        raise StudyError(
                            f"{where}: device = {v!r} needs a GPU, but the study's units ask none "
                            "(resources.gpus = 0), and Ray hides every GPU from a unit that asks none: set "
                            "`resources: {gpus: 1}` (or a fraction, e.g. 0.5) to train on a GPU, or device "
                            "`auto` (the GPU when the unit has one, else the CPU)"
                        )
                    if index >= seen:
                        raise StudyError(
                            f"{where}: device = {v!r}, but a unit asking resources.gpus = {gpus:g} sees "
                            f"{seen} GPU(s), cuda:0{f' to cuda:{seen - 1}' if seen > 1 else ''}: use "
                            "device `cuda` (or `auto`), or ask for more GPUs"
                        )


def study_trials(spec: StudySpec, space: SearchSpace) -> list[TrialSpec]:
    """A grid's trials, resolved (a sampled study adds its trials as their points are drawn)."""
    return grid_trials(space, execution(spec)) if spec.sampler == "grid" else []


def check_trials(trials: Iterable[TrialSpec]) -> None:
    """What resolving cannot see: each distinct task config is built once (its own checks, e.g. a
    copy sequence too short for its layout; no data is read)."""
    seen = set()
    for t in trials:
        key = (t.resolved.config.task, repr(sorted(t.resolved.config.task_params.items())))
        if key not in seen:
            seen.add(key)
            t.resolved.make_task()


# ----- model-based samplers ---------------------------------------------------------------------------


class DefineByRun:
    """Optuna define-by-run space: the model (when there are several), then that model's dimensions.
    A class, not a closure, because Tune pickles the searcher."""

    def __init__(self, models: Mapping[str, Model]) -> None:
        self.models = dict(models)

    def __call__(self, trial: Any) -> dict[str, Any]:
        names = list(self.models)
        name = trial.suggest_categorical("model", names) if len(names) > 1 else names[0]
        for key, dim in self.models[name].dims.items():
            pname = f"{name}.{key}"
            if isinstance(dim, Values):
                trial.suggest_categorical(pname, list(dim.values))
            elif isinstance(dim, Uniform):
                trial.suggest_float(pname, dim.low, dim.high, log=dim.log)
            else:
                trial.suggest_int(pname, dim.low, dim.high, log=dim.log)
        return {"model": name} if len(names) == 1 else {}


def suggested_point(config: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(model, its dimensions' values) of a point `DefineByRun` suggested."""
    model = str(config["model"])
    prefix = f"{model}."
    return model, {k[len(prefix) :]: v for k, v in config.items() if k.startswith(prefix)}


def optuna_search(spec: StudySpec, space: SearchSpace, finished: Iterable[Trial]) -> Any:
    """Ray Tune's OptunaSearch over the space with the spec's sampler, warm-started with the study's
    finished points (resume keeps what the searcher learned)."""
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    samplers: dict[str, Callable[[], Any]] = {
        "random": lambda: optuna.samplers.RandomSampler(seed=spec.sampler_seed),
        "tpe": lambda: optuna.samplers.TPESampler(seed=spec.sampler_seed),
        "cmaes": lambda: optuna.samplers.CmaEsSampler(
            seed=spec.sampler_seed, warn_independent_sampling=False
        ),
        "qmc": lambda: optuna.samplers.QMCSampler(seed=spec.sampler_seed, warn_independent_sampling=False),
    }
    models = {m.name: m for m in space.models}
    # warm start: one evaluated point per finished (model, params) with the seed-averaged objective
    points: dict[tuple[Any, ...], list[float]] = {}
    for t in finished:
        model = t.model if t.model in models else next(iter(models))  # an `arm` of the one unnamed model
        key = (model, tuple(sorted((k, v) for k, v in t.params.items() if k != "seed")))
        points.setdefault(key, []).append(objective(t.final_val_loss, t.baseline_loss, t.status))
    evaluated = [
        ({**({"model": m} if len(models) > 1 else {}), **{f"{m}.{k}": v for k, v in params}}, sum(v) / len(v))
        for (m, params), v in points.items()
    ]
    return OptunaSearch(
        space=DefineByRun(models), metric="objective", mode="min", sampler=samplers[spec.sampler](),
        points_to_evaluate=[p for p, _ in evaluated] or None,
        evaluated_rewards=[r for _, r in evaluated] or None,
    )  # fmt: skip
