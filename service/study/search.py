"""The search adapter: a study's space → its trials, and the Optuna samplers that pick points of it.

One function makes trials from a point of a model (`point_trials`): the grid's enumeration
(`grid_trials`), the check of a space before a study is created (`check_space`) and the sampled
points of a model-based search (`Sampling.unit`) all go through it, so a trial's
settings are layered one way everywhere: the space's `base`, then the model's `fixed` fields, then
the point's values, then the study's execution settings (threads), then the seed.

The samplers are Optuna's, drawing one point at a time with its ask and tell (`Draws`) over a
define-by-run space (the model when there are several, then that model's dimensions), warm-started
with a study's finished points (`Sampling`); an executor takes the draws (Ray Tune as its searcher:
`service.study.ray_tune.UnitSearcher`). The sampler sees one objective per point: the mean over seeds
of final loss / baseline.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import trainers
from search_spaces import Model, SearchSpace, Uniform, Values
from service.core.errors import StudyError
from service.core.spec import DEFAULT_MODEL, StudySpec
from service.core.trial import FAILED_OBJECTIVE, Known, PointKey, TrialSpec, Unit, known_of, point_key
from service.study.packing import bundle

if TYPE_CHECKING:
    from service.store.models import Trial


def materialize(settings: Mapping[str, Any]) -> trainers.Resolved:
    """Flat trial settings (task, cell, seed and any field) → a resolved, validated trial config."""
    settings = dict(settings)
    base = trainers.TrainConfig(task=str(settings.pop("task", "copy")), cell=str(settings.pop("cell", "rnn")))
    return trainers.resolve(trainers.apply_overrides(base, settings))


def execution(spec: StudySpec) -> dict[str, Any]:
    """The study's execution settings of every trial: its threads, which enter a trial's hash once
    they are not 1 (they move its rounding: `trainers.config.ROUNDING_FIELDS`)."""
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


def check_numbers_as_text(space: SearchSpace) -> None:
    """Refuse a dimension's value given as text where its setting is a number (JSON's `"1e-3"`, or a
    YAML value in quotes): the trainer reads it as 0.001, but the study's points, tables, filters, best
    configs and sampler would hold the text, beside the number another study or an extension writes.
    A new study's check (`Engine.create_study`, a plan): a stored study's points stay as they are."""
    for model in space.models:
        for name, dim in model.dims.items():
            if not isinstance(dim, Values):
                continue
            for i, value in enumerate(dim.values):
                if not isinstance(value, str) or not _number_text(value):
                    continue
                resolved = materialize(
                    {**space.base, **model.fixed, **first_point(model), name: value, "seed": 1}
                )
                if _numeric_setting(resolved, name):
                    where = "" if model.name == DEFAULT_MODEL else f"model {model.name!r}: "
                    raise StudyError(
                        f"{where}dims.{name}[{i}] = {value!r} is text, and {name} is a number: write it as one "
                        f"({value}, not quoted), so that the study's tables and filters hold the number it trains"
                    )


def _number_text(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _numeric_setting(resolved: trainers.Resolved, name: str) -> bool:
    """Whether the setting `name` of a resolved config holds a number (not a bool, not text)."""
    for holder in (resolved.config, resolved.task_config, resolved.cell_config):
        if name in {f.name for f in dataclasses.fields(holder)}:
            value = getattr(holder, name)
            return isinstance(value, int | float) and not isinstance(value, bool)
    return False


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


def interior(dim: Uniform) -> float:
    """A value a sampler may draw inside a continuous range, with a fraction (so that a range over a
    whole-number field is refused before a study runs, not at its first draw)."""
    low, high = (math.log(dim.low), math.log(dim.high)) if dim.log else (dim.low, dim.high)
    value = low + 0.3819660112501051 * (high - low)  # the golden section: rarely a whole number
    value = math.exp(value) if dim.log else value
    return value if not value.is_integer() else math.nextafter(value, dim.high)


def probe_points(model: Model) -> list[dict[str, Any]]:
    """The points that stand for what a model may draw: its first point, then each value of each
    dimension (both ends of a range, and a fraction between) with the others at their first value."""
    first = first_point(model)
    points = [first]
    for key, dim in model.dims.items():
        ends = dim.values[1:] if isinstance(dim, Values) else (dim.high,)
        if isinstance(dim, Uniform):  # and a draw between: a fraction, which a whole-number field refuses
            ends = (*ends, interior(dim))
        points += [{**first, key: value} for value in ends]
    return points


def check_space(space: SearchSpace) -> None:
    """Every value a sampler may draw must make a trial the trainers accept: each model's first
    point, then each value of each dimension (both ends of a range) with the other dimensions at
    their first value — names, types, ranges, and what the task itself checks (`check_trials`).
    With the first seed only: a seed changes no setting, and the work stays the dimensions' lengths
    summed (a grid's size is checked before, from their product)."""
    space = replace(space, seeds=space.seeds[:1])
    for model in space.models:
        for point in probe_points(model):
            try:
                check_trials(point_trials(space, model, point, {}))
            except (ValueError, KeyError) as exc:
                where = ", ".join(f"{k}={v!r}" for k, v in point.items() if k in model.dims)
                ranges = [
                    k
                    for k, d in model.dims.items()
                    if isinstance(d, Uniform) and "not an integer" in str(exc)
                ]
                hint = f" (for whole numbers, write {ranges[0]} as {{int: [low, high]}})" if ranges else ""
                raise StudyError(
                    f"model {model.name!r}" + (f" at {where}" if where else "") + f": {exc}{hint}"
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
            ranges = sorted({k for m in space.models for k, d in m.dims.items() if not isinstance(d, Values)})
            raise StudyError(
                f"sampler 'grid' needs lists of values in every dimension, and {', '.join(ranges)} "
                f"{'is a range' if len(ranges) == 1 else 'are ranges'}: give a list of values, or a sampler "
                "that draws from ranges (random, tpe, cmaes, qmc; with max_trials)"
            )
        size = space.size()
        capped = spec.max_trials is not None and spec.max_trials < max_grid_size  # on a grid, a cap
        limit = spec.max_trials if capped and spec.max_trials is not None else max_grid_size
        if size > limit:
            over, fix = (
                (f"its max_trials of {limit}", "or raise max_trials (or leave it out)")
                if capped
                else (
                    f"the limit of {limit} (MEMSWEEP_MAX_GRID_SIZE)",
                    "or draw max_trials of its points with a sampler (random, tpe, cmaes, qmc); or raise "
                    "MEMSWEEP_MAX_GRID_SIZE where the study runs (the server's setting)",
                )
            )
            raise StudyError(
                f"the grid holds {size} trials (points × seeds), over {over}; choose fewer models, values "
                f"or seeds, {fix}"
            )
    check_execution(spec, space)
    check_space(space)
    return space


def check_execution(spec: StudySpec, space: SearchSpace) -> None:
    """The settings of where a trial runs that its study's `resources` decide, refused when the spec
    sets them otherwise (issue 35): a trial's `threads` are its unit's CPUs (`execution`), and a GPU
    `device` needs GPUs the unit asks for (Ray hides every GPU from a unit that asks none, and shows
    a unit ceil(gpus) of them, as cuda:0, cuda:1, …); a cell's `backend: persistent` (a GPU kernel, issue
    37: the Elman family's and SRNN's) likewise."""
    places: list[tuple[str, Mapping[str, Any]]] = [("base", space.base)]
    for model in space.models:
        places += [(f"model {model.name!r}", model.fixed), (f"model {model.name!r} dims", model.dims)]
    cpus, gpus = execution(spec)["threads"], spec.resources.gpus
    for where, settings in places:
        for key in ("threads", "device", "backend", "cell.backend"):
            if key not in settings:
                continue
            name, value = key.rpartition(".")[2], settings[key]
            values = value.values if isinstance(value, Values) else [value]
            for v in values:
                if name == "backend" and v == "persistent" and gpus == 0:
                    raise StudyError(
                        f"{where}: backend = 'persistent' is a GPU kernel, but the study's units ask no GPU "
                        "(resources.gpus = 0); on the CPU it runs only under Triton's interpreter, a slow "
                        "check: set `resources: {gpus: 1}` to train on a GPU, or backend `auto` or `scan` "
                        "(the same recurrence) on the CPU"
                    )
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


def distributions(models: Mapping[str, Model], name: str) -> dict[str, Any]:
    """Optuna's distributions of a point of model `name`: the model (when there are several), then
    that model's dimensions, each named `model.dimension`."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    found: dict[str, Any] = {"model": CategoricalDistribution(list(models))} if len(models) > 1 else {}
    for key, dim in models[name].dims.items():
        if isinstance(dim, Values):
            found[f"{name}.{key}"] = CategoricalDistribution(list(dim.values))
        elif isinstance(dim, Uniform):
            found[f"{name}.{key}"] = FloatDistribution(dim.low, dim.high, log=dim.log)
        else:
            found[f"{name}.{key}"] = IntDistribution(dim.low, dim.high, log=dim.log)
    return found


def suggest(trial: Any, models: Mapping[str, Model]) -> tuple[str, dict[str, Any]]:
    """(model, its dimensions' values) an Optuna trial suggests, define-by-run: the model (when there
    are several), then that model's dimensions."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    names = list(models)
    name = trial.suggest_categorical("model", names) if len(names) > 1 else names[0]
    point = {}
    for pname, d in distributions(models, name).items():
        if pname == "model":
            continue
        if isinstance(d, CategoricalDistribution):
            value = trial.suggest_categorical(pname, list(d.choices))
        elif isinstance(d, FloatDistribution):
            value = trial.suggest_float(pname, d.low, d.high, log=d.log)
        else:
            value = trial.suggest_int(pname, d.low, d.high, log=d.log)
        point[pname[len(name) + 1 :]] = value
    return name, point


@dataclass(frozen=True)
class Sampling:
    """A sampler's part of a study run: `count` points of `space` drawn by Optuna's `sampler` (`Draws`),
    each point × the space's seeds one unit (`unit`), warm-started with the study's finished points
    (`warm`: each point's Optuna parameters, its seed-averaged objective and, for a point a scheduler
    pruned, its evaluations then: `told`) so that a resume keeps
    what the sampler learned."""

    space: SearchSpace
    sampler: str
    seed: int | None
    count: int
    settings: Mapping[str, Any]  # the study's execution settings (`execution`)
    fused: bool
    known: Callable[[Iterable[str]], dict[str, Known]]  # config hashes → the finished ones, as counted
    warm: Sequence[tuple[dict[str, Any], float, int | None]] = ()
    lockstep: bool = False  # a point's seeds that cannot fuse train side by side (judged at rungs: asha)

    @property
    def models(self) -> dict[str, Model]:
        return {m.name: m for m in self.space.models}

    def optuna_sampler(self) -> Any:
        """The spec's sampler. Seeded, a resumed one draws on from `seed` + its finished points: from
        `seed` itself, its first random draws would be the points it already drew."""
        import optuna

        seed = None if self.seed is None else self.seed + len(self.warm)
        samplers: dict[str, Callable[[], Any]] = {
            "random": lambda: optuna.samplers.RandomSampler(seed=seed),
            "tpe": lambda: optuna.samplers.TPESampler(seed=seed),
            "cmaes": lambda: optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False),
            "qmc": lambda: optuna.samplers.QMCSampler(seed=seed, warn_independent_sampling=False),
        }
        return samplers[self.sampler]()

    def unit(self, model: str, point: Mapping[str, Any]) -> Unit:
        """The unit of a drawn point: its trials, resolved here in the driver, as one unit (fused when
        they share shapes); members finished in the ledger are counted, not trained again."""
        members = point_trials(self.space, self.models[model], point, self.settings)
        unit = bundle(members, fused=self.fused, lockstep=self.lockstep)
        return Unit(unit.members, unit.fused, self.known([m.config_hash for m in members]), unit.lockstep)


class Draws:
    """A sampling's points, one unit at a time, with Optuna's ask and tell: `ask(key)` draws the point
    of an executor trial `key`, `tell(key, objective)` gives back its objective once the unit ended
    (None: it failed, and the sampler learns nothing from it). The finished points are the sampler's
    history before its first draw.

    A sampler may draw a point again (a discrete space: Optuna's samplers do not avoid repeats). Met
    again finished, its members are counted, not trained (`Sampling.unit`). Met again while a unit
    still trains it, it is *parked*: `ask` answers None (Ray Tune asks again later) and draws nothing
    more until that unit has ended, then hands the parked point out, counted from the ledger where
    it finished. So no member ever trains in two units at once, and the sampler gets every point it
    asked for; the price is fewer units at once while a repeat waits (a nearly exhausted space)."""

    def __init__(self, sampling: Sampling) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # not a line per in-memory study made
        self.sampling, self.models = sampling, sampling.models
        self.study = optuna.create_study(direction="minimize", sampler=sampling.optuna_sampler())
        for params, value, pruned_at in sampling.warm:
            name = str(params.get("model", next(iter(self.models))))
            try:
                past = optuna.trial.create_trial(
                    params=params, distributions=distributions(self.models, name),
                    **(
                        {"value": value} if pruned_at is None
                        else {"state": optuna.trial.TrialState.PRUNED, "intermediate_values": {pruned_at: value}}
                    ),
                )  # fmt: skip
            except ValueError:  # a point outside today's space (it was extended): not this space's history
                continue
            self.study.add_trial(past)
        self.asked: dict[str, Any] = {}
        self.training: dict[str, frozenset[str]] = {}  # executor trial → the members its unit trains
        #: a repeat of a point in training: its Optuna trial, its point, the executor trials it waits for
        self.parked: tuple[Any, tuple[str, dict[str, Any]], set[str]] | None = None

    def ask(self, key: str) -> Unit | None:
        """The unit of executor trial `key`, or None while the point drawn is being trained by another."""
        if self.parked is not None:
            trial, point, waits_for = self.parked
            if waits_for & self.training.keys():
                return None
        else:
            trial = self.study.ask()
            point = suggest(trial, self.models)
        unit = self.sampling.unit(*point)  # its members finished by now are counted, not trained
        members = frozenset(m.config_hash for m in unit.members if m.config_hash not in unit.known)
        waits_for = {other for other, trains in self.training.items() if members & trains}
        if waits_for:
            self.parked = (trial, point, waits_for)
            return None
        self.parked = None
        self.asked[key], self.training[key] = trial, members
        return unit

    def tell(self, key: str, objective: float | None, pruned_at: int | None = None) -> None:
        """The objective of executor trial `key`'s point: its seeds' mean at the end (None: the unit
        failed), or, `pruned_at` a number of evaluations, where a scheduler stopped it (Optuna's
        pruned trial, its intermediate value at that step: its samplers rank it after the complete)."""
        from optuna.trial import TrialState

        self.training.pop(key, None)
        trial = self.asked.pop(key, None)
        if trial is None:
            return
        if objective is None or not math.isfinite(objective):
            self.study.tell(trial, state=TrialState.FAIL)
        elif pruned_at is not None:
            trial.report(objective, pruned_at)
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            self.study.tell(trial, objective)


def told(seeds: Sequence[Trial]) -> tuple[float, int | None]:
    """What a finished point tells its sampler again (`Draws.tell`): the mean objective of its seeds,
    a pruned seed's from its last evaluation (one pruned before any is left out); and, when a scheduler
    pruned it, the evaluations it had then (else None)."""
    known = [known_of(t) for t in seeds]
    values = [k.objective for k in known if k.objective is not None]
    pruned = [k.pruned_at for k in known if k.pruned_at is not None]
    return statistics.fmean(values) if values else FAILED_OBJECTIVE, max(pruned) if pruned else None


def rung_means(seeds: Sequence[Trial]) -> dict[int, float]:
    """A finished point's objective after each number of evaluations, as its unit reported it: the
    mean over its seeds of each one's objective then (`Known.at`; a seed pruned before any evaluation
    is left out): what asha recorded of it at its rungs."""
    known = [known_of(t) for t in seeds]
    longest = max((len(k.evaluations) for k in known), default=0)
    means = {}
    for n in range(1, longest + 1):
        values = [v for k in known if (v := k.at(n)) is not None]
        if values:
            means[n] = statistics.fmean(values)
    return means


def points_left(spec: StudySpec, space: SearchSpace, rows: Iterable[Trial]) -> int:
    """How many points a sampled study still draws: its budget in whole points (`max_trials` over its
    seeds, rounded up) less the points its trials hold, finished or not. A point a crash or a fault
    interrupted trains again in the run's rounds, within the budget, not beside it."""
    held = {point_key(t.model, t.params) for t in rows}
    return max(0, math.ceil((spec.max_trials or 0) / len(space.seeds)) - len(held))


def sampling(
    spec: StudySpec,
    space: SearchSpace,
    finished: Iterable[Trial],
    count: int,
    known: Callable[[Iterable[str]], dict[str, Known]],
) -> Sampling:
    """The spec's sampler over the space for `count` points, warm-started with the study's finished
    trials: one evaluated point per point of theirs (`point_key`), its objective averaged over seeds."""
    models = {m.name: m for m in space.models}
    points: dict[PointKey, list[Trial]] = {}
    for t in finished:
        model = t.model if t.model in models else next(iter(models))  # an `arm` of the one unnamed model
        points.setdefault(point_key(model, t.params), []).append(t)
    warm: list[tuple[dict[str, Any], float, int | None]] = []
    for (m, _), seeds in points.items():
        # the point's values as its first seed spells them (1 or 1.0: one point, `point_key`)
        values = {f"{m}.{k}": v for k, v in sorted(seeds[0].params.items()) if k != "seed"}
        warm.append(({**({"model": m} if len(models) > 1 else {}), **values}, *told(seeds)))
    return Sampling(
        space,
        str(spec.sampler),
        spec.sampler_seed,
        count,
        execution(spec),
        spec.fuses,
        known,
        warm,
        lockstep=spec.scheduler == "asha",
    )
