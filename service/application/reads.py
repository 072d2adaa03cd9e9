"""The study service's reads: what the REST routes and the CLI without a server answer from the ledger
alone (a study, the list of studies, trials, best configurations, success, comparisons), one method per
route. The whole service (`service.application.study_service`) adds what creates, runs and plans
studies; these need no engine, runner or trainers, so the CLI's local queries import no torch, Ray or
MLflow (tests/test_imports.py)."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any, Protocol

from service.application.coalesce import Coalesced
from service.application.errors import NotFoundError
from service.application.records import (
    StudyList,
    StudyPublic,
    StudySummary,
    TrialCounts,
    TrialPage,
    TrialPublic,
)
from service.core.criterion_query import OWN, CriterionQuery, SuccessQuery
from service.core.errors import StudyError
from service.core.settings import Settings
from service.core.spec import STORED, StudySpec, expected_trials
from service.core.states import FINISHED, QUEUED, RESUMABLE, StudyState
from service.core.values import repr_value, six_digits, value_matches, value_sort_key
from service.reports.compare import Comparison, UnknownStudiesError, compare_studies
from service.reports.summary import (
    BestConfig,
    CriterionPublic,
    SuccessBudget,
    SuccessTable,
    best_configs,
    success_table,
    success_vs_budget,
)
from service.store.ledger import Ledger, StudyHead
from service.store.models import Study, Trial
from service.study.elsewhere import trained_elsewhere
from service.tracking.links import MlflowLinks
from trainers.criterion import Criterion

#: what `studies.plan` keeps for `service.planning.record.record_actual` only (trial ids), not served
PLAN_BOOKKEEPING = ("unfinished_ids", "last_id")


class Runs(Protocol):
    """What a read asks of this process's study runner (`service.runner.StudyRunner`): whether it has
    queued or runs a study, its ETA there, and the MLflow it tracks to (the links a study's answer gives)."""

    tracking_uri: str | None

    def is_queued(self, study_id: str) -> bool: ...

    def is_active(self, study_id: str) -> bool: ...

    def eta(self, study_id: str) -> float | None: ...

    def waiting(self, study_id: str) -> str | None: ...


class NoRuns:
    """The runner of a process that runs no study (the CLI reading its ledger): nothing queued or running
    here, and the MLflow the settings name, as a runner has before it starts one."""

    def __init__(self, tracking_uri: str | None) -> None:
        self.tracking_uri = tracking_uri

    def is_queued(self, study_id: str) -> bool:
        return False

    def is_active(self, study_id: str) -> bool:
        return False

    def eta(self, study_id: str) -> float | None:
        return None

    def waiting(self, study_id: str) -> str | None:
        return None


class StudyReads:
    def __init__(self, ledger: Ledger, settings: Settings, runner: Runs) -> None:
        self.ledger = ledger
        self.settings = settings
        self.runner = runner
        self._criteria: dict[tuple[str, datetime], Criterion] = {}  # `listed_criterion`'s
        self._pages: Coalesced[StudyList] = Coalesced()  # `list_studies`'

    def get(self, study_id: str) -> StudyPublic:
        return self.public(self._get(study_id))

    def list_studies(self, state: str | None, offset: int, limit: int) -> StudyList:
        """A page of studies, newest first, as summaries: one transaction of two queries (the page's
        studies with their count, their trials' statuses and losses), whatever its size; the same
        page asked for many times at once is computed once for the calls that came while the one
        before ran (`Coalesced`)."""

        def page() -> StudyList:
            if state == QUEUED:
                return self._queued(offset, limit)
            total, found = self.ledger.page_studies(state, offset, limit, self.listed_criterion)
            return StudyList(
                total=total, offset=offset, limit=limit, items=[self.summary(s, c) for s, c in found]
            )

        return self._pages.run((state, offset, limit), page)

    def _queued(self, offset: int, limit: int) -> StudyList:
        """A page of the studies this server has accepted and not started, newest first. Its runner's
        queue says which (the ledger does not: a queued study is `pending`, or `running` when a restart
        queued it again), so they are found among the studies it holds to run, a page at a time."""
        by_id: dict[str, StudySummary] = {}  # a study made while the pages are read shifts them: once each
        for state in RESUMABLE:
            start, total = 0, 1
            while start < total:
                total, found = self.ledger.page_studies(state, start, 500, self.listed_criterion)
                by_id |= {s.id: s for s in (self.summary(s, c) for s, c in found) if s.queued}
                start += 500
        queued = sorted(by_id.values(), key=lambda s: s.id)
        queued.sort(key=lambda s: s.created_at, reverse=True)  # the ledger's order: newest first, then id
        return StudyList(total=len(queued), offset=offset, limit=limit, items=queued[offset : offset + limit])

    def trials(
        self,
        study_id: str,
        statuses: list[str] | None,
        success: bool | None,
        sort: str,
        descending: bool,
        offset: int,
        limit: int,
        history: bool,
        models: list[str] | None = None,
        params: list[str] | None = None,
    ) -> TrialPage:
        study = self._get(study_id)
        criterion = self.criterion(study)
        values = {}
        for item in params or []:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise StudyError(
                    f"param={item!r}: write FIELD=VALUE, e.g. param=lr=0.001 (a value as tables print it)"
                )
            values[key] = value
        if models or values:
            # a grid holds its points from the start; a sampled study once it draws no more
            complete = study.validated_spec().sampler == "grid" or study.state not in ("pending", "running")
            self._check_filters(study_id, models or [], values, values_known=complete)
        total, rows = self.ledger.page_trials(
            study_id,
            statuses,
            success,
            criterion,
            sort,
            descending,
            offset,
            limit,
            models=models,
            params=values,
        )
        trained_by = self.trained_by(study, rows)
        return TrialPage(
            total=total,
            offset=offset,
            limit=limit,
            criterion=CriterionPublic.of(criterion),
            items=[trial_public(t, criterion, history, trained_by.get(t.config_hash)) for t in rows],
        )

    def trained_by(self, study: Study, rows: list[Trial]) -> dict[str, str]:
        """Among `rows`, the running study's pending trials another running study trains now: config
        hash → that study (what the study waits for, `service.study.elsewhere`)."""
        pending = {t.config_hash: t.status for t in rows if t.status == "pending"}
        if study.state != "running" or not pending:
            return {}
        return trained_elsewhere(pending, self.ledger.holders(study.id, sorted(pending)))

    def best(self, study_id: str, k: int, model: str | None) -> list[BestConfig]:
        criterion = self.criterion(self._get(study_id))
        self._check_filters(study_id, [model] if model else [], {})  # a typo would answer nothing
        return best_configs(self.ledger.trials(study_id), k=k, model=model, criterion=criterion)

    def success(self, study_id: str, query: SuccessQuery = OWN, reference: str | None = None) -> SuccessTable:
        """Successes under the study's criterion, or under the one the query names (a recount: nothing
        trains), at the end of each run or at a budget of `query.at_step` steps; with a `reference`
        model, each model's rate minus its own, with Newcombe's interval."""
        criterion = self.criterion(self._get(study_id), query)
        if reference is not None:
            self._check_filters(
                study_id, [reference], {}, field="reference"
            )  # a typo: refused, naming the models
        try:
            return success_table(self.ledger.trials(study_id), criterion, query.at_step, reference)
        except ValueError as exc:  # a reference in a study with no trial yet (a sampler's, before its draws)
            raise StudyError(str(exc)) from None

    def success_vs_budget(self, study_id: str, query: CriterionQuery = OWN) -> SuccessBudget:
        """Successes per model against training steps, under the study's criterion or the one the query
        names (as `success` takes it: a recount, nothing trains)."""
        criterion = self.criterion(self._get(study_id), query)
        return success_vs_budget(self.ledger.trials(study_id), criterion)

    def compare(self, study_ids: list[str], by: list[str], query: SuccessQuery = OWN) -> Comparison:
        """Success counts of the studies side by side (`service.reports.compare`)."""
        try:
            return compare_studies(self.ledger, study_ids, by, query)
        except UnknownStudiesError as exc:
            raise NotFoundError(str(exc)) from None

    def criterion(self, study: Study, query: CriterionQuery = OWN) -> Criterion:
        """The study's success criterion, or the one a request names instead."""
        return study.validated_spec().criterion_for(query)

    def listed_criterion(self, study: StudyHead) -> Criterion:
        """A listed study's criterion, its spec validated once per version of its row (a spec changes
        only with its row's `updated_at`): a list of 500 studies validates none again."""
        key = (study.id, study.updated_at)
        criterion = self._criteria.get(key)
        if criterion is None:
            if len(self._criteria) >= 4096:
                self._criteria.clear()
            criterion = self._criteria[key] = StudySpec.model_validate(study.spec, context=STORED).criterion()
        return criterion

    # ----- helpers -----------------------------------------------------------------------------------
    def _check_filters(
        self,
        study_id: str,
        models: list[str],
        params: dict[str, str],
        values_known: bool = False,
        field: str = "model",
    ) -> None:
        """A filter names a model and fields the study's trials have (a typo would filter to nothing),
        and, where the study holds all its points (`values_known`), a value one of them holds
        (`lr=abc`, `lr=0.002` would answer nothing). A value as a table prints it, in six digits
        (`params_texts`), is taken for the one value it shortens, written whole into `params`."""
        known_models, known_values = self.ledger.point_fields(study_id)
        known_names = set(known_values)
        if not known_models:  # a sampled study before its first draw: nothing to check against
            return
        for name in models:
            if name not in known_models:
                raise StudyError(
                    f"{field}={name!r}: no such model in this study; valid: {', '.join(sorted(known_models))}"
                )
        for name in params:
            if name not in known_names:
                raise StudyError(
                    f"param={name}=…: this study's points do not set {name!r}; valid: {', '.join(sorted(known_names))}"
                )
            held = known_values[name]
            if values_known and not any(value_matches(v, params[name]) for v in held):
                printed = sorted(
                    {repr_value(v) for v in held if six_digits(v) == params[name]}, key=value_sort_key
                )
                if len(printed) == 1:  # copied from a table: the one value it shortens
                    params[name] = printed[0]
                    continue
                if printed:
                    raise StudyError(
                        f"param={name}={params[name]}: {len(printed)} values of this study read so in six "
                        f"digits: {', '.join(printed)}; give one of them whole"
                    )
                shown = sorted({repr_value(v) for v in held}, key=value_sort_key)
                more = f" … ({len(shown)} in all)" if len(shown) > 12 else ""
                raise StudyError(
                    f"param={name}={params[name]}: no trial of this study has it; its values: "
                    f"{', '.join(shown[:12])}{more} (numbers match as numbers: lr=1e-3 finds 0.001)"
                )

    def _get(self, study_id: str) -> Study:
        study = self.ledger.get_study(study_id)
        if study is None:
            raise NotFoundError(
                f"no study {study_id!r}; `memsweep studies` (or GET /studies) lists the studies"
            )
        return study

    def summary(self, study: Study | StudyHead, c: dict[str, int]) -> StudySummary:
        """The study as `GET /studies` lists it, with its trials' counts `c` (`Ledger.counts`)."""
        return StudySummary(
            id=study.id,
            name=study.name,
            state=StudyState(study.state),
            error=study.error,
            queued=self.runner.is_queued(study.id),
            waiting=self.runner.waiting(study.id),
            active=self.runner.is_active(study.id),
            counts=TrialCounts(**c, finished=sum(c[s] for s in FINISHED)),
            expected_trials=expected_trials(study.spec, c["total"], study.state),
            created_at=study.created_at,
            updated_at=study.updated_at,
        )

    def public(self, study: Study) -> StudyPublic:
        summary = self.summary(study, self.ledger.counts(study.id, self.criterion(study)))
        return StudyPublic(
            **dict(summary),
            spec=study.spec,
            eta_seconds=self.eta(study, summary),
            mlflow=self.links(study),
            plan={k: v for k, v in study.plan.items() if k not in PLAN_BOOKKEEPING} if study.plan else None,
        )

    def eta(self, study: Study, summary: StudySummary) -> float | None:
        """Seconds left of a running study: its runner's, where this process runs it; where another does
        (`memsweep run` in another terminal, asked by `memsweep status`), at the pace its trials have
        finished since that run's plan was kept (`studies.plan`: when, and the trials it had left), or by
        the plan's estimate before any has; None when neither is known."""
        if study.state != "running":
            return None
        if self.runner.is_active(study.id):
            return self.runner.eta(study.id)
        plan = study.plan or {}
        try:
            since = time.time() - datetime.fromisoformat(plan["planned_at"]).timestamp()
        except (KeyError, TypeError, ValueError):  # no plan kept (it never raises a run: it may lack one)
            return None
        left = max(summary.expected_trials - summary.counts.finished, 0)
        done = self.ledger.finished_among(study.id, plan.get("unfinished_ids") or [])
        if done:
            return left * since / done
        estimate = ((plan.get("planned") or {}).get("estimate") or {}).get("wall_seconds")
        return max(float(estimate) - since, 0.0) if estimate is not None and since < float(estimate) else None

    def links(self, study: Study) -> MlflowLinks:
        return self.links_of(study.mlflow_experiment_id, study.mlflow_run_id)

    def links_of(self, exp: str | None, run: str | None) -> MlflowLinks:
        """An MLflow run's ids and its links in the UI."""
        return MlflowLinks.at(self.settings.mlflow_ui_url or self.runner.tracking_uri, exp, run)


def trial_public(
    t: Trial, criterion: Criterion, history: bool = False, trained_by: str | None = None
) -> TrialPublic:
    """A ledger row as REST serves it: every column under its own name, its success judged under the
    study's criterion; the series with `history`; `trained_by`: the study training it now, when this
    one waits for its result (`StudyReads.trained_by`)."""
    judged = {
        **t.judged(criterion),
        "last_evaluation": t.history[-1] if t.history else None,
        "trained_by": trained_by,
    }
    fields: dict[str, Any] = {
        name: judged[name] if name in judged else getattr(t, name) for name in TrialPublic.model_fields
    }
    if history:
        fields["history"] = t.history or []
    else:
        fields["history"] = fields["profile"] = fields["traceback"] = None
    return TrialPublic.model_validate(fields)
