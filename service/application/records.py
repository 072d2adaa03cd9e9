"""The typed records of studies and trials, as the study service answers them (`study_service`) and the
REST API serves them (`service.api.schemas` re-exports them): one family per resource."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from service.core.spec import whole_seeds
from service.core.states import StudyState, TrialStatus
from service.reports.summary import CriterionPublic
from service.store.models import utc
from service.tracking.links import MlflowLinks
from trainers.result import Evaluation

UtcDatetime = Annotated[datetime, AfterValidator(utc)]


# ----- studies -------------------------------------------------------------------------------------
class StudyExtend(BaseModel):
    """Changes to a study's spec that add points: more seeds, values, models or trials. Only new points run."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"seeds": [1, 2, 3]}, {"dims": {"lr": [3e-4, 1e-4, 3e-5]}}]},
    )
    seeds: list[int] | None = Field(default=None, description="the new list of seeds (a superset)")

    @field_validator("seeds", mode="before")
    @classmethod
    def _seeds_are_numbers(cls, v: Any) -> Any:
        return whole_seeds(v)

    dims: dict[str, Any] | None = Field(
        default=None,
        description="dimensions whose values to replace: each one's values so far and the new ones (an extension "
        "that leaves out values the study's trials hold is refused)",
    )
    models: list[str] | None = Field(default=None, description="the preset's models to run")
    base: dict[str, Any] | None = Field(
        default=None,
        description="trial settings to change, for new points only: a change that would train a point the "
        "study holds again under other settings is refused (create a new study for it)",
    )
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


#: a study as `GET /studies` lists it (the OpenAPI example of `StudySummary`, and the start of `StudyPublic`'s)
SUMMARY_EXAMPLE: dict[str, Any] = {
    "id": "3f9c2a1b7d4e",
    "name": "copy100-chain-vs-orthogonal",
    "state": "running",
    "error": None,
    "queued": False,
    "waiting": None,
    "active": True,
    "counts": {
        "total": 8, "pending": 3, "running": 2, "done": 3, "failed": 0, "pruned": 0, "cancelled": 0,
        "error": 0, "succeeded": 2, "finished": 3,
    },
    "expected_trials": 8,
    "created_at": "2026-01-01T12:00:00Z",
    "updated_at": "2026-01-01T12:01:00Z",
}  # fmt: skip


class StudySummary(BaseModel):
    """A study as `GET /studies` lists it: who it is, its state and progress. The full record — the
    spec, the plan, the ETA, the MLflow links — is `GET /studies/{id}`."""

    model_config = ConfigDict(json_schema_extra={"examples": [SUMMARY_EXAMPLE]})
    id: str
    name: str
    state: StudyState
    error: str | None = Field(description="why the study failed, or what its MLflow writes reported")
    queued: bool = Field(description="waiting for a free runner of this server")
    waiting: str | None = Field(
        default=None,
        description="what a queued study waits for, when this server knows: its plan's calibrations, "
        "which may wait for the CPUs of the studies running here",
    )
    active: bool = Field(description="queued or running in this server (false once it has stopped)")
    counts: TrialCounts
    expected_trials: int = Field(
        description="trials the study will hold (a sampled study adds them as it runs)"
    )
    created_at: UtcDatetime
    updated_at: UtcDatetime


class StudyPublic(StudySummary):
    """A study as the ledger holds it, with its progress: its summary, and its spec, ETA, MLflow links
    and plan."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    **SUMMARY_EXAMPLE,
                    "spec": {"preset": "orhan2020-copy500", "models": ["chain", "orthogonal"]},
                    "eta_seconds": 42.0,
                    "mlflow": {
                        "experiment_id": "1",
                        "run_id": "a1b2c3",
                        "experiment_url": "http://127.0.0.1:5005/#/experiments/1/runs?workflowType=machine_learning",
                        "run_url": "http://127.0.0.1:5005/#/experiments/1/runs/a1b2c3?workflowType=machine_learning",
                    },
                }
            ]
        }
    )
    spec: dict[str, Any]
    eta_seconds: float | None = Field(
        description="time left at the current pace; null before the pace is known"
    )
    mlflow: MlflowLinks
    plan: dict[str, Any] | None = Field(
        default=None,
        description="its plan when created (`planned`: trials, units, budget, estimate — the answer of "
        "POST /studies?dry_run=true), what its runs took (`actual`) and how close the estimate came "
        "(`accuracy`)",
    )


class StudyList(BaseModel):
    """A page of studies, newest first, each as a summary (`GET /studies/{id}` has the full record)."""

    total: int = Field(description="studies that match the filter, on every page")
    offset: int
    limit: int
    items: list[StudySummary]


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
    seconds: float | None = Field(
        description="training time: a fused bundle's whole time for each of its members "
        "(`provenance.bundle_members` says how many shared it); a trial alone or in lockstep (asha), its own"
    )
    param_count: int | None = Field(description="trainable parameters")
    henrici_index: float | None = Field(description="Henrici departure from normality d(W) of the trained W")
    profile: list[float] | None = Field(
        default=None, description="weight profile of the trained W over i − j (with ?history=true)"
    )
    history: list[Evaluation] | None = Field(
        default=None,
        description="every evaluation (with ?history=true); a running trial's so far (the ledger takes "
        "them as it trains, some seconds behind)",
    )
    last_evaluation: Evaluation | None = Field(
        default=None,
        description="its latest evaluation: where a running trial has got to (some seconds behind, as "
        "`history`), or a finished one's last",
    )
    device: str | None = Field(description="what it trained on: cpu, cuda:0, …")
    node: str | None = Field(
        description="the Ray node it trained on: host name/IP address (the head of its Ray node id)"
    )
    provenance: dict[str, str] | None = Field(
        default=None,
        description="where its numbers came from: numerics mode, CPU model and ATen capability, MKL's "
        "version and reproducibility setting, oneDNN's ISA limit, torch (and the GPU and CUDA)",
    )
    runs: int = Field(description="times the trial was started (1 for a trial run once, 0 when reused)")
    reused_from: int | None = Field(description="the trial whose finished result this one reuses")
    trained_by: str | None = Field(
        default=None,
        description="a pending trial another running study trains now (the same config): that study's id; "
        "this one takes its result when it finishes (`reused_from`), instead of training it a second time",
    )
    mlflow_run_id: str | None
    updated_at: UtcDatetime
    config: dict[str, Any] = Field(description="the full resolved trial config")


class TrialPage(BaseModel):
    total: int = Field(description="trials that match the filters")
    offset: int
    limit: int
    criterion: CriterionPublic = Field(description="what `success` was judged under")
    items: list[TrialPublic]
