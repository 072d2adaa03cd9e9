"""A study's parent run: made with its spec, its counts as the study goes, and at its end the summary,
figures and final status."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import TYPE_CHECKING, Any

from service.tracking.batches import flatten, log_batches, now_ms

if TYPE_CHECKING:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

#: a success table's totals among the parent run's counts, as the study goes and again at its end (the
#: summary: `finished` was left out of it, so the last count of finished runs was the last throttled
#: progress write's, behind by up to its interval's trials)
TOTALS = ("trials", "finished", "succeeded", "failed", "pruned")


def create_parent(
    client: MlflowClient, experiment_id: str, study_id: str, name: str, spec: dict[str, Any]
) -> str:
    """A study's parent run, its spec as params: its run id."""
    from mlflow.entities import Param

    run = client.create_run(
        experiment_id,
        run_name=f"study {name} [{study_id}]",
        tags={"memsweep.study_id": study_id, "memsweep.kind": "study"},
    )
    params = [Param(k, v) for k, v in flatten({"spec": spec}).items()]
    try:
        log_batches(client, run.info.run_id, params=params)
    except Exception:  # the run is made again at the next try: this one would stay RUNNING, unowned
        with contextlib.suppress(Exception):
            client.set_terminated(run.info.run_id, status="FAILED")
            client.delete_run(run.info.run_id)
        raise
    return str(run.info.run_id)


def count_metrics(table: dict[str, Any], totals: Sequence[str], ts: int) -> list[Metric]:
    """A success table's counts: its `totals`, then success_count.<model> per model."""
    from mlflow.entities import Metric

    metrics = [Metric(k, float(table["total"][k]), ts, 0) for k in totals]
    metrics += [
        Metric(f"success_count.{model}", float(cell["succeeded"]), ts, 0)
        for model, cell in table["by_model"].items()
    ]
    return metrics


def write_progress(client: MlflowClient, parent_run_id: str, table: dict[str, Any]) -> None:
    """The parent run's counts as the study goes (a success table), each a new point of its metric."""
    log_batches(client, parent_run_id, metrics=count_metrics(table, TOTALS, now_ms()))


def criterion_slug(criterion: dict[str, Any]) -> str:
    """A criterion as a metric-name part: `0.5x_arjovsky`, `loss_lt_0.02`."""
    if criterion.get("threshold") is not None:
        return f"loss_lt_{criterion['threshold']:g}"
    return f"{criterion['fraction']:g}x_{criterion['baseline']}"


#: the parent run's curve of successes against budget, one per model: its steps are budgets
CURVE = "success_vs_budget."


def summary_metrics(summary: dict[str, Any]) -> list[Metric]:
    """A finished study's summary as the parent run's metrics: the counts, then per model its success
    rate and interval, Henrici index, successes against budget (`CURVE`) and under the other criteria."""
    from mlflow.entities import Metric

    ts = now_ms()
    table = summary["success"]
    metrics = count_metrics(table, TOTALS, ts)
    for model, cell in table["by_model"].items():
        if cell["rate"] is not None:  # none finished: no estimate to log
            metrics.append(Metric(f"success_rate.{model}", float(cell["rate"]), ts, 0))
        metrics += [
            Metric(f"success_ci95_low.{model}", float(cell["ci95"][0]), ts, 0),
            Metric(f"success_ci95_high.{model}", float(cell["ci95"][1]), ts, 0),
            Metric(f"trials.{model}", float(cell["trials"]), ts, 0),
            Metric(f"finished.{model}", float(cell["finished"]), ts, 0),
        ]
        if cell.get("raised"):  # runs an exception ended, counted in the rate as not succeeded
            metrics.append(Metric(f"raised.{model}", float(cell["raised"]), ts, 0))
    for model, h in summary.get("henrici_index", {}).items():
        metrics += [
            Metric(f"henrici_mean.{model}", float(h["mean"]), ts, 0),
            Metric(f"henrici_sem.{model}", float(h["sem"]), ts, 0),
        ]
    if summary.get("best"):
        metrics.append(
            Metric("best_mean_final_val_loss", float(summary["best"][0]["mean_final_val_loss"]), ts, 0)
        )
    # successes against budget: one metric per model, its step the budget (the UI draws the curve)
    for model, rows in summary.get("success_vs_budget", {}).get("by_model", {}).items():
        metrics += [Metric(f"{CURVE}{model}", float(r["succeeded"]), ts, int(r["step"])) for r in rows]
    for other in summary.get("success_other_criteria", []):
        slug = criterion_slug(other["criterion"])
        metrics += [
            Metric(f"success_count.{model}.{slug}", float(cell["succeeded"]), ts, 0)
            for model, cell in other["by_model"].items()
        ]
    return metrics


def first_curves(
    client: MlflowClient, parent_run_id: str, metrics: list[Metric], status: str
) -> list[Metric]:
    """`metrics` less the curve's points the parent run holds already, and less every curve point
    unless the study ended `done`. A metric's history only grows (MLflow 3.17 deletes runs, tags and
    experiments, never a metric's point), and the UI draws every point of it: written again after an
    extension, the curve held both counts at each budget whose count moved (4, then 8 at step 1,500).
    So a model's curve is a metric once, the study as it first ended done (an interrupted study's counts
    are partial); the curve as the study stands is `CURVE_TABLE` and the figure, rewritten at every end.
    A curve a fault cut short (`write_summary` sends each model's in requests of its own, so it lands
    whole unless it has more points than one request takes) gets the budgets it lacks from the next write."""
    if status != "FINISHED":
        return [m for m in metrics if not m.key.startswith(CURVE)]
    held = {
        key: {m.step for m in client.get_metric_history(parent_run_id, key)}
        for key in client.get_run(parent_run_id).data.metrics
        if key.startswith(CURVE)
    }
    return [m for m in metrics if m.step not in held.get(m.key, ())]


#: the parent run's artifact of the curve as the study stands: one row per model and budget
CURVE_TABLE = "success_vs_budget.csv"
CURVE_COLUMNS = ("model", "step", "succeeded", "finished", "trials", "rate", "ci95_low", "ci95_high")


def curve_table(curve: dict[str, Any]) -> str:
    """Successes against budget (`summary["success_vs_budget"]`) as CSV, its header the first line:
    MLflow's artifact view draws a .csv as a table only then (`tables.to_csv`'s `#` lines make it text)."""
    buf = io.StringIO()
    writer = csv.writer(buf, quoting=csv.QUOTE_NONNUMERIC, lineterminator="\n")
    writer.writerow(CURVE_COLUMNS)
    for model, cells in curve["by_model"].items():
        for cell in cells:
            row = {"model": model, **cell, "ci95_low": cell["ci95"][0], "ci95_high": cell["ci95"][1]}
            writer.writerow(["" if row.get(c) is None else row[c] for c in CURVE_COLUMNS])
    return buf.getvalue()


def write_summary(
    client: MlflowClient, parent_run_id: str, summary: dict[str, Any], figures: dict[str, bytes], status: str
) -> None:
    """A finished study on its parent run: the summary's metrics (its curve once: `first_curves`),
    `summary.json`, the curve as `CURVE_TABLE`, the figures under `plots/`, the best config (`{"model",
    "params"}`), criterion and trainer version as tags; then its final `status`."""
    metrics = first_curves(client, parent_run_id, summary_metrics(summary), status)
    log_batches(client, parent_run_id, metrics=[m for m in metrics if not m.key.startswith(CURVE)])
    for model in summary["success_vs_budget"].get("by_model", {}):  # each curve whole, or not at all
        log_batches(client, parent_run_id, metrics=[m for m in metrics if m.key == f"{CURVE}{model}"])
    client.log_dict(parent_run_id, summary, "summary.json")
    if summary["success_vs_budget"]["steps"]:
        client.log_text(parent_run_id, curve_table(summary["success_vs_budget"]), CURVE_TABLE)
    with TemporaryDirectory() as tmp:
        for name, data in figures.items():
            path = os.path.join(tmp, name)
            Path(path).write_bytes(data)
            client.log_artifact(parent_run_id, path, "plots")
    if summary.get("best"):  # of which model: a study of several models gave a config without it
        best = {key: summary["best"][0][key] for key in ("model", "params")}
        client.set_tag(parent_run_id, "memsweep.best_config", json.dumps(best)[:4000])
    client.set_tag(parent_run_id, "memsweep.criterion", summary["success"]["criterion"]["name"])
    client.set_tag(parent_run_id, "memsweep.trainer_version", str(summary.get("trainer_version")))
    client.set_terminated(parent_run_id, status=status)
