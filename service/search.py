"""The search adapter: a study's space → its trials, and the Optuna samplers that pick points of it.

One function makes trials from a point of a model (`point_trials`): the grid's enumeration
(`grid_trials`), the check of a space before a study is created (`check_space`) and the sampled
points of a model-based search (`service.ray_tune.UnitSearcher`) all go through it, so a trial's
settings are layered one way everywhere: the space's `base`, then the model's `fixed` fields, then
the point's values, then the study's execution settings (threads), then the seed.

The samplers are Optuna's, driven by Ray Tune's `OptunaSearch` over a define-by-run space (the
model when there are several, then that model's dimensions), warm-started with a study's finished
points. The searcher sees one objective per point: the mean over seeds of final loss / baseline.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import trainers
from search_spaces import Model, SearchSpace, Uniform, Values
from service.spec import StudyError, StudySpec
from service.trial import TrialSpec, objective

if TYPE_CHECKING:
    from service.ledger import Trial


def materialize(settings: Mapping[str, Any]) -> trainers.Resolved:
    """Flat trial settings (task, cell, seed and any field) → a resolved, validated trial config."""
    settings = dict(settings)
    base = trainers.TrainConfig(task=str(settings.pop("task", "copy")), cell=str(settings.pop("cell", "rnn")))
    return trainers.resolve(trainers.apply_overrides(base, settings))


def execution(spec: StudySpec) -> dict[str, Any]:
    """The study's execution settings of every trial (not part of a trial's identity)."""
    return {"threads": max(1, int(spec.resources.cpus))}


def point_trials(
    space: SearchSpace, model: Model, point: Mapping[str, Any], settings: Mapping[str, Any]
) -> list[TrialSpec]:
    """The trials of one point of `model` (its dimensions' values): one per seed of the space."""
    varied = {k: point[k] for k in model.dims}
    trials = []
    for seed in space.seeds:
        resolved = materialize({**space.base, **model.fixed, **point, **settings, "seed": seed})
        trials.append(TrialSpec.of(model.name, {**varied, "seed": seed}, resolved))
    return trials


def grid_trials(space: SearchSpace, settings: Mapping[str, Any]) -> list[TrialSpec]:
    """Every grid point × seed of the space, in order (models, then points, then seeds)."""
    return [
        t
        for model in space.models
        for point in model.grid()
        for t in point_trials(space, model, point, settings)
    ]


def check_space(space: SearchSpace) -> None:
    """Every model's first setting must resolve through the trainers (names, values, ranges)."""
    for model in space.models:
        point = {k: d.values[0] if isinstance(d, Values) else d.low for k, d in model.dims.items()}
        try:
            point_trials(space, model, point, {})
        except (ValueError, KeyError) as exc:
            raise StudyError(f"model {model.name!r}: {exc}") from None


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
        key = (t.model, tuple(sorted((k, v) for k, v in t.params.items() if k != "seed")))
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
