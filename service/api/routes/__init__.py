"""The HTTP surface: one module per resource; every router but /health requires the bearer token."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import Authorized
from service.api.routes import docs, health, presets, studies

api_router = APIRouter()
api_router.include_router(health.public)
api_router.include_router(health.router, dependencies=[Authorized])
api_router.include_router(studies.router, dependencies=[Authorized])
api_router.include_router(presets.router, dependencies=[Authorized])
api_router.include_router(docs.router, dependencies=[Authorized])

__all__ = ["api_router"]
