"""A study spec: what to search (a preset or an explicit space, with overrides), how, and with what.

Readable from JSON or YAML (a file: `service.core.spec_file`). `StudySpec.search_space()` gives the
`SearchSpace`, assembled against the trainers' registries by `service.core.space_build`;
`service.study.search` turns it into trials.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from search_spaces import Model, SearchSpace, SpaceError, Values, dim_from_dict, get_preset
from search_spaces.space import check_distinct, check_single_values, distinct
from service.core.criterion_query import OWN, CriterionQuery
from service.core.errors import StudyError
from service.core.space_build import (
    cell_arms,
    cell_settings_per_model,
    check_preset_choice,
    check_trial_values,
    trial_settings,
)

# re-exported: service/client.py and service/cli/console.py import names_spec_file from here
from service.core.spec_file import names_spec_file as names_spec_file
from service.core.spec_file import spec_data
from trainers.config import TrainConfig
from trainers.criterion import Criterion
from trainers.numerics_modes import Numerics, default_mode

# The trainers' registries (`trainers.cells`, `trainers.tasks`: torch) are imported where a spec's space
# meets them (`service.core.space_build`, `StudySpec.baselines`), so a stored spec is read and judged
# without torch (the CLI's reads of its ledger).

Sampler = Literal["grid", "random", "tpe", "cmaes", "qmc"]


#: the name of a `space: {dims: …}` shorthand's one model
DEFAULT_MODEL = "default"
#: the validation context of a spec read back from the ledger: the rules for new specs that came after
#: it was stored do not refuse it (`StudySpec.model_validate(spec, context=STORED)`)
STORED = {"stored": True}


class ModelSpec(BaseModel):
    """One arm of an explicit space: fields it fixes and the dimensions it spans."""

    model_config = ConfigDict(extra="forbid")
    fixed: dict[str, Any] = Field(default_factory=dict)
    dims: dict[str, Any] = Field(default_factory=dict, description="field → list of values or a range")


#: a model's name: it names the model's MLflow params and metrics (`success_rate.NAME`), whose keys
#: MLflow limits to letters, digits and a few marks, and a ledger column of 100 characters
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")


class SpaceSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dims: dict[str, Any] = Field(default_factory=dict, description="a single model's dimensions (shorthand)")
    models: dict[str, ModelSpec] = Field(default_factory=dict, description="several named models")

    def check_model_names(self) -> None:
        """Refuse a model name MLflow cannot hold as a key: asked of a new study or extension (a study
        stored before the rule still loads, so it can be read, resumed and synced)."""
        for name in self.models:
            if not MODEL_NAME.fullmatch(name):
                raise StudyError(
                    f"space.models: model name {name!r}: use letters, digits, '_', '.' and '-', at most 64, "
                    "starting with a letter or digit (it names the model's MLflow params and metrics); e.g. "
                    f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name).strip('_.-')[:64] or 'model1'!r}"
                )


class CriterionSpec(BaseModel):
    """A success criterion reported beside the study's own: a fraction of a baseline, or a threshold."""

    model_config = ConfigDict(extra="forbid")
    fraction: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    threshold: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    baseline: str = Field(
        default="task", description="the task's baseline, or a reference one it reports (copy: arjovsky)"
    )

    @model_validator(mode="after")
    def _one_rule(self) -> CriterionSpec:
        self.criterion()  # exactly one of fraction and threshold
        return self

    def criterion(self) -> Criterion:
        return Criterion(self.fraction, self.threshold, self.baseline)


class Resources(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cpus: float = Field(
        default=1.0, gt=0, description="CPUs per Ray unit (a fused bundle of trials, or one trial alone)"
    )
    gpus: float = Field(
        default=0.0,
        ge=0,
        description="GPU fraction per Ray unit (a fused bundle of trials, or one trial alone)",
    )


#: the highest rung ASHA may set, in evaluations (a bound for its rungs: no run evaluates this often)
ASHA_MAX_EVALUATIONS = 100_000


class Asha(BaseModel):
    """Ray Tune's ASHA (asynchronous successive halving) over a study's points, in evaluations: a point
    reaching a rung (grace_period × reduction_factor^k evaluations) goes on only when its objective,
    the mean over its seeds, is among the best 1 / reduction_factor of the points that reached it."""

    model_config = ConfigDict(extra="forbid")
    grace_period: int = Field(
        default=2,
        ge=1,
        le=ASHA_MAX_EVALUATIONS,
        description="evaluations a point trains before it can be stopped (the first rung)",
    )
    reduction_factor: float = Field(
        default=3.0, gt=1, allow_inf_nan=False, description="a rung keeps the best 1 / reduction_factor"
    )


class StudySpec(BaseModel):
    """Everything a study needs. Give `preset` or `space` (or both: the space's models are added beside
    the preset's, and `models`, when given, names the ones a study keeps, the space's among them)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "copy-chain-vs-orth",
                    "preset": "orhan2020-copy500",
                    "models": ["chain", "orthogonal"],
                    "base": {"seq_len": 100, "steps": 500},
                    "dims": {"lr": [3e-4, 1e-4], "scale": [1.0]},
                    "seeds": [1, 2],
                    "concurrency": 2,
                }
            ]
        },
    )

    name: str | None = Field(
        default=None,
        max_length=120,
        pattern=r"^[^\x00-\x1f\x7f]*$",
        description="a label for people (printable, at most 120 characters); ids are generated",
    )
    preset: str | None = Field(default=None, description="a paper's grid, see `memsweep presets`")
    space: SpaceSpec | None = Field(default=None, description="an explicit space")
    base: dict[str, Any] = Field(default_factory=dict, description="trial settings applied to every trial")
    dims: dict[str, Any] = Field(default_factory=dict, description="replace these dimensions of the preset")
    models: list[str] | None = Field(
        default=None,
        description="run only these models of the preset (and of a `space` beside it: name each of its models "
        "too); a name that is not one of its models but a cell "
        "(a built-in or a plugin: `memsweep plugins`) adds an arm of that cell on the preset's protocol: "
        "its shared dimensions (the learning rates), the cell's own `grid`, the same seeds and budget",
    )
    seeds: list[int] | None = Field(
        default=None, description="seeds every point repeats over (whole numbers, not text)"
    )
    sampler: Sampler = "grid"
    sampler_seed: int = Field(
        default=0,
        ge=0,
        le=2**31 - 1,  # a resumed sampler draws from sampler_seed + its finished points, below numpy's 2**32
        description="the sampler's seed (a resumed study's draws on from it plus its finished points)",
    )
    max_trials: int | None = Field(
        default=None,
        ge=1,
        description="trials (points × seeds) to run: a sampler draws max_trials / len(seeds) points, rounded up "
        "to a whole point; on a grid, a cap (a larger grid is refused)",
    )
    concurrency: int = Field(
        default=2,
        ge=1,
        description="Ray units at once, each a fused bundle of trials (or one trial alone): not trials at once",
    )
    resources: Resources = Field(default_factory=Resources)
    scheduler: Literal["fifo", "asha"] = Field(
        default="fifo",
        description="fifo: every trial to its end; asha: Ray Tune's ASHA stops the worse points early, "
        "each point's seeds trained side by side as one unit and judged on their mean (`asha`)",
    )
    asha: Asha = Field(default_factory=Asha, description="the asha scheduler's settings")
    fused: bool = Field(
        default=True,
        description="train same-shape trials together as fused bundles (cells rnn, urnn, crnn, vprnn, fastrnn, "
        "sgornn, srnn: trainers.fused.cells; bit for bit as alone); "
        "false: one trial per Ray unit",
    )
    bundle_size: int | None = Field(
        default=None,
        ge=1,
        description="members per fused bundle at most; default: from the shapes, the memory and concurrency "
        "(not under asha, whose unit is one point's seeds)",
    )
    numerics: Numerics = Field(
        default_factory=default_mode,  # fixed when the spec is made, so a stored study keeps its mode
        description="which CPU kernels compute every trial's numbers (trainers/numerics.py): portable, the "
        "same numbers on any x86-64 CPU with AVX2 (the default, unless MEMSWEEP_NUMERICS says otherwise), "
        "or native, this CPU's fastest; one mode per study, part of each trial's identity",
    )
    success_fraction: float | None = Field(
        default=None,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="success: final validation loss < this × the task's random baseline (default 0.5, "
        "Orhan & Pitkow); not part of any trial, so studies that differ only in it share runs",
    )
    success_threshold: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="or: success when final validation loss < this"
    )
    extra_criteria: list[CriterionSpec] = Field(
        default_factory=list, description="more success criteria to report beside the study's own"
    )

    @model_validator(mode="before")
    @classmethod
    def _criterion_from_base(cls, data: Any) -> Any:
        """`base.success_fraction` / `base.success_threshold` (e.g. `--set success_fraction=0.25`) set
        the study's criterion: success is the study's, not a trial setting."""
        if not isinstance(data, dict) or not isinstance(data.get("base"), dict):
            return data
        base = dict(data["base"])
        data = {**data, "base": base}
        for key in ("success_fraction", "success_threshold", "numerics"):
            if key in base:
                value = base.pop(key)
                if data.get(key) is not None and data[key] != value:
                    what = "the study's numerics mode" if key == "numerics" else "the study's criterion"
                    raise ValueError(
                        f"{key} is given twice ({data[key]!r} and base.{key} = {value!r}); give it once, "
                        f"as `{key}` ({what}, not a trial setting)"
                    )
                data[key] = value
        return data

    def _places_setting(self, name: str) -> list[str]:
        """Where the spec sets or varies `name`: its dimensions and its models' fixed settings."""
        places: dict[str, Mapping[str, Any]] = {"base": self.base, "dims": self.dims}
        if self.space is not None:
            places["space.dims"] = self.space.dims
            for model, m in self.space.models.items():
                places[f"space.models.{model}.dims"], places[f"space.models.{model}.fixed"] = m.dims, m.fixed
        return [where for where, settings in places.items() if name in settings]

    @model_validator(mode="after")
    def _one_numerics_mode(self) -> StudySpec:
        """A study computes with one mode (its Ray workers run one): `numerics` is not a dimension or a
        model's setting (in `base` it is the study's own, moved there before)."""
        found = [where for where in self._places_setting("numerics") if where != "base"]
        if found:
            raise ValueError(
                f"numerics is one mode per study, not a dimension or a model's setting ({', '.join(found)}): "
                "set `numerics: portable` or `numerics: native` on the study, and run one study per mode "
                "to compare them"
            )
        return self

    @model_validator(mode="after")
    def _seeds_are_their_own_dimension(self) -> StudySpec:
        """Seeds are the study's `seeds`; a `seed` setting was overwritten by them without a word (base),
        or made trials of one hash (a dimension)."""
        found = self._places_setting("seed")
        if found:
            raise ValueError(
                f"seed is not a setting ({', '.join(f'{w}.seed' for w in found)}): every point runs once per "
                "seed of the study's `seeds`; write `seeds: [1, 2, 3]` (on the command line: --seeds 1,2,3)"
            )
        return self

    @field_validator("seeds", mode="before")
    @classmethod
    def _seeds_are_numbers(cls, v: Any) -> Any:
        return whole_seeds(v)

    @field_validator("seeds")
    @classmethod
    def _seeds_unique(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or len(set(v)) != len(v)):
            raise ValueError("seeds must be a non-empty list of distinct integers, e.g. [1, 2, 3]")
        if v is not None and not all(-(2**63) <= s < 2**63 for s in v):
            raise ValueError("each seed must fit a 64-bit integer (|seed| < 2**63)")
        return v

    @model_validator(mode="after")
    def _finite(self) -> StudySpec:
        """A NaN or an infinity anywhere in the settings is refused by its path (JSON would store it
        as null, and the trial would fail later)."""
        where = {"base": self.base, "dims": self.dims}
        if self.space is not None:
            where["space.dims"] = self.space.dims
            for name, m in self.space.models.items():
                where[f"space.models.{name}.fixed"] = m.fixed
                where[f"space.models.{name}.dims"] = m.dims
        for path, value in where.items():
            bad = _non_finite(value, path)
            if bad:
                raise ValueError(
                    f"{bad} is not a finite number; give a finite value (NaN and infinities are refused)"
                )
        return self

    @model_validator(mode="after")
    def _has_a_space(self) -> StudySpec:
        if self.preset is None and self.space is None:
            raise ValueError("give a `preset` (see `memsweep presets`) or an explicit `space` with `dims`")
        if self.sampler != "grid" and self.max_trials is None:
            raise ValueError(f"sampler {self.sampler!r} needs `max_trials` (points × seeds to run)")
        if self.success_fraction is not None and self.success_threshold is not None:
            raise ValueError(
                "give success_fraction (of the baseline) or success_threshold (a loss), not both"
            )
        return self

    @model_validator(mode="after")
    def _dims_have_values(self, info: ValidationInfo) -> StudySpec:
        """A dimension with no values (`dims: {lr: []}`, or `--dim lr=`, which reads as `[""]`) is refused
        by its path, with values to give: an empty text value reached a trial as `lr = ''`."""
        if (info.context or {}).get("stored"):
            return self
        for prefix, dims in self._written_dims():
            for key, raw in dims.items():
                if isinstance(raw, Mapping) and "values" not in raw:
                    continue  # a range
                values = raw["values"] if isinstance(raw, Mapping) else raw
                values = list(values) if isinstance(values, (list, tuple)) else [values]
                empty = [i for i, v in enumerate(values) if isinstance(v, str) and not v.strip()]
                if values and not empty:
                    continue
                given = [v for i, v in enumerate(values) if i not in empty]
                said = (
                    f"[{empty[0]}] = {values[empty[0]]!r} is no value (a comma too many?): give values only"
                    if given
                    else " has no values: give one or more"
                )
                example = [str(v) for v in given or self._example_values(key)]
                flag = f" (on the command line: --dim {key}={','.join(example)})" if prefix == "dims" else ""
                raise ValueError(
                    f"{prefix}.{key}{said}, e.g. {key}: [{', '.join(example)}]{flag}, or leave {prefix}.{key} out"
                )
        return self

    def _written_dims(self) -> list[tuple[str, Mapping[str, Any]]]:
        """The spec's dimensions as written, each with the path it is written at."""
        written: list[tuple[str, Mapping[str, Any]]] = [("dims", self.dims)]
        if self.space is not None:
            written.append(("space.dims", self.space.dims))
            written += [(f"space.models.{name}.dims", m.dims) for name, m in self.space.models.items()]
        return written

    def _example_values(self, key: str) -> list[Any]:
        """Two values of dimension `key` to show: the preset's first two, else placeholders."""
        if self.preset is not None:
            with contextlib.suppress(KeyError):
                for m in get_preset(self.preset).models:
                    if isinstance(dim := m.dims.get(key), Values):
                        return list(dim.values[:2])
        return ["value1", "value2"]

    @model_validator(mode="after")
    def _each_value_once(self, info: ValidationInfo) -> StudySpec:
        """A value given twice in a dimension (`lr: [1e-3, 0.001]`) is refused where it is written: the
        plan counted both, the study held their trials once; and so is a value that is no single value
        (a list: `search_spaces.space.check_single_values`). A stored spec (`STORED`), written before
        these rules, is read as it was (its space keeps each value once: `search_spaces.distinct`)."""
        if (info.context or {}).get("stored"):
            return self
        for prefix, dims in self._written_dims():
            for key, raw in dims.items():
                values = raw.get("values") if isinstance(raw, Mapping) else raw
                if isinstance(values, (list, tuple)):
                    check_single_values(values, f"{prefix}.{key}")
                    check_distinct(values, f"{prefix}.{key}")
        return self

    @model_validator(mode="after")
    def _space_models_named(self, info: ValidationInfo) -> StudySpec:
        """Beside a preset, `models` names the models a study keeps, its space's among them: a model of the
        space that `models` leaves out was dropped without a word (the study ran the preset's alone), so it
        is refused, naming it. A stored spec (`STORED`), made before this rule, is read as it was."""
        if (info.context or {}).get("stored") or self.preset is None or self.space is None or not self.models:
            return self
        written = {name: f"space.models.{name}" for name in self.space.models}
        if self.space.dims:
            written = {DEFAULT_MODEL: "space.dims", **written}
        left = [name for name in written if name not in self.models]
        if left:
            kept = list(dict.fromkeys([*self.models, *left]))
            them = "it" if len(left) == 1 else "them"
            raise ValueError(
                f"models: [{', '.join(self.models)}] leaves out the space's "
                f"{'model' if len(left) == 1 else 'models'} "
                f"{', '.join(f'{n!r} ({written[n]})' for n in left)}, so the study would not run {them}: "
                f"beside a preset, `models` names every model to run; add {them}: models: [{', '.join(kept)}] "
                f"(on the command line: --models {','.join(kept)}), or leave {them} out of space"
            )
        return self

    @model_validator(mode="after")
    def _asha_settings(self) -> StudySpec:
        """`asha` settings are the asha scheduler's."""
        if self.asha != Asha() and self.scheduler != "asha":  # (a stored spec holds the defaults)
            raise ValueError(
                f"asha: settings of the asha scheduler, but scheduler is {self.scheduler!r}: "
                "set `scheduler: asha`, or leave `asha` out"
            )
        return self

    @model_validator(mode="after")
    def _known_baselines(self) -> StudySpec:
        named = [(i, c.baseline) for i, c in enumerate(self.extra_criteria) if c.baseline != "task"]
        if named:
            known = self.baselines()
            for i, baseline in named:
                if baseline not in known:
                    raise ValueError(f"extra_criteria[{i}].baseline: {unknown_baseline(baseline, known)}")
        return self

    def criterion(self) -> Criterion:
        """The study's success criterion (default: half the random baseline, Orhan & Pitkow)."""
        return Criterion.of(fraction=self.success_fraction, threshold=self.success_threshold)

    def other_criteria(self, reference_baselines: Iterable[str] | None = None) -> list[Criterion]:
        """The criteria the study reports beside its own, each once and none its own: its `extra_criteria`,
        then its own fraction of each reference baseline its tasks report (copy: Arjovsky's; none beside a
        threshold, which is no fraction of anything). `reference_baselines`: the names its trials report
        (the summary's, from the ledger); by default those its tasks report (`baselines`), which the CLI
        asks a server for before its trials may have any."""
        main = self.criterion()
        others = [c.criterion() for c in self.extra_criteria]
        if main.fraction is not None:
            names = self.baselines()[1:] if reference_baselines is None else sorted(set(reference_baselines))
            others += [Criterion(fraction=main.fraction, baseline=name) for name in names]
        return [c for i, c in enumerate(others) if c != main and c not in others[:i]]

    def criterion_for(self, query: CriterionQuery = OWN) -> Criterion:
        """The study's criterion, or the one a request names instead (a threshold; or a fraction and/or
        a baseline, the missing one taken from the study's), for a recount: nothing trains. A baseline
        must be one the study's trials report."""
        if query.baseline is not None and query.baseline not in (known := self.baselines()):
            raise StudyError(f"baseline: {unknown_baseline(query.baseline, known)}")
        return judged_under(self.criterion(), query.fraction, query.threshold, query.baseline)

    def baselines(self) -> list[str]:
        """What a criterion may measure against: `task` (each task's random baseline), then the
        reference baselines the study's tasks report (copy: `arjovsky`)."""
        from trainers.tasks import TASKS

        space = self.search_space()
        tasks: set[str] = set()
        for m in space.models:
            dim = m.dims.get("task")
            tasks |= (
                {str(v) for v in dim.values}
                if isinstance(dim, Values)
                else {str({**space.base, **m.fixed}.get("task", TrainConfig.task))}
            )
        names = {name for t in tasks if t in TASKS for name in TASKS.get(t).reference_baseline_names}
        return ["task", *sorted(names)]

    @property
    def fuses(self) -> bool:
        """Whether same-shape trials train together as fused bundles (`bundle_size` does not apply under
        asha, whose unit is one point's seeds)."""
        return self.fused and (self.scheduler == "asha" or self.bundle_size != 1)

    @property
    def sizes_bundles(self) -> bool:
        """Whether its bundles are sized by a unit's memory (fused, and not one point each: asha)."""
        return self.fuses and self.scheduler != "asha"

    def search_space(self) -> SearchSpace:
        """The space this spec describes, with its overrides applied."""
        models: list[Model] = []
        base: dict[str, Any] = {}
        seeds: tuple[int, ...] = (1,)
        name, citation, description = self.name or "custom", "", ""
        arms: list[Model] = []
        own_models: set[str] = set()  # the space's models beside a preset's
        if self.preset is not None:
            preset = get_preset(self.preset)
            check_preset_choice(preset, self.base, self.models)
            models, base, seeds = list(preset.models), dict(preset.base), preset.seeds
            name, citation, description = preset.name, preset.citation, preset.description
            own_models = (
                set(self.space.models) | ({DEFAULT_MODEL} if self.space.dims else set())
                if self.space
                else set()
            )
            arms = cell_arms(preset, [n for n in self.models or [] if n not in own_models], self.dims)
            models += arms
        if self.space is not None:
            if self.space.dims:
                models.append(
                    Model(
                        DEFAULT_MODEL,
                        {},
                        {k: dim_from_dict(v, f"space.dims.{k}") for k, v in self.space.dims.items()},
                    )
                )
            for mname, m in self.space.models.items():
                dims = {k: dim_from_dict(v, f"space.models.{mname}.dims.{k}") for k, v in m.dims.items()}
                models.append(Model(mname, m.fixed, dims))
            if not models:
                raise SpaceError("space: give `dims` or `models`")
        space = SearchSpace(
            name=name,
            models=tuple(models),
            seeds=seeds,
            base=base,
            citation=citation,
            description=description,
        )
        dims = {k: dim_from_dict(v, f"dims.{k}") for k, v in self.dims.items()}
        check_trial_values(self.base)
        base = {**self.base, "numerics": self.numerics}
        settings = trial_settings(dataclasses.replace(space, base={**space.base, **base})) if dims else None
        space = space.with_overrides(
            base=base, seeds=self.seeds, dims=dims or None, models=self.models, settings=settings
        )
        # the preset's settings of its own cell (Orhan's nonlinearity) are its models'; an added cell's arm
        # takes only those the study itself sets, a model of the space those its cell takes
        preset_own = set(space.base) - set(self.base) if arms or own_models else set()
        return cell_settings_per_model(space, {m.name for m in arms}, preset_own, own_models, set(self.dims))


def _non_finite(value: Any, path: str) -> str | None:
    """The path of the first NaN or infinity in a JSON-like value, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path
    if isinstance(value, dict):
        for k, v in value.items():
            found = _non_finite(v, f"{path}.{k}")
            if found:
                return found
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = _non_finite(v, f"{path}[{i}]")
            if found:
                return found
    return None


def unknown_baseline(baseline: str, known: list[str]) -> str:
    return (
        f"{baseline!r} is not a baseline this study's trials report; valid: {', '.join(known)} "
        "(task: the task's random baseline, the papers' criterion)"
    )


def judged_under(
    own: Criterion, fraction: float | None = None, threshold: float | None = None, baseline: str | None = None
) -> Criterion:
    """The criterion a request names instead of a study's `own` (a threshold; or a fraction and/or a
    reference baseline, the missing one taken from `own`); `own` when it names none."""
    if fraction is None and threshold is None and baseline is None:
        return own
    if threshold is not None and (fraction is not None or baseline is not None):
        given = " and ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                             for k, v in (("fraction", fraction), ("baseline", baseline)) if v is not None)  # fmt: skip
        raise StudyError(
            f"threshold={threshold:g} with {given}: a run is judged under a loss threshold or under a fraction of "
            "a baseline, not both; give one, e.g. ?threshold=0.02 "
            "or ?fraction=0.25"
        )
    try:
        if threshold is not None:
            return Criterion.of(threshold=threshold)
        return Criterion.of(
            fraction=own.fraction if fraction is None else fraction, baseline=baseline or "task"
        )
    except ValueError as exc:
        raise StudyError(f"{exc}; e.g. ?fraction=0.25, or ?threshold=0.02") from None


def whole_seeds(v: Any) -> Any:
    """Seeds as given, refusing what would be read as a seed only by conversion: text (`"2"`, which
    pydantic reads as 2), a boolean, a fraction; and seeds that are no list (`seeds: "1,2"`), naming the
    list to write. (A NaN or an infinity is refused as every number is, as not finite.)"""
    if isinstance(v, (str, bytes, bool, int, float, Mapping)):
        raise ValueError(seeds_not_a_list(v))
    for i, s in enumerate(v if isinstance(v, list) else ()):
        if isinstance(s, (str, bool)) or (isinstance(s, float) and math.isfinite(s) and not s.is_integer()):
            kind = "text" if isinstance(s, str) else f"a {type(s).__name__}"
            raise ValueError(f"seed [{i}] = {s!r} is {kind}: a seed is a whole number, e.g. seeds: [1, 2, 3]")
    return v


def seeds_not_a_list(given: Any) -> str:
    """Why `seeds` given as text, one number or a mapping is refused, and the list to write instead: the
    whole numbers in the text (`"1,2"`: [1, 2]), the number (3: [3]), else [1, 2, 3]."""
    if isinstance(given, (str, bytes)):
        text = given.decode(errors="replace") if isinstance(given, bytes) else given
        kind = "text"
        parts = [p for p in re.split(r"[\s,;]+", text.strip().strip("[]()")) if p]
        seeds = [int(p) for p in parts] if parts and all(re.fullmatch(r"[-+]?\d+", p) for p in parts) else []
    elif isinstance(given, (bool, Mapping)):
        kind, seeds = "a boolean" if isinstance(given, bool) else "a mapping", []
    else:  # one number
        kind, seeds = "one number", [int(given)] if float(given).is_integer() else []
    fix = ", ".join(str(s) for s in seeds or (1, 2, 3))
    flag = f"--seeds{'=' if fix.startswith('-') else ' '}{fix.replace(' ', '')}"  # -1,2 is no option
    return (
        f"{given!r} is {kind}, not a list; write seeds: [{fix}] (seeds are a list of whole numbers, every "
        f'point trained once per seed; in JSON: "seeds": [{fix}]; on the command line: {flag})'
    )


def expected_trials(spec: Mapping[str, Any], total: int, state: str | None = None) -> int:
    """How many trials a study will have run: the `total` its ledger holds, or a sampled study's
    `max_trials` while its points are still being drawn (`spec`: as the ledger stores it). A `done`
    study draws no more: its total (a sampler over a smaller space of lists ends short of its budget,
    and it was listed as short of it when done)."""
    max_trials = spec.get("max_trials")
    if spec.get("sampler", "grid") != "grid" and isinstance(max_trials, int) and state != "done":
        return max(total, max_trials)
    return total


def stored_values_once(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A stored spec's data with each dimension's values once (`search_spaces.distinct`), as its space
    reads them: what an extension merges its changes into, so that a study stored before a value given
    twice was refused (`StudySpec._each_value_once`) can still be extended (its `space.dims` are no
    field an extension may change)."""
    data = dict(stored)

    def once(dims: Any) -> Any:
        if not isinstance(dims, Mapping):
            return dims
        return {
            k: list(distinct(v)) if isinstance(v, (list, tuple))
            else {**v, "values": list(distinct(v["values"]))} if isinstance(v, Mapping) and isinstance(v.get("values"), (list, tuple))
            else v
            for k, v in dims.items()
        }  # fmt: skip

    data["dims"] = once(data.get("dims") or {})
    if isinstance(data.get("space"), Mapping):
        space = dict(data["space"])
        space["dims"] = once(space.get("dims") or {})
        if isinstance(space.get("models"), Mapping):
            space["models"] = {
                name: {**m, "dims": once(m.get("dims") or {})} if isinstance(m, Mapping) else m
                for name, m in space["models"].items()
            }
        data["space"] = space
    return data


def load_spec(path: str | Path) -> StudySpec:
    """A spec from a YAML or JSON file; a file that cannot be read, or is no YAML, is refused naming it."""
    return StudySpec.model_validate(spec_data(path))
