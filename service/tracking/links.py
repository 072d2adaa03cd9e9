"""Where an MLflow run is: its ids and its links in the UI, as the REST answers show them (a study's
parent run, a comparison's run)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class MlflowLinks(BaseModel):
    experiment_id: str | None = None
    run_id: str | None = Field(default=None, description="the study's parent run; trials are its children")
    experiment_url: str | None = None
    run_url: str | None = None
