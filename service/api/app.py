"""The FastAPI app: `create_app(settings)` wires settings, the engine, the background runner, the routes,
the error answers and the limits. One Engine per process; on start-up every unfinished study resumes.

    uvicorn.run(create_app(), host="127.0.0.1", port=8000)      # what `memsweep serve` does
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.concurrency import run_in_threadpool

from service.api.errors import install_error_handlers
from service.api.limits import BodyLimit, LedgerPatience
from service.api.routes import api_router
from service.application.study_service import StudyService
from service.core.settings import Settings, get_settings
from service.runner import StudyRunner
from service.study.engine import Engine
from service.study.nodes import prepare_ray_process
from service.tracking.tracker import prepare_mlflow_process

log = logging.getLogger(__name__)

DESCRIPTION = """\
Hyperparameter studies of long-memory RNNs, run by Ray Tune, recorded in a ledger and in MLflow.

POST a study (a paper's grid from `/presets` with overrides, or your own space); it runs in the
background. Follow it at `/studies/{id}` (counts, ETA, MLflow links) and ask for `/best` and `/success`
(successful runs per model and per hyperparameter value, with 95 % Wilson intervals).
When the server sets `MEMSWEEP_API_TOKEN`, send it as `Authorization: Bearer <token>` (all but `/health`).
"""


def _version() -> str:
    try:
        return version("memsweep")
    except PackageNotFoundError:
        return "0+unknown"


def create_app(settings: Settings | None = None) -> FastAPI:
    """The app over these settings (default: the environment's, `get_settings()`)."""
    settings = settings or get_settings()
    prepare_ray_process(settings)  # before anything imports Ray: its token, its signal handler
    prepare_mlflow_process()  # before any MLflow request: its retries, its timeout

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = Engine(settings)
        runner = StudyRunner(engine, settings.max_parallel_studies)
        app.state.engine, app.state.runner = engine, runner
        app.state.studies = StudyService(engine, runner)
        await run_in_threadpool(runner.start)
        try:
            yield
        finally:
            await run_in_threadpool(runner.shutdown)  # stops the studies, then the embedded Ray

    app = FastAPI(
        title="memsweep",
        version=_version(),
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # served by routes/docs.py: open to a browser, its calls need the token
        redoc_url=None,
        openapi_url=None,
    )

    async def these_settings() -> Settings:  # async: no hop to the thread pool per request (deps.py)
        return settings

    app.dependency_overrides[get_settings] = these_settings
    install_error_handlers(app)
    app.include_router(api_router)
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes)
    app.add_middleware(LedgerPatience)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "Idempotency-Key"],
        )
    return app
