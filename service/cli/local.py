"""The CLI without a server: this machine's ledger answered by the same study service the REST server
calls, behind the methods of the Python client that the CLI calls when it has a server
(`MemsweepClient`), in the same JSON. So each command has one path: `memsweep success ID` reads the
same table from a server (`--url`) and from the local ledger, and nothing is computed twice. A read
goes through the service's reads (`StudyReads`) on the ledger alone, importing no torch, Ray or MLflow;
a plan, a sync and a comparison logged to MLflow build the whole service (engine and runner) first."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from service.application.errors import NotFoundError
from service.application.reads import NoRuns, StudyReads
from service.cli.console import ASK_A_SERVER
from service.client import TrialPages, param_filters, query_values
from service.core.criterion_query import SuccessQuery
from service.core.settings import Settings
from service.core.spec import StudySpec
from service.core.states import QUEUED
from service.store.ledger import Ledger

if TYPE_CHECKING:
    from service.application.study_service import StudyService


class LocalStudies(TrialPages):
    """`MemsweepClient`'s reads over this machine's ledger. A plan calibrates on an embedded Ray
    (or the configured cluster), started in the runner's thread as the server starts it, and shut
    down on exit; nothing else starts Ray or MLflow but `sync` (which rebuilds MLflow's runs) and a
    comparison logged to MLflow."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._reads: StudyReads | None = None
        self._service: StudyService | None = None

    @property
    def where(self) -> str:
        """This machine's ledger, as a message names it (`ledger_place`)."""
        return ledger_place(self.settings)

    @property
    def reads(self) -> StudyReads:
        """The reads: the whole service's once it is built, else the ledger's alone (opened as the
        engine opens it); a ledger not made yet is not made to say it holds no study."""
        if self._service is not None:
            return self._service
        self._made()
        if self._reads is None:
            self.settings.home.mkdir(parents=True, exist_ok=True)
            ledger = Ledger(self.settings.resolved_database_url())
            self._reads = StudyReads(ledger, self.settings, NoRuns(self.settings.mlflow_tracking_uri))
        return self._reads

    @property
    def service(self) -> StudyService:
        """The whole study service, built on first use: a plan, a sync, a comparison logged to MLflow."""
        if self._service is None:
            from service.application.study_service import StudyService
            from service.runner import StudyRunner
            from service.study.engine import Engine

            engine = Engine(self.settings)
            runner = StudyRunner(engine, workers=1)  # runs nothing: it holds Ray for a plan
            self._service = StudyService(engine, runner)
        return self._service

    def _made(self) -> None:
        """Refuses (`NotFoundError`, saying where it looked) when this machine's ledger is not made yet:
        a read, or a sync, makes none to find nothing in it."""
        if not ledger_exists(self.settings):
            raise NotFoundError(
                f"this machine has no ledger yet ({self.where}): nothing ran here. {ASK_A_SERVER}"
            )

    def __enter__(self) -> LocalStudies:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._service is not None:
            self._service.runner.shutdown()

    @contextlib.contextmanager
    def _here(self) -> Iterator[None]:
        """A study this ledger lacks is said with where the ledger is and how to ask a server instead."""
        try:
            yield
        except NotFoundError as exc:
            said = str(exc)
            if not said.startswith("this machine has no ledger"):
                said = f"{said}. That is this machine's ledger ({self.where}); {ASK_A_SERVER}"
            raise NotFoundError(said) from None

    def get(self, study_id: str) -> dict[str, Any]:
        with self._here():
            return _json(self.reads.get(study_id))

    def studies(self, state: str | None = None, *, offset: int = 0, limit: int = 50) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.studies_page(state, offset=offset, limit=limit)["items"]
        return items

    def studies_page(self, state: str | None = None, *, offset: int = 0, limit: int = 50) -> dict[str, Any]:
        """A page of this ledger's studies; none, without making a ledger, where there is none yet, and
        none `queued` (a server's runner queues studies: nothing is queued where nothing serves)."""
        if state == QUEUED or not ledger_exists(self.settings):
            return {"total": 0, "offset": offset, "limit": limit, "items": []}
        return _json(self.reads.list_studies(state, offset, limit))

    def plan(self, spec: StudySpec, recalibrate: bool = False) -> dict[str, Any]:
        return _json(self.service.plan(spec, recalibrate=recalibrate))

    def sync(self, study_id: str) -> dict[str, Any]:
        self._made()
        with self._here():
            return _json(self.service.sync(study_id))

    def best(self, study_id: str, k: int = 5, model: str | None = None) -> list[dict[str, Any]]:
        with self._here():
            return [_json(b) for b in self.reads.best(study_id, k, model)]

    def success(
        self,
        study_id: str,
        fraction: float | None = None,
        threshold: float | None = None,
        baseline: str | None = None,
        at_step: int | None = None,
        reference: str | None = None,
        *,
        query: SuccessQuery | None = None,
    ) -> dict[str, Any]:
        asked = _asked(query, fraction=fraction, threshold=threshold, baseline=baseline, at_step=at_step)
        with self._here():
            return _json(self.reads.success(study_id, asked, reference))

    def comparison(
        self,
        studies: Sequence[str],
        by: str | Sequence[str] = "model",
        fraction: float | None = None,
        threshold: float | None = None,
        baseline: str | None = None,
        at_step: int | None = None,
        log: bool = False,
        *,
        query: SuccessQuery | None = None,
    ) -> dict[str, Any]:
        ids, fields = list(studies), by.split(",") if isinstance(by, str) else list(by)
        asked = _asked(query, fraction=fraction, threshold=threshold, baseline=baseline, at_step=at_step)
        if log:  # an MLflow run of its own, through the engine's tracker
            return _json(self.service.compare(ids, fields, asked, log=True))
        with self._here():
            return _json(self.reads.compare(ids, fields, asked))

    def trials_page(
        self,
        study_id: str,
        offset: int = 0,
        limit: int = 500,
        status: str | list[str] | None = None,
        success: bool | None = None,
        sort: str = "id",
        order: str = "asc",
        history: bool = False,
        model: str | list[str] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        with self._here():
            page = self.reads.trials(
                study_id,
                [status] if isinstance(status, str) else status,
                success,
                sort,
                order == "desc",
                offset,
                limit,
                history,
                models=[model] if isinstance(model, str) else model,
                params=param_filters(params or {}),
            )
        return _json(page)


def ledger_place(settings: Settings) -> str:
    """Where this machine's ledger is, as a message names it: its SQLite file, or its database's URL
    (the password hidden)."""
    from sqlalchemy.engine import make_url

    url = make_url(settings.resolved_database_url())
    if url.get_backend_name() == "sqlite" and url.database:
        return url.database
    return url.render_as_string(hide_password=True)


def ledger_exists(settings: Settings) -> bool:
    """Whether this machine's ledger has been made: the default SQLite file in MEMSWEEP_HOME exists. A
    ledger named by MEMSWEEP_DATABASE_URL is taken to (opening it says when it cannot be: a file in a
    folder that does not exist, a server that does not answer, which a user who set it needs to hear)."""
    from sqlalchemy.engine import make_url

    if settings.database_url is not None:
        return True
    url = make_url(settings.resolved_database_url())
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return True
    return Path(url.database).exists()


def _json(answer: BaseModel) -> dict[str, Any]:
    return answer.model_dump(mode="json")


def _asked(query: SuccessQuery | None, **given: Any) -> SuccessQuery:
    """`query`, or the keywords as one, checked by the bounds a server's query parameters have: the
    ledger is refused what a server is (it counted `at_step=0` at each run's end)."""
    return SuccessQuery(**query_values(query, **given))
