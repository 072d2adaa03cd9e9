"""/compare: success counts of several studies side by side, with the differences of their rates."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from service.api.deps import AcceptDep, FormatDep, StudiesDep, SuccessQueryDep
from service.api.routes.studies import CSV, NOT_FOUND, REFUSED, UNAUTHORIZED, csv_response
from service.api.schemas import Comparison, ErrorMessage
from service.core.criterion_query import OWN
from service.reports import tables

router = APIRouter(tags=["compare"], responses=UNAUTHORIZED)


@router.get(
    "/compare",
    response_model=Comparison,
    responses={
        **REFUSED,
        404: {**NOT_FOUND[404], "description": "a study id the ledger does not hold (all are named)"},
        200: {"content": CSV, "description": "the comparison (JSON or CSV)"},
        503: {"model": ErrorMessage, "description": "with log=true: MLflow does not answer"},
    },
)
def compare(
    studies: StudiesDep,
    study_ids: Annotated[
        list[str],
        Query(
            alias="studies",
            min_length=1,
            description="the studies, comma-separated (or the parameter repeated); the first is the "
            "reference every difference is taken from",
        ),
    ],
    by: Annotated[
        str,
        Query(
            max_length=500,
            description="fields to group by, comma-separated: model, a varied value "
            "(lr, scale, seed) or a trial config field (cell, hidden, seq_len, task.seq_len, cell.init)",
        ),
    ] = "model",
    query: SuccessQueryDep = OWN,
    log: Annotated[
        bool, Query(description="also log the comparison to MLflow as its own run (table and figure)")
    ] = False,
    output: FormatDep = None,
    accept: AcceptDep = None,
) -> Comparison | Response:
    """Success counts of studies side by side with 95 % Wilson intervals, by model or by any field, each
    study under its own criterion unless the query names one; each study's difference from the first
    with its 95 % Newcombe interval, and the runs (config hashes) the two share. CSV for
    `Accept: text/csv` or `?format=csv`."""
    ids = [part for item in study_ids for part in item.split(",")]
    comparison = studies.compare(ids, by.split(","), query, log)
    if tables.wants_csv(output, accept):
        return csv_response(tables.comparison_csv(comparison.model_dump(mode="json")))
    return comparison
