"""/openapi.json, /docs and /redoc, open to a browser (FastAPI's own are turned off): the schema holds no
secret, and every call the pages make still needs the bearer token.

Both pages are served whole by the server, under /docs/static: Swagger UI's script and style and ReDoc's
standalone bundle, as the `fastapi-offline` package ships them (FastAPI's pages load them from CDNs, so
on a cluster without the internet they were blank). ReDoc still asks its CDN for the logo
of its "API docs by Redocly" badge, and leaves the logo out where that fails."""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse

router = APIRouter(include_in_schema=False)

#: what the pages load from /docs/static: file → media type
STATIC_FILES = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "favicon.png": "image/png",
    "redoc.standalone.js": "text/javascript",
}


@cache
def static_folder() -> Path:
    """The installed `fastapi-offline`'s `static` folder: Swagger UI (it renders the OpenAPI 3.1 FastAPI
    writes) and ReDoc 2's standalone bundle."""
    return Path(str(files("fastapi_offline") / "static"))


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
        swagger_favicon_url=f"{root}/docs/static/favicon.png",
    )


@router.get("/docs/static/{name}")
def static_file(name: str) -> FileResponse:
    """One of the pages' files (`STATIC_FILES`; nothing else of the package's folder is served)."""
    if name not in STATIC_FILES:
        raise HTTPException(404, f"no file {name!r} here; /docs and /redoc load {', '.join(STATIC_FILES)}")
    return FileResponse(static_folder() / name, media_type=STATIC_FILES[name])


@router.get("/redoc")
def redoc(request: Request) -> HTMLResponse:
    root = _root(request)
    return get_redoc_html(
        openapi_url=f"{root}/openapi.json",
        title=f"{request.app.title} — API",
        redoc_js_url=f"{root}/docs/static/redoc.standalone.js",
        redoc_favicon_url=f"{root}/docs/static/favicon.png",
        with_google_fonts=False,  # a stylesheet from Google's servers; ReDoc falls back to the system's fonts
    )
