"""/health (liveness, open to all) and /ready (database, Ray and MLflow reachable)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status

from service.api.deps import EngineDep
from service.api.schemas import Check, ErrorMessage, Health, Readiness
from service.runner import StudyRunner
from service.tracking.server import server_healthy

public = APIRouter(tags=["health"])
router = APIRouter(
    tags=["health"], responses={401: {"model": ErrorMessage, "description": "missing or wrong bearer token"}}
)


@public.get("/health")
def health(request: Request) -> Health:
    """The process answers (no token needed)."""
    return Health(version=request.app.version)


@router.get("/ready", responses={503: {"model": Readiness, "description": "a dependency is not reachable"}})
def ready(engine: EngineDep, request: Request, response: Response) -> Readiness:
    """Whether the ledger's database, Ray and MLflow are reachable (503 until they are)."""
    runner: StudyRunner = request.app.state.runner
    checks = {"database": _database(engine)}
    if runner.workers:
        checks["ray"] = _ray(engine, runner)
        checks["mlflow"] = _mlflow(runner)
    else:
        skipped = Check(
            ok=True, detail="not needed: MEMSWEEP_MAX_PARALLEL_STUDIES=0 (this server runs no study)"
        )
        checks["ray"] = checks["mlflow"] = skipped
    answer = Readiness(ready=all(c.ok for c in checks.values()), checks=checks)
    if not answer.ready:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    return answer


def _database(engine: EngineDep) -> Check:
    unreachable = engine.ledger.unreachable()
    if unreachable is not None:  # the URL may hold a password: the error's kind, not its text
        return Check(ok=False, detail=f"unreachable ({unreachable}); check MEMSWEEP_DATABASE_URL")
    refused = engine.ledger.unwritable()  # reachable is not enough: a read-only ledger stores nothing
    if refused is not None:
        return Check(
            ok=False,
            detail=f"reachable but refuses writes ({refused}); check its file, directory and disk "
            "(MEMSWEEP_HOME) or its server (MEMSWEEP_DATABASE_URL)",
        )
    return Check(ok=True, detail=engine.ledger.dialect)


def _ray(engine: EngineDep, runner: StudyRunner) -> Check:
    try:  # the executor's cluster, once up
        have = engine.executor.resources()
    except Exception as exc:
        return Check(ok=False, detail=f"unreachable ({type(exc).__name__})")
    if have is not None:
        return Check(ok=True, detail=f"{have['cpu']:g} CPUs")
    if runner.prepare_error:
        return Check(ok=False, detail=f"could not start or join Ray: {runner.prepare_error}")
    return Check(ok=False, detail="starting")


def _mlflow(runner: StudyRunner) -> Check:
    uri = runner.tracking_uri
    if uri is None:
        return Check(ok=False, detail=runner.prepare_error or "starting the MLflow server")
    if not server_healthy(uri):
        return Check(ok=False, detail=f"{uri} does not answer /health")
    return Check(ok=True, detail=uri)
