"""A success query: the criterion a request names instead of each study's own, and the budget to count
at. Its fields are the REST routes' query parameters (by name, bounds and description: FastAPI's query
parameter models), the CLI's flags and the Python client's keywords, so that an option is added here
once and every layer between the URL and the recount carries it. The study's spec judges it
(`StudySpec.criterion_for`): whether a threshold and a fraction were both named, and whether a
baseline is one the study's trials report, are questions of the study, not of the query's bounds."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CriterionQuery(BaseModel):
    """A success criterion a request names instead of the study's own (a recount: nothing trains)."""

    # extra: ignored, as a query parameter model's must be: FastAPI hands it the URL's other parameters
    # too (`format`, `reference`, …); `service.api.deps.known_query` refuses those no route takes
    model_config = ConfigDict(frozen=True, extra="ignore")

    fraction: float | None = Field(
        default=None,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="judge under this fraction of the baseline instead",
    )
    threshold: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="judge under this loss threshold instead"
    )
    baseline: str | None = Field(
        default=None,
        max_length=64,
        description="with fraction: a reference baseline the task reports (copy: arjovsky)",
    )


class SuccessQuery(CriterionQuery):
    """A criterion and a budget to count successes at: what a success table or a comparison is asked
    (a curve against budget counts at every step, so it takes a `CriterionQuery` alone)."""

    at_step: int | None = Field(
        default=None,
        ge=1,
        description="count at a budget of this many steps (each run's last evaluation by then)",
    )


#: a query that names nothing: each study's own criterion, counted at the end of each run
OWN = SuccessQuery()
