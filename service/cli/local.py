"""The CLI without a server: this machine's ledger answered by the same `StudyService` the REST
server calls, behind the methods of the Python client that the CLI calls when it has a server
(`MemsweepClient`), in the same JSON. So each command has one path: `memsweep success ID` reads the
same table from a server (`--url`) and from the local ledger, and nothing is computed twice."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from pydantic import BaseModel

from service.application.study_service import StudyService
from service.client import TrialPages, param_filters
from service.core.settings import Settings
from service.core.spec import StudySpec
from service.runner import StudyRunner
from service.study.engine import Engine


class LocalStudies(TrialPages):
    """`MemsweepClient`'s reads over this machine's ledger. A plan calibrates on an embedded Ray
    (or the configured cluster), started in the runner's thread as the server starts it, and shut
    down on exit; nothing else starts Ray or MLflow but `sync` (which rebuilds MLflow's runs)."""

    def __init__(self, settings: Settings) -> None:
        self.engine = Engine(settings)
        self.runner = StudyRunner(self.engine, workers=1)  # runs nothing: it holds Ray for a plan
        self.service = StudyService(self.engine, self.runner)

    def __enter__(self) -> LocalStudies:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.runner.shutdown()

    def get(self, study_id: str) -> dict[str, Any]:
        return _json(self.service.get(study_id))

    def studies(self, state: str | None = None, *, offset: int = 0, limit: int = 50) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.studies_page(state, offset=offset, limit=limit)["items"]
        return items

    def studies_page(self, state: str | None = None, *, offset: int = 0, limit: int = 50) -> dict[str, Any]:
        return _json(self.service.list_studies(state, offset, limit))

    def plan(self, spec: StudySpec, recalibrate: bool = False) -> dict[str, Any]:
        return _json(self.service.plan(spec, recalibrate=recalibrate))

    def sync(self, study_id: str) -> dict[str, Any]:
        return _json(self.service.sync(study_id))

    def best(self, study_id: str, k: int = 5, model: str | None = None) -> list[dict[str, Any]]:
        return [_json(b) for b in self.service.best(study_id, k, model)]

    def success(
        self,
        study_id: str,
        fraction: float | None = None,
        threshold: float | None = None,
        baseline: str | None = None,
        at_step: int | None = None,
        reference: str | None = None,
    ) -> dict[str, Any]:
        return _json(self.service.success(study_id, fraction, threshold, baseline, at_step, reference))

    def comparison(
        self,
        studies: Sequence[str],
        by: str | Sequence[str] = "model",
        fraction: float | None = None,
        threshold: float | None = None,
        baseline: str | None = None,
        at_step: int | None = None,
        log: bool = False,
    ) -> dict[str, Any]:
        fields = by.split(",") if isinstance(by, str) else list(by)
        return _json(self.service.compare(list(studies), fields, fraction, threshold, baseline, at_step, log))

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
        page = self.service.trials(
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


def _json(answer: BaseModel) -> dict[str, Any]:
    return answer.model_dump(mode="json")
