"""What the REST API accepts and answers: one schema family per resource (Create / Public / …).

The answers computed elsewhere are typed where they are computed, and served here as they are: the
records of studies and trials (`service.application.records`), the success tables and best configurations (`service.reports.summary`), the comparison
(`service.reports.compare`), the plan (`service.planning.types`) and an MLflow run's links
(`service.tracking.links`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from service.application.records import StudyExtend as StudyExtend
from service.application.records import StudyExtended as StudyExtended
from service.application.records import StudyList as StudyList
from service.application.records import StudyPublic as StudyPublic
from service.application.records import StudySummary as StudySummary
from service.application.records import TrialCounts as TrialCounts
from service.application.records import TrialPage as TrialPage
from service.application.records import TrialPublic as TrialPublic
from service.core.spec import StudySpec
from service.planning.types import CalibrationPublic as CalibrationPublic
from service.planning.types import PlanBudget as PlanBudget
from service.planning.types import PlanEstimate as PlanEstimate
from service.planning.types import PlanModel as PlanModel
from service.planning.types import PlanShape as PlanShape
from service.planning.types import StudyPlan as StudyPlan
from service.reports.compare import ComparedStudy as ComparedStudy
from service.reports.compare import Comparison as Comparison
from service.reports.compare import ComparisonRow as ComparisonRow
from service.reports.summary import BestConfig as BestConfig
from service.reports.summary import BudgetCell as BudgetCell
from service.reports.summary import CriterionPublic as CriterionPublic
from service.reports.summary import SuccessBudget as SuccessBudget
from service.reports.summary import SuccessCell as SuccessCell
from service.reports.summary import SuccessTable as SuccessTable
from service.tracking.links import MlflowLinks as MlflowLinks

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
    param_counts: list[int] = Field(
        default_factory=list,
        description="the model's trainable parameters over its points, each distinct count once, ascending "
        "(its hidden sizes, its cell's settings; [] where its shapes come from data files: PTB's vocabulary)",
    )


class PresetPublic(PresetSummary):
    """A paper's grid: its size, citation and every value."""

    seeds: list[int]
    base: dict[str, Any]
    is_grid: bool
    models: dict[str, PresetModel]


# ----- plugins -------------------------------------------------------------------------------------
class PluginPublic(BaseModel):
    """A plugin cell or task installed on the server (trainers.plugins; docs/plugins.md)."""

    kind: Literal["cell", "task"]
    name: str = Field(description="the registry name it takes: a study's `cell` / `task`, or a model")
    value: str = Field(description="its entry point's object, module:Class")
    distribution: str
    version: str
    digest: str = Field(
        description="sha256 of its package's files but bytecode, hidden files and an editor's leftovers (16 hex digits)"
    )
    identity: str = Field(description="what enters the config hash of each trial that uses it")
    problem: str | None = Field(
        description="why it could not join (a study that names it is refused); null: it joined (`contract`: "
        "whether it holds its contract)"
    )
    edited: str | None = Field(
        default=None,
        description="why the server's copy is stale: the plugin changed on disk since the server loaded it, "
        "so a study that uses it is refused until `memsweep serve` restarts; null: the code on disk",
    )
    version_behind: str | None = Field(
        default=None,
        description="an editable install whose source (pyproject.toml) names another version than the one "
        "installed, which alone enters its identity: run `pip install -e PATH` again; null: none",
    )
    contract: list[str] = Field(
        default_factory=list,
        description="what breaks its contract, as `memsweep plugins check` and the door find it (a study that "
        "uses it is refused); []: it holds, or it was not checked (refused, or stale: `edited`)",
    )


class PluginListing(BaseModel):
    server: list[PluginPublic]
    nodes: dict[str, dict[str, str]] | None = Field(
        description='each Ray node that can run trials → {"kind:name": identity} of the plugins ready there; '
        "null before the server's Ray is up, and on an embedded Ray (this machine's are `server`)"
    )


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


class ErrorMessage(BaseModel):
    detail: str = Field(description="what went wrong and what to do next")
