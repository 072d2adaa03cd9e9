"""/presets: the papers' grids."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse

from search_spaces import list_presets
from service.api.schemas import ErrorMessage, PresetPublic, PresetSummary
from service.application.errors import NotFoundError, unknown_preset
from service.application.presets import preset_detail, preset_summary

router = APIRouter(
    prefix="/presets",
    tags=["presets"],
    responses={401: {"model": ErrorMessage, "description": "missing or wrong bearer token"}},
)


@router.get("")
def presets() -> list[PresetSummary]:
    """Every paper's grid with its size (trials = points × seeds) and citation."""
    return [PresetSummary.model_validate(preset_summary(name)) for name in list_presets()]


@router.get(
    "/{name:path}",
    response_model=PresetPublic,
    responses={404: {"model": ErrorMessage, "description": "no such preset"}},
)
def preset(name: str, request: Request) -> PresetPublic | RedirectResponse:
    """One grid: size, citation, fixed settings, every dimension's values and each model's parameter
    counts. A trailing slash (`/presets/`, `/presets/NAME/`) is redirected to the path without it, as the
    routes without a path parameter are; any other name with a slash is an unknown preset (with the
    nearest name)."""
    if name == "" or name.endswith("/"):
        return RedirectResponse(str(request.url.replace(path=request.url.path.rstrip("/"))), status_code=307)
    if name not in list_presets():
        raise NotFoundError(unknown_preset(name, "GET /presets"))
    return PresetPublic.model_validate(preset_detail(name))
