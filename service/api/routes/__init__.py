"""The HTTP surface: one module per resource. Every router requires the bearer token but /health and
the API's own pages (/docs, /redoc, /openapi.json: a browser opens them; the calls they make still
need the token, which Swagger UI's "Authorize" button sends)."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import Authorized, KnownQuery
from service.api.routes import compare, docs, health, plugins, presets, studies

api_router = APIRouter()
api_router.include_router(health.public, dependencies=[KnownQuery])
api_router.include_router(health.router, dependencies=[Authorized, KnownQuery])
api_router.include_router(studies.router, dependencies=[Authorized, KnownQuery])
api_router.include_router(compare.router, dependencies=[Authorized, KnownQuery])
api_router.include_router(presets.router, dependencies=[Authorized, KnownQuery])
api_router.include_router(plugins.router, dependencies=[Authorized, KnownQuery])
api_router.include_router(docs.router)

__all__ = ["api_router"]
