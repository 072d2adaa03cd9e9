"""What the REST API accepts and answers: one schema family per resource (Create / Public / …)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from service.core.spec import StudySpec
from service.core.states import StudyState, TrialStatus
from trainers.result import Evaluation


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)  # SQLite drops the zone


UtcDatetime = Annotated[datetime, AfterValidator(_utc)]

# ----- studies -------------------------------------------------------------------------------------
StudyCreate = StudySpec  # a spec, or a preset with overrides (`models`, `dims`, `base`, `seeds`)

STUDY_CREATE_EXAMPLES: dict[str, Any] = {
    "preset": {
        "summary": "a paper's grid, reduced",
        "description": "Orhan & Pitkow's copy grid: two initialisers, two learning rates, two seeds, T=100.",
        "value": {
            "name": "copy100-chain-vs-orthogonal",
            "preset": "orhan2020-copy500",
            "models": ["chain", "orthogonal"],
            "base": {"seq_len": 100, "steps": 3000, "eval_every": 500},
            "dims": {"lr": [3e-4, 1e-4], "scale": [1.0]},
            "seeds": [1, 2],
        },
    },
    "space": {
        "summary": "an explicit grid",
        "value": {
            "name": "addition-chain-vs-identity",
            "space": {
                "models": {
                    "chain": {"fixed": {"init": "chain"}, "dims": {"lr": [1e-3, 3e-4]}},
                    "identity": {"fixed": {"init": "identity"}, "dims": {"lr": [1e-3, 3e-4]}},
                }
            },
            "base": {"task": "addition", "seq_len": 100, "steps": 2000},
            "seeds": [1, 2, 3],
        },
    },
    "tpe": {
        "summary": "a model-based search",
        "value": {
            "space": {"dims": {"lr": {"loguniform": [1e-5, 1e-3]}, "init": ["chain", "orthogonal"]}},
            "base": {"task": "copy", "seq_len": 100, "steps": 2000},
            "seeds": [1, 2],
            "sampler": "tpe",
            "max_trials": 40,
        },
    },
}


class StudyExtend(BaseModel):
    """Changes to a study's spec that add points: more seeds, values, models or trials. Only new points run."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"seeds": [1, 2, 3]}, {"dims": {"lr": [3e-4, 1e-4, 3e-5]}}]},
    )
    seeds: list[int] | None = Field(default=None, description="the new list of seeds (a superset)")
    dims: dict[str, Any] | None = Field(default=None, description="dimensions whose values to replace")
    models: list[str] | None = Field(default=None, description="the preset's models to run")
    base: dict[str, Any] | None = Field(default=None, description="trial settings to change (new points)")
    max_trials: int | None = Field(default=None, ge=1, description="a larger budget for a sampled study")


class TrialCounts(BaseModel):
    total: int
    pending: int
    running: int
    done: int
    failed: int
    pruned: int
    cancelled: int
    error: int = Field(
        description="trials whose worker, node or process died (not results; a resume retries them)"
    )
    succeeded: int
    finished: int = Field(description="done + failed + pruned")


class MlflowLinks(BaseModel):
    experiment_id: str | None = None
    run_id: str | None = Field(default=None, description="the study's parent run; trials are its children")
    experiment_url: str | None = None
    run_url: str | None = None


class StudyPublic(BaseModel):
    """A study as the ledger holds it, with its progress."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": "3f9c2a1b7d4e",
                    "name": "copy100-chain-vs-orthogonal",
                    "state": "running",
                    "error": None,
                    "queued": False,
                    "active": True,
                    "spec": {"preset": "orhan2020-copy500", "models": ["chain", "orthogonal"]},
                    "counts": {
                        "total": 8,
                        "pending": 3,
                        "running": 2,
                        "done": 3,
                        "failed": 0,
                        "pruned": 0,
                        "cancelled": 0,
                        "error": 0,
                        "succeeded": 2,
                        "finished": 3,
                    },
                    "expected_trials": 8,
                    "eta_seconds": 42.0,
                    "created_at": "2026-01-01T12:00:00Z",
                    "updated_at": "2026-01-01T12:01:00Z",
                    "mlflow": {
                        "experiment_id": "1",
                        "run_id": "a1b2c3",
                        "experiment_url": "http://127.0.0.1:5005/#/experiments/1/runs",
                        "run_url": "http://127.0.0.1:5005/#/experiments/1/runs/a1b2c3",
                    },
                }
            ]
        }
    )
    id: str
    name: str
    state: StudyState
    error: str | None = Field(description="why the study failed, or what its MLflow writes reported")
    queued: bool = Field(description="waiting for a free runner of this server")
    active: bool = Field(description="queued or running in this server (false once it has stopped)")
    spec: dict[str, Any]
    counts: TrialCounts
    expected_trials: int = Field(
        description="trials the study will hold (a sampled study adds them as it runs)"
    )
    eta_seconds: float | None = Field(
        description="time left at the current pace; null before the pace is known"
    )
    created_at: UtcDatetime
    updated_at: UtcDatetime
    mlflow: MlflowLinks
    plan: dict[str, Any] | None = Field(
        default=None,
        description="its plan when created (`planned`: trials, units, budget, estimate — the answer of "
        "POST /studies?dry_run=true), what its runs took (`actual`) and how close the estimate came "
        "(`accuracy`)",
    )


class StudyList(BaseModel):
    total: int
    items: list[StudyPublic]


class StudyExtended(BaseModel):
    added: int = Field(
        description="new trials in the ledger (a sampled study: the trials its budget grew by, drawn as it runs); "
        "0: nothing new, the study is left as it was"
    )
    study: StudyPublic


# ----- trials --------------------------------------------------------------------------------------
class TrialPublic(BaseModel):
    """A trial: its identity, and its result under the names of `trainers.TrialResult`'s fields."""

    id: int
    config_hash: str = Field(description="identity of the trial: the hash of its full resolved config")
    model: str
    params: dict[str, Any] = Field(description="the point's varied settings, seed included")
    status: TrialStatus
    reason: str | None = Field(description="why it failed, or was stopped: one line")
    traceback: str | None = Field(
        default=None, description="the traceback of the exception that ended it (with ?history=true)"
    )
    final_val_loss: float | None = Field(description="the last evaluation's validation loss")
    final_metric: float | None
    metric_name: str | None = Field(description="what final_metric measures (e.g. accuracy)")
    baseline_loss: float | None = Field(description="the task's random baseline, from its realised layout")
    reference_baselines: dict[str, float] | None = Field(description="other baselines the task reports")
    success_threshold: float | None = Field(description="the loss to beat under the study's criterion")
    success: bool | None = Field(
        description="final_val_loss < success_threshold (judged under the study's criterion); null until finished"
    )
    steps: int | None = Field(description="optimiser steps taken")
    budget_steps: int | None = Field(description="the budget in optimiser steps")
    early_stopped: bool | None = Field(description="stopped below early_stop_loss before the budget's end")
    seconds: float | None = Field(description="training time")
    param_count: int | None = Field(description="trainable parameters")
    henrici_index: float | None = Field(description="Henrici departure from normality d(W) of the trained W")
    profile: list[float] | None = Field(
        default=None, description="weight profile of the trained W over i − j (with ?history=true)"
    )
    history: list[Evaluation] | None = Field(
        default=None, description="every evaluation (with ?history=true)"
    )
    device: str | None = Field(description="what it trained on: cpu, cuda:0, …")
    node: str | None = Field(description="the Ray node it trained on")
    provenance: dict[str, str] | None = Field(
        default=None,
        description="where its numbers came from: numerics mode, CPU model and ATen capability, MKL's "
        "version and reproducibility setting, oneDNN's ISA limit, torch (and the GPU and CUDA)",
    )
    runs: int = Field(description="times the trial was started (1 for a trial run once, 0 when reused)")
    reused_from: int | None = Field(description="the trial whose finished result this one reuses")
    mlflow_run_id: str | None
    updated_at: UtcDatetime
    config: dict[str, Any] = Field(description="the full resolved trial config")


class CriterionPublic(BaseModel):
    """A success criterion: final validation loss below `fraction` × a baseline, or below `threshold`."""

    name: str
    fraction: float | None
    threshold: float | None
    baseline: str = Field(description="'task' (the task's random baseline) or a reference baseline's name")


class TrialPage(BaseModel):
    total: int = Field(description="trials that match the filters")
    offset: int
    limit: int
    criterion: CriterionPublic = Field(description="what `success` was judged under")
    items: list[TrialPublic]


# ----- answers -------------------------------------------------------------------------------------
class SuccessCell(BaseModel):
    trials: int = Field(description="runs: the trials that are not in error")
    finished: int
    failed: int
    errors: int = Field(description="trials whose worker, node or process died: no run, never counted as one")
    succeeded: int
    rate: float = Field(description="succeeded / trials")
    ci95: tuple[float, float] = Field(description="95 % Wilson score interval of the rate")


class SuccessTable(BaseModel):
    """Successful runs (final validation loss < threshold), counted over every trial of the study."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "criterion": {
                        "name": "0.5 × baseline",
                        "fraction": 0.5,
                        "threshold": None,
                        "baseline": "task",
                    },
                    "at_step": None,
                    "total": {
                        "trials": 4,
                        "finished": 4,
                        "failed": 0,
                        "errors": 0,
                        "succeeded": 2,
                        "rate": 0.5,
                        "ci95": [0.15, 0.85],
                    },
                    "by_model": {
                        "chain": {
                            "trials": 2,
                            "finished": 2,
                            "failed": 0,
                            "errors": 0,
                            "succeeded": 2,
                            "rate": 1.0,
                            "ci95": [0.34, 1.0],
                        },
                    },
                    "by_value": {
                        "chain": {
                            "lr": {
                                "0.0003": {
                                    "trials": 2,
                                    "finished": 2,
                                    "failed": 0,
                                    "errors": 0,
                                    "succeeded": 2,
                                    "rate": 1.0,
                                    "ci95": [0.34, 1.0],
                                }
                            }
                        }
                    },
                }
            ]
        }
    )
    criterion: CriterionPublic = Field(description="what counted as a success")
    at_step: int | None = Field(description="the budget the counts are taken at; null: each run's end")
    total: SuccessCell
    by_model: dict[str, SuccessCell]
    by_value: dict[str, dict[str, dict[str, SuccessCell]]] = Field(
        description="model → hyperparameter → value → counts"
    )


class BudgetCell(BaseModel):
    step: int
    succeeded: int
    trials: int
    rate: float
    ci95: tuple[float, float]


class SuccessBudget(BaseModel):
    """Successful runs per model against training steps: a run's loss at a budget of `step` steps is
    its last evaluation at or before it."""

    criterion: CriterionPublic
    steps: list[int]
    by_model: dict[str, list[BudgetCell]]


class BestConfig(BaseModel):
    """One point of the space, its seeds pooled, ranked by mean final validation loss."""

    model: str
    params: dict[str, Any]
    mean_final_val_loss: float
    sem: float = Field(description="standard error of the mean over the finished seeds")
    seeds: list[int]
    succeeded: int
    trials: int
    config_hashes: list[str]


# ----- presets -------------------------------------------------------------------------------------
class PresetSummary(BaseModel):
    name: str
    size: int | None = Field(description="trials (points × seeds); null for a space with ranges")
    size_per_model: dict[str, int] | None
    citation: str
    description: str


class PresetModel(BaseModel):
    fixed: dict[str, Any]
    dims: dict[str, Any] = Field(description='field → {"values": [...]} or a range')


class PresetPublic(PresetSummary):
    """A paper's grid: its size, citation and every value."""

    seeds: list[int]
    base: dict[str, Any]
    is_grid: bool
    models: dict[str, PresetModel]


# ----- health --------------------------------------------------------------------------------------
class Health(BaseModel):
    status: Literal["ok"] = "ok"
    version: str


class Check(BaseModel):
    ok: bool
    detail: str


class Readiness(BaseModel):
    ready: bool
    checks: dict[str, Check] = Field(description="database, ray, mlflow")


# ----- plans ---------------------------------------------------------------------------------------
class PlanModel(BaseModel):
    """A model's part of a plan."""

    trials: int
    to_run: int = Field(description="trials not finished in the ledger already (those are reused)")
    units: int = Field(description="Ray units (bundles or single trials) holding its trials")
    budget_steps: list[int] | None = Field(description="[fewest, most] optimiser steps of its trials")


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
    bundle_size: int = Field(description="members of its largest unit (the one calibrated)")
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


class StudyPlan(BaseModel):
    """What a study would run and what it would cost; nothing was stored or trained (but calibrations)."""

    name: str
    sampler: str
    trainer_version: str
    trials: int | None = Field(description="trials the study holds (a sampled one: max_trials)")
    to_run: int
    reused: int = Field(description="trials a study of this ledger finished already: reused, not run")
    by_model: dict[str, PlanModel]
    units: int = Field(description="Ray units: fused bundles and single trials")
    bundles: int = Field(description="units that train several trials as one fused bundle")
    bundle_sizes: dict[str, int] = Field(description="members per unit → how many units")
    budget: PlanBudget
    concurrency: int
    slots: int = Field(description="units at once: the concurrency, or fewer when the cluster fits fewer")
    resources: dict[str, float]
    node_type: str | None = Field(description="what the trials run on (CPU model × count, + GPU)")
    shapes: list[PlanShape]
    cached: bool = Field(description="every calibration came from the cache (nothing was measured now)")
    calibration_seconds: float = Field(description="time spent calibrating for this answer")
    estimate: PlanEstimate | None
    notes: list[str]


# ----- comparisons ---------------------------------------------------------------------------------
class ComparedStudy(BaseModel):
    study_id: str
    name: str
    state: StudyState
    criterion: CriterionPublic = Field(description="what counted as a success in this study's rows")
    trials: int
    numerics: list[str] = Field(
        description="the numerics modes its trials computed with (trainers/numerics.py; 'unrecorded' "
        "for trials of a memsweep before TRAINER_VERSION 7)"
    )
    machines: list[str] = Field(
        description="where its trials' numbers came from: CPU model and ATen capability (provenance)"
    )


class ComparisonRow(BaseModel):
    """One study's cell in one group, and its difference from the reference study's."""

    scope: Literal["group", "total"] = Field(description="a group of `by`, or all the trials")
    group: dict[str, str | None] = Field(
        description="field → value of this group (null: the trial lacks it; all null in total rows)"
    )
    study_id: str | None = Field(
        description="the study; null: pooled, every distinct run (config hash) of all the studies once, "
        "judged under the reference's criterion"
    )
    trials: int
    finished: int
    failed: int
    errors: int = Field(description="trials whose worker, node or process died: no run, not counted")
    succeeded: int
    rate: float = Field(description="succeeded / trials")
    ci95: tuple[float, float] = Field(description="95 % Wilson score interval of the rate")
    difference: float | None = Field(description="rate − the reference study's rate in this group")
    difference_ci95: tuple[float, float] | None = Field(
        description="95 % Newcombe hybrid score interval of the difference (independent samples: "
        "conservative when runs are shared)"
    )
    shared: int | None = Field(
        description="runs (config hashes) this study and the reference both hold here; in pooled rows, "
        "the runs more than one study holds"
    )


class Comparison(BaseModel):
    """Success counts of studies side by side, grouped by `by`, with differences from the first study."""

    by: list[str]
    at_step: int | None
    reference: str = Field(description="the study every difference is taken from (the first one named)")
    trainer_version: str
    studies: list[ComparedStudy]
    rows: list[ComparisonRow]
    notes: list[str] = Field(
        default_factory=list,
        description="what to know before reading the rows: the studies' numerics differ, or native "
        "numerics ran on different machines (their per-seed numbers are then not run-for-run comparable)",
    )
    mlflow: MlflowLinks | None = Field(
        default=None, description="the comparison's MLflow run, with ?log=true"
    )


class ErrorMessage(BaseModel):
    detail: str = Field(description="what went wrong and what to do next")
