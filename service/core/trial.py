"""A trial as a study plans it, a unit of trials as one Ray trial runs it, and what a unit reports.

A `TrialSpec` is one point × seed of a study: its identity (the config hash), its model (the arm of
the space it belongs to), the point's varied values and its resolved trial config. A study makes
them once, where it enumerates its trials (`service.study.search`), or reads them back from the ledger;
the ledger's rows, the packing into units and the workers all take that one record. Its point, every
seed of the same model and values, is `point_key`: the one key anything that groups trials by point uses.

A `Unit` is what one Ray trial runs (`service.study.worker.train_unit`): a fused bundle of same-shape
members (`trainers.fused.train_fused`), or members one after another. A unit reports `Evaluated`
and `Finished` events, which the driver records in the ledger and MLflow; every member stays its own
trial there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import trainers
from trainers import plugins

#: the objective of a failed member, in units of the task's baseline loss
FAILED_OBJECTIVE = 10.0


class StaleTrialError(ValueError):
    """A stored trial no longer resolves to the trial it was made as (another TRAINER_VERSION); the
    message says what to do."""


@dataclass(frozen=True)
class TrialSpec:
    """One trial of a study: identity, model, varied values (seed included) and resolved config."""

    config_hash: str
    model: str
    params: Mapping[str, Any]
    resolved: trainers.Resolved

    @classmethod
    def of(cls, model: str, params: Mapping[str, Any], resolved: trainers.Resolved) -> TrialSpec:
        return cls(resolved.config_hash(), model, dict(params), resolved)

    @classmethod
    def stored(
        cls, config_hash: str, model: str, params: Mapping[str, Any], config: Mapping[str, Any]
    ) -> TrialSpec:
        """A ledger row's trial, its stored config resolved again; refused when the trainers would
        now train something else under that hash (another TRAINER_VERSION)."""
        resolved = trainers.resolve(config)
        if resolved.config_hash() != config_hash:
            cfg = resolved.config
            used = plugins.identities(cfg.cell, cfg.task)
            also = (
                f"; or with other code of the plugins it uses (now {', '.join(used.values())}): a plugin "
                "edited or upgraded since"
                if used
                else ""
            )
            raise StaleTrialError(
                f"trial {config_hash} was made under another trainer version than this memsweep's "
                f"(TRAINER_VERSION {trainers.TRAINER_VERSION}; or, run on several threads, before every "
                f"thread flushed denormals: THREADED_VERSION{also}); its results would not be comparable. "
                "Create a new study from the same spec to run it under this version"
            )
        return cls(config_hash, model, dict(params), resolved)

    @property
    def config(self) -> dict[str, Any]:
        """The resolved config as the ledger stores it."""
        return self.resolved.to_dict()


#: a point of a study (`point_key`): its model, and its values but the seed, each as `value_key` writes it
PointKey = tuple[str, tuple[tuple[str, str], ...]]


def point_key(model: str, params: Mapping[str, Any]) -> PointKey:
    """A trial's point: its model and its varied values by `value_key`, its seed left out (a point is
    all its seeds). A point stored in two spellings (1.0, and 1 from an extension that wrote it so: one
    config hash per seed) is so one point to asha's units, best configs, the sampler and an extension's
    checks alike."""
    return model, tuple(sorted((k, value_key(v)) for k, v in params.items() if k != "seed"))


def seeded_point_key(model: str, params: Mapping[str, Any]) -> tuple[PointKey, str]:
    """A trial's point and its seed: the trial by its values rather than its hash (what an extension or a
    plan's record matches a stored trial by)."""
    return point_key(model, params), value_key(params.get("seed"))


def value_key(value: Any) -> str:
    """A point's value as trial identity compares it: a number by its value, so 1 and 1.0 are one (a
    field reads either as its type, `trainers.params.coerce`: one resolved config, one hash), an
    integral float as its int (an int as a float would lose digits past 2**53); anything else by its
    repr, a bool apart from the numbers and text apart from numbers (a text setting's "1" and "1.0" are
    two trials; a new study refuses a number written as text: `search.check_numbers_as_text`)."""
    if isinstance(value, float) and value.is_integer():
        return repr(int(value))
    return repr(value)


@dataclass(frozen=True)
class Unit:
    """The trials one Ray trial runs: as one fused bundle (`fused`), else one after another, or side by
    side in lockstep (`lockstep`: a point's seeds that a scheduler judges together at its rungs, asha).

    `known`: members already finished (a sampled point met again), by config hash; they are counted
    in the unit's objective, not trained again."""

    members: tuple[TrialSpec, ...]
    fused: bool = False
    known: Mapping[str, Known] = field(default_factory=dict)
    lockstep: bool = False


@dataclass(frozen=True)
class Known:
    """A member's result from before its unit, as the unit counts it (`service.study.worker.Reports`):
    its objective after each of its evaluations (`evaluations`), its final `objective` (None: pruned
    before any evaluation, nothing to count), and how many evaluations it had when a scheduler pruned
    it (None: it ended by itself). `known_of` makes it from a trial's record."""

    objective: float | None
    evaluations: tuple[float, ...] = ()
    pruned_at: int | None = None
    after_last: bool = False  # it ended after its last evaluation (a training-loss check), not with it

    def at(self, n: int) -> float | None:
        """Its objective as a report after n evaluations counts it: its n-th evaluation's, or its final
        one from the evaluation it ended with (and before any, n = 0)."""
        if self.objective is None:
            return None
        last = len(self.evaluations) + (1 if self.after_last else 0)
        return self.evaluations[n - 1] if 0 < n < last else self.objective


class Record(Protocol):
    """What a finished trial's record holds that a unit counts (a ledger row)."""

    status: str
    final_val_loss: float | None
    baseline_loss: float | None
    history: list[dict[str, Any]] | None
    steps: int | None


def known_of(t: Record) -> Known:
    """A finished trial's record (its status, final loss, baseline, evaluations and the steps it took)
    as a unit counts it."""
    history = t.history or []
    evaluations = tuple(objective(float(e["val_loss"]), t.baseline_loss, "done") for e in history)
    final = (
        None
        if t.status == "pruned" and not evaluations
        else objective(t.final_val_loss, t.baseline_loss, t.status)
    )
    after_last = bool(history) and t.steps is not None and t.steps > int(history[-1]["step"])
    return Known(final, evaluations, len(evaluations) if t.status == "pruned" else None, after_last)


@dataclass(frozen=True)
class Evaluated:
    """A member's evaluation, as it trains."""

    config_hash: str
    evaluation: trainers.Evaluation


@dataclass(frozen=True)
class Finished:
    """A member's result."""

    config_hash: str
    result: trainers.TrialResult


Event = Evaluated | Finished


def objective(final_val_loss: float | None, baseline: float | None, status: str) -> float:
    """Loss in units of the baseline (comparable across tasks); failures count as FAILED_OBJECTIVE, and a
    pruned trial's last evaluation stands for its loss."""
    if (
        status not in ("done", "pruned")
        or final_val_loss is None
        or not math.isfinite(final_val_loss)
        or not baseline
    ):
        return FAILED_OBJECTIVE
    return min(final_val_loss / baseline, FAILED_OBJECTIVE)
