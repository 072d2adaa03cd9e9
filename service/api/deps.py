"""The routes' dependencies as `Annotated` aliases: settings, the study service, the bearer token.

They do no I/O, so they are `async`: FastAPI runs them on the event loop instead of handing each to its
thread pool (a sync route's own hop is the one a request waits for there, under 200 concurrent calls)."""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated, Any, Literal

from fastapi import Depends, Header, HTTPException, Query, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from service.application.study_service import StudyService
from service.core.criterion_query import CriterionQuery, SuccessQuery
from service.core.settings import Settings, get_settings
from service.study.engine import Engine

SettingsDep = Annotated[Settings, Depends(get_settings)]


async def get_studies(request: Request) -> StudyService:
    studies: StudyService = request.app.state.studies
    return studies


async def get_engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


StudiesDep = Annotated[StudyService, Depends(get_studies)]
EngineDep = Annotated[Engine, Depends(get_engine)]
#: how a table answers: `?format=csv|json` (else the Accept header decides; JSON by default)
FormatDep = Annotated[
    Literal["json", "csv"] | None,
    Query(alias="format", description="csv or json; default: text/csv when Accept asks for it, else JSON"),
]
AcceptDep = Annotated[str | None, Header(include_in_schema=False)]
#: a success criterion a request names instead of each study's own (GET /studies/{id}/success/budget),
#: and with a budget to count at (GET /studies/{id}/success, GET /compare): the model's fields are the
#: query parameters, by name, bounds and description
CriterionQueryDep = Annotated[CriterionQuery, Query()]
SuccessQueryDep = Annotated[SuccessQuery, Query()]
#: not a criterion but a row of the table: each model's rate minus this one's (GET /studies/{id}/success)
ReferenceQuery = Annotated[
    str | None,
    Query(
        max_length=100,
        description="a model of the study: each model's rate minus its own, with Newcombe's interval",
    ),
]

bearer = HTTPBearer(
    auto_error=False,
    description="Send `Authorization: Bearer <token>` with the server's MEMSWEEP_API_TOKEN (when it sets one).",
)


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()  # equal lengths: the comparison leaks nothing


async def require_token(
    settings: SettingsDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> None:
    """401 unless the request carries the configured bearer token (no token configured: open)."""
    if settings.api_token is None:
        return
    given = credentials.credentials if credentials is not None else ""
    if not hmac.compare_digest(_digest(given), _digest(settings.api_token.get_secret_value())):
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail="missing or wrong bearer token: send `Authorization: Bearer <MEMSWEEP_API_TOKEN>`",
            headers={"WWW-Authenticate": "Bearer"},
        )


Authorized = Depends(require_token)


_QUERY_NAMES: dict[int, frozenset[str]] = {}


def _names(param: Any) -> list[str]:
    """A query parameter's name, or each of a query parameter model's (`SuccessQueryDep`'s fields)."""
    model = param.field_info.annotation
    if isinstance(model, type) and issubclass(model, BaseModel):
        return [info.alias or name for name, info in model.model_fields.items()]
    return [param.alias]


def query_names(route: object) -> frozenset[str]:
    """The query parameters a route takes (its own and its dependencies'), by the names a URL uses."""
    names = _QUERY_NAMES.get(id(route))
    if names is None:
        found: set[str] = set()
        todo = [getattr(route, "dependant", None)]
        while todo:
            dependant = todo.pop()
            if dependant is not None:
                found.update(name for p in dependant.query_params for name in _names(p))
                todo += dependant.dependencies
        names = _QUERY_NAMES[id(route)] = frozenset(found)
    return names


async def known_query(request: Request) -> None:
    """422 for a query parameter the route does not take: FastAPI ignores one, so a misspelled filter
    (`?state=failed` on /trials, `?params=lr=0.1`) answered every trial as if it had filtered them."""
    if not request.query_params:
        return
    taken = query_names(request.scope.get("route"))
    unknown = [k for k in dict.fromkeys(request.query_params.keys()) if k not in taken]
    if not unknown:
        return
    from fastapi.exceptions import RequestValidationError

    from search_spaces.space import did_you_mean

    takes = f"{request.method} {request.url.path} takes " + (", ".join(sorted(taken)) or "none")
    errors = []
    for k in unknown:
        near = did_you_mean(k, taken)
        hint = f"{near} " if near else ""
        errors.append(
            {"type": "extra_forbidden", "loc": ("query", k), "msg": f"not a query parameter here; {hint}{takes}",
             "input": request.query_params.get(k)}
        )  # fmt: skip
    raise RequestValidationError(errors)


KnownQuery = Depends(known_query)
