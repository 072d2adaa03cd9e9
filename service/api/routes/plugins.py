"""/plugins: the plugin cells and tasks installed on the server and on each node of its Ray."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import StudiesDep
from service.api.schemas import ErrorMessage, PluginListing, PluginPublic

router = APIRouter(
    prefix="/plugins",
    tags=["plugins"],
    responses={401: {"model": ErrorMessage, "description": "missing or wrong bearer token"}},
)


@router.get("")
def plugins(studies: StudiesDep) -> PluginListing:
    """Every plugin cell and task installed here (ready or refused, with why), and what each Ray node that
    can run trials has: a study that uses a plugin is refused while a node lacks it or has another version."""
    server, nodes = studies.plugins()
    return PluginListing(server=[PluginPublic.model_validate(p) for p in server], nodes=nodes)
