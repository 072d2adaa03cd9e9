"""A comparison of studies as its own MLflow run: each study's success rate and interval per group."""

from __future__ import annotations

import re
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import TYPE_CHECKING, Any

from service.tracking.batches import log_batches, now_ms

if TYPE_CHECKING:
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient


def comparison_params(comparison: dict[str, Any]) -> list[Param]:
    """What was compared: the grouping, the reference, the step, and each study's criterion."""
    from mlflow.entities import Param

    params = [Param("by", ",".join(comparison["by"])), Param("reference", comparison["reference"])]
    params += [Param("at_step", str(comparison["at_step"]))]
    params += [Param(f"criterion.{s['study_id']}", s["criterion"]["name"]) for s in comparison["studies"]]
    return params


def comparison_metrics(comparison: dict[str, Any]) -> list[Metric]:
    """Each row's success rate, interval and difference, named `<study or pooled>.<group or total>`."""
    from mlflow.entities import Metric

    ts = now_ms()
    metrics = []
    for row in comparison["rows"]:
        where = ".".join(str(v) for v in row["group"].values()) if row["scope"] == "group" else "total"
        who = row["study_id"] or "pooled"
        name = re.sub(r"[^\w\-. /]", "_", f"{who}.{where}")  # what MLflow allows in a name
        if row["rate"] is not None:  # none finished: no estimate to log
            metrics.append(Metric(f"success_rate.{name}", float(row["rate"]), ts, 0))
        metrics += [
            Metric(f"success_ci95_low.{name}", float(row["ci95"][0]), ts, 0),
            Metric(f"success_ci95_high.{name}", float(row["ci95"][1]), ts, 0),
        ]
        if row["difference"] is not None:
            metrics.append(Metric(f"difference.{name}", float(row["difference"]), ts, 0))
    return metrics


def write_comparison(
    client: MlflowClient, experiment_id: str, comparison: dict[str, Any], table_csv: str, figure: bytes
) -> str:
    """A comparison's run, finished: its params and metrics, `comparison.csv`, `comparison.json` and
    `plots/comparison.png`; its run id."""
    studies = comparison["studies"]
    run = client.create_run(
        experiment_id,
        run_name=f"compare {' vs '.join(s['name'] for s in studies)}",
        tags={
            "memsweep.kind": "comparison",
            "memsweep.studies": ",".join(s["study_id"] for s in studies),
            "memsweep.criterion": "; ".join(s["criterion"]["name"] for s in studies),
            "memsweep.trainer_version": str(comparison["trainer_version"]),
        },
    )
    run_id = str(run.info.run_id)
    log_batches(client, run_id, comparison_params(comparison), comparison_metrics(comparison))
    client.log_text(run_id, table_csv, "comparison.csv")
    client.log_dict(run_id, comparison, "comparison.json")
    with TemporaryDirectory() as tmp:
        path = Path(tmp) / "comparison.png"
        path.write_bytes(figure)
        client.log_artifact(run_id, str(path), "plots")
    client.set_terminated(run_id, status="FINISHED")
    return run_id
