"""The search-space types: dimensions, models (arms of a study), and a space with seeds.

A space is data. Keys are trial-config field names as `python -m trainers --set` accepts them
(`lr`, `scale`, `init`, `seq_len`, `hidden`, `task`, `cell`, …); the service checks them against the
trainers when a study is created. A space is a union of *models* (Orhan & Pitkow's four
initialisers, or SGORNN's four cells): each model fixes some fields and spans its own dimensions.
Seeds are a dimension of their own: every point runs once per seed.

Standard library only.
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Scalar = bool | int | float | str | None
#: a value `base` or a model's `fixed` may hold: a scalar, or a list of them (`lr_drop_epochs: [200]`),
#: which no dimension draws
Setting = Scalar | list[Scalar] | tuple[Scalar, ...]


class SpaceError(ValueError):
    """A malformed space; the message says what to change."""


@dataclass(frozen=True)
class Values:
    """An exact list of values: a grid axis, or a categorical choice for model-based samplers."""

    values: tuple[Scalar, ...]

    def __post_init__(self) -> None:
        if not self.values:
            raise SpaceError("a Values dimension needs at least one value; give one or more")


@dataclass(frozen=True)
class Uniform:
    """A continuous range [low, high]; `log=True` samples uniformly in log space."""

    low: float
    high: float
    log: bool = False

    def __post_init__(self) -> None:
        if not self.low < self.high:
            kind = "a log-uniform range" if self.log else "a uniform range"
            raise SpaceError(
                f"{kind} needs low < high, got low={self.low}, high={self.high}"
                + ("; swap them" if self.low > self.high else "")
            )
        if self.log and self.low <= 0:
            raise SpaceError(f"a log-uniform range needs low > 0, got low={self.low}")


@dataclass(frozen=True)
class IntRange:
    """Integers in [low, high] inclusive; `log=True` samples uniformly in log space."""

    low: int
    high: int
    log: bool = False

    def __post_init__(self) -> None:
        if not self.low <= self.high:
            raise SpaceError(f"IntRange needs low <= high, got low={self.low}, high={self.high}")
        if self.log and self.low <= 0:
            raise SpaceError(f"a log-scaled integer range needs low > 0, got low={self.low}")


Dimension = Values | Uniform | IntRange


@dataclass(frozen=True)
class Model:
    """One arm of a space: fields it fixes (e.g. init=chain) and dimensions it spans (e.g. lr, scale)."""

    name: str
    fixed: Mapping[str, Setting] = field(default_factory=dict)
    dims: Mapping[str, Dimension] = field(default_factory=dict)

    @property
    def is_grid(self) -> bool:
        return all(isinstance(d, Values) for d in self.dims.values())

    def grid_points(self) -> int:
        """Points of this model's grid, seeds excluded."""
        if not self.is_grid:
            raise SpaceError(f"model {self.name!r} has continuous dimensions; it has no finite grid")
        return math.prod(len(d.values) for d in self.dims.values() if isinstance(d, Values))

    def grid(self) -> Iterator[dict[str, Setting]]:
        """Every point of the grid: the model's fixed fields plus one value per dimension."""
        names = list(self.dims)
        axes = [d.values for d in self.dims.values() if isinstance(d, Values)]
        if len(axes) != len(names):
            raise SpaceError(f"model {self.name!r} has continuous dimensions; it has no finite grid")
        for combo in itertools.product(*axes):
            yield {**self.fixed, **dict(zip(names, combo, strict=True))}


@dataclass(frozen=True)
class SearchSpace:
    """A study's space: shared settings, one or more models, and the seeds every point repeats over."""

    name: str
    models: tuple[Model, ...]
    seeds: tuple[int, ...] = (1,)
    base: Mapping[str, Setting] = field(default_factory=dict)
    citation: str = ""
    description: str = ""

    def __post_init__(self) -> None:
        if not self.models:
            raise SpaceError(f"space {self.name!r} needs at least one model")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise SpaceError(f"space {self.name!r} has duplicate model names: {names}")
        if not self.seeds:
            raise SpaceError(f"space {self.name!r} needs at least one seed")

    @property
    def is_grid(self) -> bool:
        return all(m.is_grid for m in self.models)

    def size(self) -> int:
        """Trials of the full grid: points × seeds, over every model."""
        return sum(self.size_per_model().values())

    def size_per_model(self) -> dict[str, int]:
        return {m.name: m.grid_points() * len(self.seeds) for m in self.models}

    def model(self, name: str) -> Model:
        for m in self.models:
            if m.name == name:
                return m
        names = [m.name for m in self.models]
        near = did_you_mean(name, names)
        raise SpaceError(
            f"space {self.name!r} has no model {name!r}; {near + ' ' if near else ''}models: {', '.join(names)}"
        )

    def points(self) -> Iterator[tuple[str, dict[str, Setting]]]:
        """(model name, settings) for every grid point, seeds excluded; settings include `base`."""
        for m in self.models:
            for point in m.grid():
                yield m.name, {**self.base, **point}

    def trials(self) -> Iterator[tuple[str, dict[str, Setting]]]:
        """(model name, settings with `seed`) for every grid point × seed."""
        for model_name, point in self.points():
            for seed in self.seeds:
                yield model_name, {**point, "seed": seed}

    def with_overrides(
        self,
        base: Mapping[str, Setting] | None = None,
        seeds: Sequence[int] | None = None,
        dims: Mapping[str, Dimension] | None = None,
        models: Sequence[str] | None = None,
        settings: Collection[str] | None = None,
    ) -> SearchSpace:
        """A copy with settings added to `base`, other seeds, dimensions replaced in every model
        that has them, or only some models (e.g. a shorter budget on a smaller grid).

        A `base` setting that a model varies or fixes is refused: the model's own value would win,
        so the setting would be silently ignored. A dimension no model varies is a setting of the trials
        (`settings`, the names they take: the service's, from the trainers), which every chosen model then
        spans (refused where a chosen model fixes it, or base gives it too), or it is refused, told apart
        from a typo by `settings`; without `settings` it is refused."""
        if models is not None and not models:
            raise SpaceError(
                "models: [] selects no model; leave `models` out to run all of them, or name some of: "
                + ", ".join(m.name for m in self.models)
            )
        chosen = self.models if not models else tuple(self.model(n) for n in models)
        # before a model's own values are blamed: the dims given replace them, so the clash is base's with dims
        both = sorted(set(base or {}) & set(dims or {}))
        if both:
            raise SpaceError(
                f"base.{both[0]} and dims.{both[0]}: give {both[0]} one value in base, or several in dims, not both"
            )
        for key, value in (base or {}).items():
            for m in chosen:
                if key in m.dims:
                    one = as_flag(as_written(value))
                    raise SpaceError(
                        f"base.{key}: model {m.name!r} varies {key} over {dim_to_dict(m.dims[key])}, so a "
                        f"base value would be ignored; to run one value write dims: {{{key}: [{one}]}} (on "
                        f"the command line: --dim {key}={one})"
                    )
                if key in m.fixed and m.fixed[key] != value:
                    raise SpaceError(
                        f"base.{key}: model {m.name!r} fixes {key} = {m.fixed[key]!r}, so base {key} = {value!r} "
                        f"would be ignored; choose models that share it (`models`), or leave {key} out of base"
                    )
        if dims:
            varied = sorted({k for m in chosen for k in m.dims})
            # a setting of these trials that no model varies (the preset's lr): every chosen model spans it,
            # unless one of them fixes it (its own value would win)
            spanned = sorted(
                k for k in set(dims) - set(varied)
                if settings is not None and k in settings and not any(k in m.dims for m in self.models)
            )  # fmt: skip
            for key in spanned:
                fixing = [m for m in chosen if key in m.fixed]
                if fixing:
                    raise SpaceError(
                        f"dims.{key}: model {fixing[0].name!r} fixes {key} = {fixing[0].fixed[key]!r}, so it "
                        f"cannot span {key}; choose models that leave it to the study (`models`), or sweep it "
                        "in a model of your own beside these (space: {models: {NAME: {fixed: {...}, dims: "
                        f"{{{key}: [value1, value2]}}}}}}}})" + named_in(models)
                    )
            unknown = sorted(set(dims) - set(varied) - set(spanned))
            if unknown:
                hints = []
                for key in unknown:
                    others = [m.name for m in self.models if key in m.dims and m not in chosen]
                    near = did_you_mean(key, varied)
                    if others:
                        hints.append(f"{key} is a dimension of {', '.join(others)}, not of the models chosen")
                    elif settings is None:
                        hints.append(
                            near
                            or f"if {key} is a setting of these trials, give it one value for every trial in base"
                        )
                    elif key not in settings:
                        near = near or did_you_mean(key, settings)
                        hints.append(
                            f"{key} is no setting of these trials, nor of their task or cells"
                            + (f": {near}" if near else "")
                        )
                    else:
                        hints.append(
                            f"{key} is a setting of these trials that no model varies: give it one value for "
                            f"every trial in base, or sweep it in a model of your own beside these (space: "
                            f"{{models: {{NAME: {{fixed: {{...}}, dims: {{{key}: [value1, value2]}}}}}}}})"
                            + named_in(models)
                        )
                raise SpaceError(
                    f"cannot override {unknown}: not a dimension of the models "
                    f"{', '.join(m.name for m in chosen)} of space {self.name!r} (dimensions: {varied}); "
                    f"{'; '.join(hints)}"
                )
            chosen = tuple(
                Model(
                    m.name,
                    m.fixed,
                    {k: dims.get(k, d) for k, d in m.dims.items()} | {k: dims[k] for k in spanned},
                )
                for m in chosen
            )
        return SearchSpace(
            name=self.name,
            models=chosen,
            seeds=tuple(seeds) if seeds else self.seeds,
            base={**self.base, **(base or {})},
            citation=self.citation,
            description=self.description,
        )


def named_in(models: Sequence[str] | None) -> str:
    """Where a study chooses its `models`, the advice to name a model of one's own there too (the
    service refuses a space model they leave out)."""
    if not models:
        return ""
    kept = [*dict.fromkeys(models), "NAME"]
    return (
        f"; and name that model in `models`: models: [{', '.join(kept)}] (on the command line: "
        f"--models {','.join(kept)})"
    )


def as_flag(value: Any) -> str:
    """A value as `--dim KEY=VALUE` and a spec both read it back: JSON for a number, a boolean or null
    (`true`, not Python's `True`), text as it is."""
    return value if isinstance(value, str) else json.dumps(value)


def did_you_mean(name: str, names: Iterable[str]) -> str:
    """`did you mean 'x'?` for the name in `names` closest to a misspelt `name`, case aside (`Lr` is `lr`
    misspelt: compared as written, they share too few letters to be near), or "" when none is near."""
    folded: dict[str, str] = {}
    for known in names:
        folded.setdefault(known.lower(), known)
    near = difflib.get_close_matches(name.lower(), list(folded), n=1)
    return f"did you mean {folded[near[0]]!r}?" if near else ""


def describe(space: SearchSpace) -> dict[str, Any]:
    """A JSON-ready summary: size in all and per model, citation, values."""
    out: dict[str, Any] = {
        "name": space.name,
        "citation": space.citation,
        "description": space.description,
        "seeds": list(space.seeds),
        "base": dict(space.base),
        "is_grid": space.is_grid,
        "models": {},
    }
    for m in space.models:
        out["models"][m.name] = {
            "fixed": dict(m.fixed),
            "dims": {k: dim_to_dict(d) for k, d in m.dims.items()},
        }
    if space.is_grid:
        out["size"] = space.size()
        out["size_per_model"] = space.size_per_model()
    return out


def dim_to_dict(d: Dimension) -> dict[str, Any]:
    if isinstance(d, Values):
        return {"values": list(d.values)}
    kind = "uniform" if isinstance(d, Uniform) else "int"
    return {kind: [d.low, d.high], "log": d.log}


#: how a dimension is written, by its key, and the keys each form takes beside it
DIMENSION_FORMS = {"values": (), "uniform": ("log",), "loguniform": (), "int": ("log",)}
DIMENSION_HELP = (
    'write a list of values, {"values": [...]}, {"uniform": [low, high]} (with "log": true to draw in log '
    'space), {"loguniform": [low, high]} or {"int": [low, high]} (with "log": true)'
)


def as_written(value: Any) -> Any:
    """`value` as a spec should write it: text that reads as a number (`"1e-3"`) as that number, else
    itself."""
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return value
        return (
            int(number) if number.is_integer() and "." not in value and "e" not in value.lower() else number
        )
    return value


def same_value(a: Any, b: Any) -> bool:
    """Whether two values of a dimension set a trial alike: equal as a trial config reads them (`1e-3`
    and `0.001`, `8` and `8.0`, text `"0.001"` and the number), a boolean apart from the numbers."""
    a, b = as_written(a), as_written(b)
    return isinstance(a, bool) == isinstance(b, bool) and bool(a == b)


def distinct(values: Sequence[Any]) -> tuple[Any, ...]:
    """`values`, each once (the first of those a trial reads alike: `same_value`). A new spec is refused
    a value given twice (`check_distinct`); a study stored before that rule keeps its space, each point
    once (its ledger held each hash once, while its plan had counted both)."""
    kept: list[Any] = []
    for v in values:
        if not any(same_value(k, v) for k in kept):
            kept.append(v)
    return tuple(kept)


def check_distinct(values: Sequence[Any], where: str) -> None:
    """Refuse a value given twice (`lr: [1e-3, 0.001]`): its trials are one config hash, so the study
    holds them once, while its plan counted both (`service.core.spec.StudySpec` asks it of a new spec)."""
    for j, b in enumerate(values):
        for i, a in enumerate(values[:j]):
            if same_value(a, b):
                name = where.rsplit(".", 1)[-1]
                kept = [v for k, v in enumerate(values) if k != j]
                raise SpaceError(
                    f"{where}[{i}] = {a!r} and {where}[{j}] = {b!r} are the same value (a trial reads them "
                    f"alike, so the study would hold its trials once): give each value once, e.g. {name}: {kept!r}"
                )


def check_single_values(values: Sequence[Any], where: str) -> None:
    """Refuse a value that is no single value (a list, `lr_drop_epochs: [[100], [200]]`): a dimension's
    values are choices a sampler draws (Optuna's categorical takes numbers, text, booleans and null), and
    a list is one setting of every trial, for `base` (`service.core.spec.StudySpec` asks it of a new
    spec; a stored one, which a grid may have swept so, is read as it was)."""
    for i, v in enumerate(values):
        if not isinstance(v, (bool, int, float, str, type(None))):
            name = where.rsplit(".", 1)[-1]
            raise SpaceError(
                f"{where}[{i}] = {v!r} is not a single value: a dimension's values are numbers, text, "
                f"true/false or null, each a choice a sampler can draw. Give a value that is a list in "
                f"`base` (e.g. base: {{{name}: {v!r}}}), or sweep single values ({name}: [100, 200])"
            )


def dim_from_dict(raw: Any, where: str) -> Dimension:
    """A dimension from JSON/YAML: a list → Values; {"values": [...]}; {"uniform": [lo, hi], "log": b};
    {"loguniform": [lo, hi]}; {"int": [lo, hi], "log": b}. Anything else — an unknown key, a `log` that is
    no boolean, a range that is not two numbers, an `int` range with a fraction — is refused, naming it."""
    if isinstance(raw, (list, tuple)):
        raw = {"values": raw}
    if not isinstance(raw, Mapping):
        return Values((raw,))
    kinds = [k for k in raw if k in DIMENSION_FORMS]
    if len(kinds) != 1:
        raise SpaceError(f"{where}: cannot read {raw!r} as a dimension; {DIMENSION_HELP}")
    kind = kinds[0]
    extra = [k for k in raw if k != kind and k not in DIMENSION_FORMS[kind]]
    if extra:
        allowed = ", ".join(repr(k) for k in DIMENSION_FORMS[kind]) or "nothing"
        raise SpaceError(
            f"{where}: {extra[0]!r} is not a key of a {kind!r} dimension (it takes {allowed}); {DIMENSION_HELP}"
        )
    log = raw.get("log", False)
    if not isinstance(log, bool):
        raise SpaceError(f"{where}.log = {log!r} must be true or false")
    if kind == "values":
        values = raw["values"]
        if isinstance(values, (list, tuple)) and not values:
            raise SpaceError(
                f"{where} is empty: give at least one value to try (a list, e.g. "
                f"{where.rsplit('.', 1)[-1]}: [value1, value2]), or leave {where} out"
            )
        values = tuple(values) if isinstance(values, (list, tuple)) else (values,)
        return Values(distinct(values))
    bounds = raw[kind]
    # two numbers (text is refused as in a list of values: a spec file reads 1e-5 as a number)
    for i, b in enumerate(bounds if isinstance(bounds, (list, tuple)) else ()):
        if isinstance(b, str) and as_written(b) is not b:
            raise SpaceError(f"{where}.{kind}[{i}] = {b!r} is text: write it as a number, {as_written(b)!r}")
    try:
        if (
            isinstance(bounds, (str, bytes))
            or any(isinstance(b, (bool, str)) for b in bounds)
            or len(bounds) != 2
        ):
            raise TypeError
        lo, hi = float(bounds[0]), float(bounds[1])
    except (TypeError, ValueError):
        raise SpaceError(f"{where}.{kind} = {bounds!r} must be two numbers, [low, high]") from None
    try:
        if kind == "int":
            if not (lo.is_integer() and hi.is_integer()):
                raise SpaceError(
                    f"{where}.int = {list(bounds)} must be two whole numbers (a continuous range: uniform)"
                )
            return IntRange(int(lo), int(hi), log)
        return Uniform(lo, hi, log or kind == "loguniform")
    except SpaceError as exc:
        raise SpaceError(str(exc) if str(exc).startswith(where) else f"{where}: {exc}") from None
