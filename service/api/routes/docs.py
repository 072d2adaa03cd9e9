"""/openapi.json, /docs and /redoc, open to a browser (FastAPI's own are turned off): the schema holds no
secret, and every call the pages make still needs the bearer token.

/docs is served whole by the server: Swagger UI's script and style come from the `swagger-ui-py`
package under /docs/static (FastAPI's page loads them from a CDN, so on a cluster without the internet
it was blank). /redoc still loads ReDoc from its CDN: no package ships it."""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse

router = APIRouter(include_in_schema=False)

#: what /docs loads from /docs/static: Swagger UI's own files, as `swagger-ui-py` ships them
SWAGGER_FILES = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "favicon-32x32.png": "image/png",
}


@cache
def swagger_static() -> Path:
    """Swagger UI's folder in the installed `swagger-ui-py` (5.x: the OpenAPI 3.1 FastAPI writes)."""
    return Path(str(files("swagger_ui") / "static"))


def _root(request: Request) -> str:
    """The path the server is mounted under (uvicorn's --root-path, behind a proxy), for the pages' links."""
    return str(request.scope.get("root_path", "")).rstrip("/")


@router.get("/openapi.json")
def openapi(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/docs")
def swagger(request: Request) -> HTMLResponse:
    root = _root(request)
    return get_swagger_ui_html(
        openapi_url=f"{root}/openapi.json",
        title=f"{request.app.title} — API",
        swagger_js_url=f"{root}/docs/static/swagger-ui-bundle.js",
        swagger_css_url=f"{root}/docs/static/swagger-ui.css",
        swagger_favicon_url=f"{root}/docs/static/favicon-32x32.png",
    )


@router.get("/docs/static/{name}")
def swagger_file(name: str) -> FileResponse:
    """One of Swagger UI's files (`SWAGGER_FILES`; nothing else of the folder is served)."""
    if name not in SWAGGER_FILES:
        raise HTTPException(404, f"no file {name!r} here; /docs loads {', '.join(SWAGGER_FILES)}")
    return FileResponse(swagger_static() / name, media_type=SWAGGER_FILES[name])


@router.get("/redoc")
def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(openapi_url=f"{_root(request)}/openapi.json", title=f"{request.app.title} — API")
