"""Error answers that say what went wrong and what to do next: 400, 404, 409, 422 (and a logged 500)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, cast

from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.application.errors import (
    ConflictError,
    IdempotencyMismatchError,
    NotFoundError,
    SpecInvalidError,
    UnavailableError,
)
from service.core.errors import StudyError, invalid_fields
from service.store.database import unreachable

log = logging.getLogger(__name__)


def install_error_handlers(app: FastAPI) -> None:
    def detail(code: int, message: str) -> JSONResponse:
        return JSONResponse(status_code=code, content=answer(message))

    async def not_found(request: Request, exc: Exception) -> JSONResponse:
        return detail(status.HTTP_404_NOT_FOUND, str(exc))

    async def conflict(request: Request, exc: Exception) -> JSONResponse:
        return detail(status.HTTP_409_CONFLICT, str(exc))

    async def unprocessable(request: Request, exc: Exception) -> JSONResponse:
        return detail(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc))

    async def unavailable(request: Request, exc: Exception) -> JSONResponse:
        return detail(status.HTTP_503_SERVICE_UNAVAILABLE, str(exc))

    async def invalid(request: Request, exc: Exception) -> JSONResponse:
        unreadable = unreadable_body(request, cast(RequestValidationError, exc))
        if unreadable is not None:  # no JSON object to check field by field: what to send instead
            return detail(status.HTTP_400_BAD_REQUEST, unreadable)
        content = validation_content(request, cast(RequestValidationError, exc))
        return JSONResponse(status_code=status.HTTP_422_UNPROCESSABLE_CONTENT, content=content)

    async def invalid_spec(request: Request, exc: Exception) -> JSONResponse:
        content = errors_content(cast(SpecInvalidError, exc).errors, None)
        return JSONResponse(status_code=status.HTTP_422_UNPROCESSABLE_CONTENT, content=content)

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        exc = cast(StarletteHTTPException, exc)
        message = exc.detail
        if exc.status_code == status.HTTP_400_BAD_REQUEST and "parsing the body" in str(message):
            if isinstance(exc.__cause__, RecursionError):  # JSON, nested deeper than the parser goes
                message = (
                    "the body's JSON is nested too deeply to read (a study spec is a few levels deep); "
                    "send the spec as a JSON object (examples: GET /docs)"
                )
            else:
                message = "the body is not JSON (UTF-8 text); send a JSON object (examples: GET /docs)"
        return JSONResponse(status_code=exc.status_code, content=answer(str(message)), headers=exc.headers)

    async def ledger_unavailable(request: Request, exc: Exception) -> JSONResponse:
        said = unreachable(exc)
        log.warning("%s %s: %s", request.method, request.url.path, said)
        return detail(status.HTTP_503_SERVICE_UNAVAILABLE, f"{said}; GET /ready says when it does again")

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return detail(
            status.HTTP_500_INTERNAL_SERVER_ERROR,
            f"internal error ({type(exc).__name__}); the server log has the traceback — please report it",
        )

    app.add_exception_handler(NotFoundError, not_found)
    app.add_exception_handler(ConflictError, conflict)
    app.add_exception_handler(SpecInvalidError, invalid_spec)
    app.add_exception_handler(StudyError, unprocessable)
    app.add_exception_handler(UnavailableError, unavailable)
    app.add_exception_handler(IdempotencyMismatchError, unprocessable)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(OperationalError, ledger_unavailable)  # answered, not re-raised: the
    app.add_exception_handler(InterfaceError, ledger_unavailable)  # connection stays up for the next
    app.add_exception_handler(Exception, unexpected)


def answer(message: str) -> dict[str, Any]:
    """An error answer: every one has `message`, one line naming what went wrong and the fix; `detail`
    is the same line here, and the field-by-field list for a refused body (`errors_content`)."""
    return {"detail": message, "message": message}


def unreadable_body(request: Request, exc: RequestValidationError) -> str | None:
    """Why a body is no JSON object at all, and what to send: text that is not JSON (FastAPI's
    "body.1: JSON decode error"), another content type (a form), or JSON that is not an object; None
    when it is one (its fields are checked one by one)."""
    for error in exc.errors():
        loc = tuple(error.get("loc", ()))
        if error.get("type") == "json_invalid":
            at = f" (at character {loc[1]})" if len(loc) > 1 else ""
            return f"the body is not JSON{at}; send a JSON object (examples: GET /docs)"
        if loc == ("body",) and error.get("type") in ("model_attributes_type", "dict_type"):
            kind = request.headers.get("content-type", "none")
            if "json" not in kind:
                return (
                    f"the body came as content type {kind.split(';')[0]}; send the JSON object with "
                    "`Content-Type: application/json` (examples: GET /docs)"
                )
            return (
                "the body is JSON but not an object; send a JSON object of the fields (examples: GET /docs)"
            )
    return None


def validation_content(request: Request, exc: RequestValidationError) -> dict[str, Any]:
    """FastAPI's list of errors, each with the field's valid names where it has them, and one message."""
    return errors_content(exc.errors(), _body_model(request))


def errors_content(found: Sequence[Mapping[str, Any]], body_model: type[BaseModel] | None) -> dict[str, Any]:
    """Pydantic's errors (their `loc` from the request: `body`, `query`, …) as memsweep answers them
    (`invalid_fields`), with one message naming every field and its fix."""
    errors, lines = invalid_fields(found, body_model, root=("body",))
    message = "; ".join(lines) + ". Fix these and send the request again (schemas and examples: GET /docs)."
    return {"detail": errors, "message": message}


def _body_model(request: Request) -> type[BaseModel] | None:
    route = request.scope.get("route")
    field = getattr(route, "body_field", None)
    annotation = getattr(getattr(field, "field_info", None), "annotation", None)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
