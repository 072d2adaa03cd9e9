"""/presets: the papers' grids."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from search_spaces import describe, get_preset, list_presets
from service.api.schemas import ErrorMessage, PresetPublic, PresetSummary
from service.application.errors import NotFoundError, unknown_preset

router = APIRouter(
    prefix="/presets",
    tags=["presets"],
    responses={401: {"model": ErrorMessage, "description": "missing or wrong bearer token"}},
)


def _described(name: str) -> dict[str, Any]:
    d = describe(get_preset(name))
    d.setdefault("size", None)
    d.setdefault("size_per_model", None)
    return d


@router.get("")
def presets() -> list[PresetSummary]:
    """Every paper's grid with its size (trials = points × seeds) and citation."""
    return [PresetSummary.model_validate(_described(name)) for name in list_presets()]


@router.get("/{name:path}", responses={404: {"model": ErrorMessage, "description": "no such preset"}})
def preset(name: str) -> PresetPublic:
    """One grid: size, citation, fixed settings and every dimension's values."""
    if name not in list_presets():
        raise NotFoundError(unknown_preset(name, "GET /presets"))
    return PresetPublic.model_validate(_described(name))
