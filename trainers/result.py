"""A trial's result: the one record `train` and `train_fused` return, and that the service carries
through Ray, stores in the ledger (one column per field), serves over REST and logs to MLflow, under
the same field names everywhere.

    result = train(config)                  # TrialResult
    result.to_dict(history=True)            # JSON-ready: every field but the trained matrices
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # the trained matrices' type only: a result is read (ledger, REST) without torch
    import torch

#: how a trial ended: trained to the end of its budget or to its early stop (`done`), stopped by a
#: training failure with its reason (`failed`), or stopped by a study's scheduler (`pruned`)
ResultStatus = Literal["done", "failed", "pruned"]


@dataclass(frozen=True)
class Evaluation:
    """One validation pass, as handed to `report`."""

    step: int
    epoch: float  # steps / steps-per-epoch
    train_loss: float  # mean training loss since the previous evaluation
    val_loss: float
    metric: float | None  # the task's metric on the validation set (e.g. accuracy)
    seconds: float  # its own training time since it started (in lockstep, its pauses not counted)
    # the learning rate of the step just taken, where the trial's rate moves (`trainers.optim.LearningRate`:
    # a drop, a decay); None, and left out of `to_dict`, at a constant rate
    lr: float | None = None

    @classmethod
    def at(
        cls,
        step: int,
        steps_per_epoch: int,
        train_loss: float,
        val_loss: float,
        metric: float | None,
        started: float,
        lr: float | None = None,
    ) -> Evaluation:
        """The evaluation at `step`, timed now from `started` (a perf_counter reading)."""
        seconds = time.perf_counter() - started
        return cls(step, step / steps_per_epoch, train_loss, val_loss, metric, seconds, lr)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if self.lr is None:  # a constant rate: the history as it always was
            del data["lr"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Evaluation:
        return cls(
            int(data["step"]), float(data["epoch"]), float(data["train_loss"]), float(data["val_loss"]),
            None if data.get("metric") is None else float(data["metric"]), float(data.get("seconds") or 0.0),
            None if data.get("lr") is None else float(data["lr"]),
        )  # fmt: skip


@dataclass
class TrialResult:
    """What one trial's training produced (its identity — config, hash — stays with the caller)."""

    status: ResultStatus = "done"
    reason: str | None = None  # why it failed: one line for people
    traceback: str | None = None  # the exception's whole traceback, when one ended it
    final_val_loss: float | None = None  # the last evaluation's validation loss (Orhan: hist_val_loss[-1])
    final_metric: float | None = None
    metric_name: str | None = None
    baseline_loss: float | None = None  # the task's random baseline, from its realised layout
    reference_baselines: dict[str, float] = field(default_factory=dict)  # others the task reports
    steps: int = 0  # optimiser steps taken
    budget_steps: int = 0
    early_stopped: bool = False
    seconds: float = 0.0  # training time
    param_count: int = 0  # trainable parameters
    henrici_index: float | None = None  # Henrici departure from normality d(W) of the trained W
    profile: list[float] | None = None  # weight profile over i − j of the trained W (Orhan Figs. 5-6)
    history: list[Evaluation] = field(default_factory=list)
    device: str | None = None  # what it trained on: cpu, cuda:0, …
    # where its numbers came from: numerics mode, CPU and ATen capability, MKL, torch (trainers.numerics)
    provenance: dict[str, str] | None = None
    node: str | None = None  # where it trained: the Ray node (set by the service's worker)
    recurrent_matrix: torch.Tensor | None = None  # the trained W [N, N] (not in `to_dict`)
    input_matrix: torch.Tensor | None = None  # the trained V [N, d] (not in `to_dict`)

    def to_dict(self, history: bool = True) -> dict[str, Any]:
        """JSON-ready fields (no tensors); the history as a list of dicts unless `history` is False."""
        out = {name: getattr(self, name) for name in RECORDED_FIELDS if name != "history"}
        if history:
            out["history"] = [e.to_dict() for e in self.history]
        return out


#: the fields a result records (the ledger's result columns, REST's and MLflow's names)
RECORDED_FIELDS = tuple(
    f.name for f in dataclasses.fields(TrialResult) if f.name not in ("recurrent_matrix", "input_matrix")
)

#: `report(k, evaluation)`: member k's every evaluation, once (`train_fused`, `train_lockstep`)
MemberReport = Callable[[int, Evaluation], Any]
#: `finished([(k, result), …])`: members' final results, each once, as soon as they are final (those
#: that became final together in one call)
MembersFinished = Callable[[list[tuple[int, TrialResult]]], Any]


def member_reporter(report: MemberReport | None, k: int) -> Callable[[Evaluation], Any] | None:
    """Member k's own `report(evaluation)`, from the members' `report(k, evaluation)` (None: none)."""
    return None if report is None else (lambda evaluation: report(k, evaluation))
