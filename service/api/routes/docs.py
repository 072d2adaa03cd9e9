"""/openapi.json, /docs and /redoc, open to a browser (FastAPI's own are turned off): the schema holds no
secret, and every call the pages make still needs the bearer token.

Both pages are served whole by the server, under /docs/static: Swagger UI's script and style from the
`swagger-ui-py` package, ReDoc's standalone bundle from `fastapi-offline` (FastAPI's pages load them
from CDNs, so on a cluster without the internet they were blank). ReDoc still asks its CDN for the logo
of its "API docs by Redocly" badge, and leaves the logo out where that fails."""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse

router = APIRouter(include_in_schema=False)

#: what the pages load from /docs/static: file → (the package whose `static` folder has it, media type)
STATIC_FILES = {
    "swagger-ui-bundle.js": ("swagger_ui", "text/javascript"),
    "swagger-ui.css": ("swagger_ui", "text/css"),
    "favicon-32x32.png": ("swagger_ui", "image/png"),
    "redoc.standalone.js": ("fastapi_offline", "text/javascript"),
}


@cache
def static_folder(package: str) -> Path:
    """An installed package's `static` folder: `swagger-ui-py`'s holds Swagger UI 5 (the OpenAPI 3.1
    FastAPI writes), `fastapi-offline`'s ReDoc 2's standalone bundle."""
    return Path(str(files(package) / "static"))


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
def static_file(name: str) -> FileResponse:
    """One of the pages' files (`STATIC_FILES`; nothing else of the packages' folders is served)."""
    if name not in STATIC_FILES:
        raise HTTPException(404, f"no file {name!r} here; /docs and /redoc load {', '.join(STATIC_FILES)}")
    package, media_type = STATIC_FILES[name]
    return FileResponse(static_folder(package) / name, media_type=media_type)


@router.get("/redoc")
def redoc(request: Request) -> HTMLResponse:
    root = _root(request)
    return get_redoc_html(
        openapi_url=f"{root}/openapi.json",
        title=f"{request.app.title} — API",
        redoc_js_url=f"{root}/docs/static/redoc.standalone.js",
        redoc_favicon_url=f"{root}/docs/static/favicon-32x32.png",
        with_google_fonts=False,  # a stylesheet from Google's servers; ReDoc falls back to the system's fonts
    )
