"""/openapi.json, /docs and /redoc, open to a browser (FastAPI's own are turned off): the schema holds no
secret, and every call the pages make still needs the bearer token."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

router = APIRouter(include_in_schema=False)


@router.get("/openapi.json")
def openapi(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/docs")
def swagger(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{request.app.title} — API")


@router.get("/redoc")
def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(openapi_url="/openapi.json", title=f"{request.app.title} — API")
