"""What Ray runs: one *unit* of trials (a Ray trial), each member still its own trial everywhere else.

A unit is a list of member trial configs. Grid studies send one member per unit; model-based
samplers send one point × all its seeds (the searcher sees the seed-averaged objective). Issue #7's
fused bundles will send K same-shape members. Members report through `tune.report` with their
config hash; the driver (service.engine) is the only writer of the ledger and MLflow.
"""

from __future__ import annotations

import math
from typing import Any

import torch

import trainers
from service.spec import materialize

FAILED_OBJECTIVE = 10.0  # objective of a failed member, in units of the task's baseline loss


def members_of(config: dict[str, Any], context: dict[str, Any]) -> list[dict[str, Any]]:
    """The member trials of a Ray trial's config: given explicitly (grid), or built from a sampled point."""
    if "unit" in config:
        return list(config["unit"]["members"])
    model = config["model"]
    prefix = f"{model}."
    point = {k[len(prefix) :]: v for k, v in config.items() if k.startswith(prefix)}
    settings = {**context["base"], **context["models"][model]["fixed"], **point}
    members = []
    for seed in context["seeds"]:
        resolved = materialize({**settings, "seed": seed})
        members.append(
            {
                "key": resolved.config_hash(),
                "model": model,
                "params": {**point, "seed": seed},
                "config": resolved.to_dict(),
            }
        )
    return members


def objective(final_val_loss: float | None, baseline: float, status: str) -> float:
    """Loss in units of the baseline (comparable across tasks); failures count as FAILED_OBJECTIVE."""
    if status != "ok" or final_val_loss is None or not math.isfinite(final_val_loss):
        return FAILED_OBJECTIVE
    return min(final_val_loss / baseline, FAILED_OBJECTIVE)


def run_unit(config: dict[str, Any], context: dict[str, Any]) -> None:
    """Ray Tune function trainable: train every member in turn, reporting each evaluation and result."""
    from ray import tune

    from trainers.analysis import henrici_index, network_profile

    finished: dict[str, float] = dict(context.get("finished", {}))
    objectives: list[float] = []
    reported = False
    for member in members_of(config, context):
        key = member["key"]
        if key in finished:  # already in the ledger (resume / reuse): count it, don't re-run it
            objectives.append(finished[key])
            continue
        cfg = {**member["config"], "threads": context.get("threads", 1)}
        resolved = trainers.resolve(cfg)
        baseline = resolved.make_task().baseline_loss

        def report(e: trainers.Evaluation, key: str = key, baseline: float = baseline) -> None:
            tune.report(
                {
                    "member": key,
                    "kind": "eval",
                    "step": e.step,
                    "epoch": e.epoch,
                    "train_loss": e.train_loss,
                    "val_loss": e.val_loss,
                    "metric": e.metric,
                    "seconds": e.seconds,
                    "objective": objective(e.val_loss, baseline, "ok"),
                }
            )

        result = trainers.train(resolved, report)
        reported = True
        w = result.recurrent_matrix
        profile = None
        if w is not None and result.status == "ok":
            # Orhan & Pitkow Figs. 5-6: a unit pulse into every unit, 100 free steps, units ordered by peak time
            nonlinearity = str(resolved.config.cell_params.get("nonlinearity") or "linear")
            profile = network_profile(w, torch.ones(w.shape[0]), nonlinearity=nonlinearity).mean
        objectives.append(objective(result.final_val_loss, baseline, result.status))
        tune.report(
            {
                "member": key,
                "kind": "final",
                "status": result.status,
                "reason": result.reason,
                "final_val_loss": result.final_val_loss,
                "final_metric": result.final_metric,
                "baseline_loss": result.baseline_loss,
                "success_threshold": result.success_threshold,
                "steps": result.steps,
                "train_seconds": result.seconds,
                "henrici": henrici_index(w) if w is not None else None,
                "profile": profile,
                "recurrent_matrix": w.tolist() if w is not None else None,
                "objective": sum(objectives) / len(objectives),
            }
        )
    if not reported:  # every member was already finished: the searcher still needs the objective
        tune.report({"kind": "unit", "objective": sum(objectives) / max(len(objectives), 1)})
