"""What a plan answers (`service.planning.plan`): the trials per model, the units they pack into, the
budget in steps, each unit shape's calibration and the estimate of time. `POST /studies?dry_run=true`
and `memsweep plan` serve a `StudyPlan` as it is; a study keeps one in `studies.plan["planned"]`."""

from __future__ import annotations

from pydantic import BaseModel, Field


class PlanModel(BaseModel):
    """A model's part of a plan."""

    trials: int
    to_run: int = Field(description="trials not finished in the ledger already (those are reused)")
    units: int = Field(
        description="Ray units holding its trials (fused bundles, asha's points, single trials)"
    )
    budget_steps: list[int] | None = Field(description="[fewest, most] optimiser steps of its trials")
    fused: bool | None = Field(
        default=None,
        description="whether its trials train in fused bundles (its cell has a fused form: trainers.fused.cells, "
        "or a plugin cell's `fused`); false: one trial per unit; null: none of its trials is left to run",
    )


class PlanBudget(BaseModel):
    steps_per_trial: list[int] | None = Field(description="[fewest, most] optimiser steps of a trial")
    trial_steps: int = Field(description="steps over every trial to run (a bundle's members each count)")
    unit_steps: int = Field(
        description="steps over every unit (a bundle's step counts once): what the slots run"
    )
    evaluations: int = Field(description="validation passes over every trial to run")


class CalibrationPublic(BaseModel):
    """A shape's calibration: real training steps of its largest unit, timed on the node type."""

    bundle_size: int = Field(description="members of the calibrated unit")
    fused: bool
    node_type: str
    node: str | None = None
    device: str | None = None
    step_seconds: list[float] = Field(
        description="each timed training step of the whole unit (after a warm-up)"
    )
    eval_seconds: float | None = Field(description="one validation pass over `val_sequences` sequences")
    val_sequences: int
    val_scale: float = Field(description="the real validation set / val_sequences")
    setup_seconds: float = Field(description="before the first step (data, models, the warm-up's excess)")
    finish_seconds: float = Field(description="after the last evaluation (the trained matrices' analyses)")
    seconds: float = Field(description="how long the calibration took")


class PlanShape(BaseModel):
    """A distinct unit shape: the trial config without the values a grid varies, fused or not."""

    key: str = Field(description="the calibration cache's key (shape, fused, bundle size, trainer version)")
    description: str
    fused: bool
    bundle_size: int = Field(
        description="members calibrated together: its largest unit's when fused; 1 when a unit trains its "
        "members one at a time (alone, one after another or in lockstep), each paying that one's cost"
    )
    units: int
    trials: int
    cached: bool = Field(description="its calibration came from the ledger's cache")
    calibration: CalibrationPublic | None
    error: str | None = Field(description="why it has no calibration")


class PlanEstimate(BaseModel):
    """Compute and wall-clock time of the units to run, each with a [low, high] range."""

    complete: bool = Field(
        description="every unit's shape is calibrated (else the figures cover those that are)"
    )
    units_estimated: int
    units_missing: int
    training_seconds: float = Field(description="the units' training time, summed")
    training_seconds_range: tuple[float, float]
    trial_hours: float = Field(
        description="slot-hours: units' times with their overhead (× resources per unit)"
    )
    trial_hours_range: tuple[float, float]
    wall_seconds: float = Field(description="wall-clock at the study's concurrency")
    wall_seconds_range: tuple[float, float]
    how: str = Field(description="how the figures and their ranges are derived")


class UnitMemory(BaseModel):
    """The memory one unit may plan to use, measured where its units train: what sized its bundles."""

    device: str = Field(description="cpu or cuda: what the units train on there")
    bytes: int = Field(description="a unit's share of that device's free memory (packing's budget)")


class StudyPlan(BaseModel):
    """What a study would run and what it would cost; nothing was stored or trained (but calibrations)."""

    name: str
    sampler: str
    trainer_version: str
    trials: int | None = Field(
        description="trials the study holds (a sampled one: max_trials, rounded up to whole points × seeds)"
    )
    to_run: int
    reused: int = Field(description="trials a study of this ledger finished already: reused, not run")
    pruned_untrained: int = Field(
        default=0,
        description="asha: seeds added to points the scheduler stopped before, recorded pruned with them "
        "without training (neither run nor reused)",
    )
    by_model: dict[str, PlanModel]
    units: int = Field(
        description="Ray units: fused bundles, single trials, and units whose trials train unfused "
        "(asha's points whose seeds train in lockstep; a sampled point's seeds one after another)"
    )
    bundles: int = Field(description="units that train several trials as one fused bundle (of `units`)")
    unit_sizes: dict[str, int] = Field(
        description="members per unit → how many units: every unit, fused bundles or not (a unit of 1 is "
        "a single trial)",
    )
    bundle_sizes: dict[str, int] = Field(
        description="deprecated, the same as `unit_sizes` under its first name: it counts every unit, not "
        "only the fused bundles (kept for the clients that read it)",
        json_schema_extra={"deprecated": True},
    )
    budget: PlanBudget
    concurrency: int
    slots: int = Field(description="units at once: the concurrency, or fewer when the cluster fits fewer")
    resources: dict[str, float]
    node_type: str | None = Field(description="what the trials run on (CPU model × count, + GPU)")
    where_unknown: str | None = Field(
        default=None,
        description="why where the trials run could not be learnt (a Ray cluster that cannot be joined, "
        "…), so the plan has no estimate; None when it was (`memsweep plan` exits 1 when it was not)",
    )
    shapes: list[PlanShape]
    cached: bool = Field(description="every calibration came from the cache (nothing was measured now)")
    calibration_seconds: float = Field(description="time spent calibrating for this answer")
    estimate: PlanEstimate | None
    unit_memory: UnitMemory | None = Field(
        default=None,
        description="the memory each unit may use: its share of a node's free memory (measured on a node "
        "that runs them), the budget its bundle is sized to, not what it will use (None: not measured; "
        "packing assumed a device's memory)",
    )
    notes: list[str]
