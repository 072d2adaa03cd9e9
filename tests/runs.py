"""What the tests read back from a real MLflow server: one place for every tier (service, compose)."""

from __future__ import annotations

from typing import Any

from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient


def child_runs(uri: str, experiment_id: str, parent: str, every: bool = False) -> list[Any]:
    """The parent run's child runs (a study's trials); `every`: deleted ones too."""
    return MlflowClient(uri).search_runs(
        [experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent}'",
        run_view_type=ViewType.ALL if every else ViewType.ACTIVE_ONLY,
        max_results=1000,
    )
