"""Where an MLflow run is: its ids and its links in the UI, as the REST answers show them (a study's
parent run, a comparison's run).

Every link opens the UI's model-training view. MLflow 3's UI (3.17) shows one of two products, switched
at its top left ("GenAI | Model training"), and picks one on each page load from the route's
`workflowType` query parameter (`genai` or `machine_learning`), else from the browser's stored choice
(localStorage `mlflow.workflowType_v1`, written only by that switch), else GenAI; the experiment's
`mlflow.experimentKind` tag is not read while the switch is shown. A link without the parameter opens a
fresh browser on an LLM overview of traces (the experiment) or under "Evaluation runs" (a run), so the
links here carry `workflowType=machine_learning`: the runs table, its charts and the run pages. Every
link memsweep serves or prints is built here (`ui_link`, `MlflowLinks.at`)."""

from __future__ import annotations

from pydantic import BaseModel, Field

WORKFLOW_TYPE = "workflowType"  # the UI's query parameter that picks its view (GenAI or model training)
TRAINING_VIEW = "machine_learning"


def ui_link(ui: str, experiment_id: str, run_id: str | None = None) -> str:
    """The UI's link to an experiment's runs table, or to one of its runs, in the model-training view."""
    route = f"/experiments/{experiment_id}/runs" + (f"/{run_id}" if run_id else "")
    return f"{ui.rstrip('/')}/#{route}?{WORKFLOW_TYPE}={TRAINING_VIEW}"


class MlflowLinks(BaseModel):
    experiment_id: str | None = None
    run_id: str | None = Field(default=None, description="the study's parent run; trials are its children")
    experiment_url: str | None = None
    run_url: str | None = None

    @classmethod
    def at(cls, ui: str | None, experiment_id: str | None, run_id: str | None) -> MlflowLinks:
        """A run's ids and its links in the UI at `ui` (None: ids only)."""
        return cls(
            experiment_id=experiment_id,
            run_id=run_id,
            experiment_url=ui_link(ui, experiment_id) if ui and experiment_id else None,
            run_url=ui_link(ui, experiment_id, run_id) if ui and experiment_id and run_id else None,
        )
