"""/studies: create, follow, query, cancel, resume and extend studies."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Body, Header, Query, Response, status

from service.api.deps import (
    AcceptDep,
    CriterionQueryDep,
    FormatDep,
    ReferenceQuery,
    StudiesDep,
    SuccessQueryDep,
)
from service.api.schemas import (
    STUDY_CREATE_EXAMPLES,
    BestConfig,
    ErrorMessage,
    StudyCreate,
    StudyExtend,
    StudyExtended,
    StudyList,
    StudyPlan,
    StudyPublic,
    SuccessBudget,
    SuccessTable,
    TrialPage,
)
from service.core.criterion_query import OWN
from service.core.limits import BEST_K, STUDIES_LIMIT, STUDIES_OFFSET
from service.core.states import LISTED_STATES, TrialStatus
from service.reports import tables
from service.store.ledger import TrialSort

NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorMessage, "description": "no such study"}}
CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorMessage, "description": "the study's state does not allow this"}
}
REFUSED: dict[int | str, dict[str, Any]] = {
    422: {"description": "a field is invalid, or the trainers refuse a value, or the grid is over the limit"}
}
BAD_BODY: dict[int | str, dict[str, Any]] = {
    400: {
        "model": ErrorMessage,
        "description": "the body is no JSON object: not JSON (UTF-8), not an object, or sent as another content type",
    }
}
TOO_LARGE: dict[int | str, dict[str, Any]] = {
    413: {"model": ErrorMessage, "description": "the body is over MEMSWEEP_MAX_REQUEST_BYTES"}
}
UNAUTHORIZED: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorMessage, "description": "missing or wrong bearer token"}
}
#: a table's answer as CSV (`Accept: text/csv` or `?format=csv`)
CSV: dict[str, Any] = {
    tables.MEDIA_TYPE: {
        "schema": {"type": "string"},
        "example": '# table: success\n# criterion: 0.5 × baseline\n# trainer_version: 4\n"table","model",…',
    }
}

router = APIRouter(prefix="/studies", tags=["studies"], responses=UNAUTHORIZED)

#: what `GET /studies?state=` filters on: a study's state (`StudyState`, each of its values), or
#: `queued`, which the listing shows in its place for a study accepted and not started yet; made of
#: `LISTED_STATES`, so that a new state is listed with the others (a string to mypy, which takes a
#: Literal's values written out only)
if TYPE_CHECKING:
    ListedState = str
else:
    ListedState = Literal[LISTED_STATES]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=StudyPublic | StudyPlan,
    responses={
        200: {
            "model": StudyPlan | StudyPublic,
            "description": "with dry_run=true: the plan (nothing stored); else the study an earlier request "
            "with this Idempotency-Key made",
        },
        **BAD_BODY,
        **CONFLICT,
        **REFUSED,
        **TOO_LARGE,
    },
)
def create_study(
    studies: StudiesDep,
    response: Response,
    spec: Annotated[StudyCreate, Body(openapi_examples=STUDY_CREATE_EXAMPLES)],
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=200,
            description="repeat a request safely: the same key gives the same study back",
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        Query(
            description="answer the study's plan and cost (trials, bundles, budget, estimate) without "
            "running or storing it; shapes not calibrated yet are measured with a few real steps"
        ),
    ] = False,
    recalibrate: Annotated[
        bool, Query(description="with dry_run: measure every shape again instead of using the cache")
    ] = False,
) -> StudyPublic | StudyPlan:
    """Create a study from a spec (or a preset with overrides) and queue it to run; with `dry_run=true`,
    answer its plan and estimated cost instead (nothing is stored or run)."""
    if dry_run:
        response.status_code = status.HTTP_200_OK
        return studies.plan(spec, recalibrate)
    study, created = studies.create(spec, idempotency_key)
    if not created:
        response.status_code = status.HTTP_200_OK
    return study


@router.get("", response_model=StudyList)
def list_studies(
    studies: StudiesDep,
    state: Annotated[
        ListedState | None,
        Query(
            description="only studies in this state; `queued`: accepted and not started yet (a summary's "
            "`queued`, which the listing shows as its state)"
        ),
    ] = None,
    offset: Annotated[
        int, Query(ge=STUDIES_OFFSET.low, le=STUDIES_OFFSET.high, description="skip this many studies")
    ] = STUDIES_OFFSET.default,
    limit: Annotated[
        int, Query(ge=STUDIES_LIMIT.low, le=STUDIES_LIMIT.high, description="studies on this page at most")
    ] = STUDIES_LIMIT.default,
) -> Response:
    """Studies, newest first, one page at a time: each as a summary (state, trial counts, times);
    `GET /studies/{id}` has a study's full record (spec, plan, ETA, MLflow links)."""
    page = studies.list_studies(state, offset, limit)  # typed and checked where it is built: served as is
    return Response(content=page.model_dump_json(), media_type="application/json")


@router.get("/{study_id}", responses=NOT_FOUND)
def get_study(studies: StudiesDep, study_id: str) -> StudyPublic:
    """A study's state, trial counts, ETA and MLflow links."""
    return studies.get(study_id)


@router.get(
    "/{study_id}/trials",
    response_model=TrialPage,
    responses={
        **NOT_FOUND,
        **REFUSED,
        200: {"content": CSV, "description": "a page of trials (JSON or CSV)"},
    },
)
def list_trials(
    studies: StudiesDep,
    study_id: str,
    trial_status: Annotated[
        list[TrialStatus] | None, Query(alias="status", description="any of these statuses (repeatable)")
    ] = None,
    success: Annotated[
        bool | None, Query(description="true: only successes; false: finished without")
    ] = None,
    model: Annotated[
        list[str] | None, Query(max_length=100, description="any of these models (repeatable)")
    ] = None,
    param: Annotated[
        list[str] | None,
        Query(
            max_length=200,
            description="FIELD=VALUE: only trials whose point has this value, as tables print it "
            "(repeatable; e.g. param=lr=0.001&param=init=chain)",
        ),
    ] = None,
    sort: Annotated[TrialSort, Query(description="sort key; empty values come last")] = TrialSort.ID,
    order: Annotated[Literal["asc", "desc"], Query()] = "asc",
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    history: Annotated[bool, Query(description="include every evaluation of each trial")] = False,
    output: FormatDep = None,
    accept: AcceptDep = None,
) -> TrialPage | Response:
    """A study's trials: filtered by status, success, model and the point's values, sorted, one page
    at a time (as CSV for `Accept: text/csv` or `?format=csv`: one row per trial, `params.*` and
    `config.*` columns)."""
    page = studies.trials(
        study_id, list(trial_status or []) or None, success, sort, order == "desc", offset, limit, history,
        models=model, params=param,
    )  # fmt: skip
    if tables.wants_csv(output, accept):
        return csv_response(tables.trials_csv(page.model_dump(mode="json"), study_id))
    return page


@router.get("/{study_id}/best", responses={**NOT_FOUND, **REFUSED})
def best(
    studies: StudiesDep,
    study_id: str,
    k: Annotated[
        int, Query(ge=BEST_K.low, le=BEST_K.high, description="how many configurations")
    ] = BEST_K.default,
    model: Annotated[str | None, Query(max_length=100, description="only this model")] = None,
) -> list[BestConfig]:
    """The k best configurations (seeds pooled), by mean final validation loss over the seeds that
    trained to their end; a point some seed of which did not (`missing_seeds`) comes after the others."""
    return studies.best(study_id, k, model)


@router.get(
    "/{study_id}/success",
    response_model=SuccessTable,
    responses={
        **NOT_FOUND,
        **REFUSED,
        200: {"content": CSV, "description": "the success table (JSON or CSV)"},
    },
)
def success(
    studies: StudiesDep,
    study_id: str,
    query: SuccessQueryDep = OWN,
    reference: ReferenceQuery = None,
    output: FormatDep = None,
    accept: AcceptDep = None,
) -> SuccessTable | Response:
    """Successful runs by model and by hyperparameter value, with 95 % Wilson intervals, under the
    study's criterion or the one the query names (a recount from the stored losses: nothing trains),
    at the end of each run or at a budget of `at_step` steps; with `?reference=MODEL`, each model's
    rate minus that model's, with Newcombe's 95 % interval (a cell of yours against a paper's, in one
    study); as CSV for `Accept: text/csv` or `?format=csv` (one row per cell: `table` total / by_model /
    by_value)."""
    table = studies.success(study_id, query, reference)
    if tables.wants_csv(output, accept):
        return csv_response(tables.success_csv(table.model_dump(mode="json"), study_id))
    return table


@router.get("/{study_id}/success/budget", responses={**NOT_FOUND, **REFUSED})
def success_budget(
    studies: StudiesDep,
    study_id: str,
    query: CriterionQueryDep = OWN,
) -> SuccessBudget:
    """Successful runs per model against training steps (with 95 % Wilson intervals), under the study's
    criterion or the one the query names, as `/success` takes it (a recount: nothing trains)."""
    return studies.success_vs_budget(study_id, query)


@router.post("/{study_id}/cancel", responses={**NOT_FOUND, **CONFLICT})
def cancel(studies: StudiesDep, study_id: str) -> StudyPublic:
    """Stop a queued or running study; its finished trials stay, the rest can be resumed."""
    return studies.cancel(study_id)


@router.post(
    "/{study_id}/sync",
    responses={
        **NOT_FOUND,
        **CONFLICT,
        503: {"model": ErrorMessage, "description": "MLflow does not answer"},
    },
)
def sync(studies: StudiesDep, study_id: str) -> StudyPublic:
    """Rebuild the study's MLflow runs from the ledger: every finished trial's child run, once, and the
    summary on the parent run (after MLflow was down, or lost its store)."""
    return studies.sync(study_id)


@router.post("/{study_id}/resume", responses={**NOT_FOUND, **CONFLICT})
def resume(studies: StudiesDep, study_id: str) -> StudyPublic:
    """Run a cancelled or failed study's unfinished trials (finished ones never run again)."""
    return studies.resume(study_id)


@router.post("/{study_id}/extend", responses={**BAD_BODY, **NOT_FOUND, **CONFLICT, **REFUSED, **TOO_LARGE})
def extend(studies: StudiesDep, study_id: str, changes: StudyExtend) -> StudyExtended:
    """Add seeds, values, models or trials to a finished or stopped study, and run only the new points."""
    return studies.extend(study_id, changes)


def csv_response(text: str) -> Response:
    """A CSV table (`service.reports.tables`) as the answer."""
    return Response(content=text, media_type=f"{tables.MEDIA_TYPE}; charset=utf-8")
