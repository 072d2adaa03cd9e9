"""The study service: what the REST routes and the CLI without a server both do, one method per route.
Its reads (`StudyReads`: a study, the list, trials, success, comparisons) answer from the ledger; this adds
what goes through the engine (creation, extension, a plan, a sync of MLflow) and the runner (background
runs, cancel, resume). Errors are the exceptions of `service.application.errors`, which the API turns
into 404 / 409 / 422 / 503 answers that say what to do next (`service.api.errors`) and the CLI into its
messages."""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from pydantic import ValidationError

from service.application.errors import (
    ConflictError,
    IdempotencyMismatchError,
    SpecInvalidError,
    UnavailableError,
)
from service.application.reads import StudyReads
from service.application.records import StudyExtend, StudyExtended, StudyPublic
from service.core.criterion_query import OWN, SuccessQuery
from service.core.errors import StudyError
from service.core.spec import StudySpec, stored_values_once
from service.core.states import FINISHED
from service.planning.plan import plan_spec
from service.planning.record import record_plan
from service.planning.types import StudyPlan
from service.reports.compare import Comparison, log_comparison
from service.runner import StudyRunner
from service.store.models import Study, utc
from service.study.claim import StudyBusyError, gone, this_process
from service.study.engine import Engine
from service.study.other_code import drawn_under_other_code
from service.study.plugins import admit_plugins, listing
from service.tracking.links import MlflowLinks

log = logging.getLogger(__name__)

#: seconds after which a key claimed on another host (or before keys named their process) whose study
#: was never made is taken over: creating a study takes at most minutes (its plugins' contract check
#: is bounded by 10)
KEY_LEASE_SECONDS = 900.0


class StudyService(StudyReads):
    runner: StudyRunner  # the reads ask it only what `Runs` names

    def __init__(self, engine: Engine, runner: StudyRunner) -> None:
        super().__init__(engine.ledger, engine.settings, runner)
        self.engine = engine

    # ----- creation ----------------------------------------------------------------------------------
    def create(self, spec: StudySpec, idempotency_key: str | None = None) -> tuple[StudyPublic, bool]:
        """Create the study and queue it; (study, created). A repeated key gives the first study back."""
        if idempotency_key is None:
            return self.public(self._create(spec)), True
        digest = spec_digest(spec)
        claimed, row = self.ledger.claim_key(idempotency_key, digest, this_process())
        if not claimed:
            if row.request_hash != digest:
                raise IdempotencyMismatchError(
                    "this Idempotency-Key came with a different study spec before; "
                    "send a new key for a new study, or repeat the first request unchanged"
                )
            if row.study_id is None:
                # its creator died before the study was made (a server killed mid-request): this retry
                # makes it, else every retry was refused for ever
                if not (
                    gone(row.owner or "", utc(row.created_at).timestamp(), lease=KEY_LEASE_SECONDS)
                    and self.ledger.take_over_key(idempotency_key, row.owner, this_process())
                ):
                    raise ConflictError(
                        "a request with this Idempotency-Key is still being processed; retry in a moment"
                    )
                return self.public(self._create(spec, idempotency_key)), True
            return self.public(self._get(row.study_id)), False
        return self.public(self._create(spec, idempotency_key)), True

    def _create(self, spec: StudySpec, idempotency_key: str | None = None) -> Study:
        """Make the study, bound to its request's key in the same transaction, and queue it. Until the
        study exists a failure releases the key (the request may be sent again); after, the key gives
        this study back: a retry of a request whose answer was lost never makes a second study."""
        try:
            study_id = self._make(spec, idempotency_key)
        except BaseException:
            if idempotency_key is not None:
                self.ledger.release_key(idempotency_key, this_process())
            raise
        try:
            record_plan(self.engine, study_id, calibrate=False)  # from the cache; the run calibrates the rest
        except Exception:  # an estimate: the run plans again before it trains
            log.warning("study %s: its plan was not recorded; the run plans it", study_id, exc_info=True)
        self.runner.submit(study_id)
        return self._get(study_id)

    def _placeable(self, spec: StudySpec) -> None:
        """Refuse resources no node can ever give a trial: such a study (or its plan's calibration)
        would wait forever. Asked of the cluster once Ray is up; an embedded Ray is this machine."""
        why = self.runner.unplaceable({"cpu": spec.resources.cpus, "gpu": spec.resources.gpus})
        if why is not None:
            self.engine.space(spec)  # a field the resources cannot serve is named first (`check_execution`)
            raise StudyError(f"resources: {why}")

    def _make(self, spec: StudySpec, idempotency_key: str | None) -> str:
        self._placeable(spec)
        try:
            return self.engine.create_study(
                spec, nodes=self.runner.node_plugins, idempotency_key=idempotency_key
            ).id
        except StudyError:
            raise
        except (ValueError, KeyError, TypeError) as exc:  # a value the trainers refuse, met in a later point
            raise StudyError(
                f"{exc}; fix the spec's values (GET /presets/{{name}} shows valid ones)"
            ) from None

    def plugins(self) -> tuple[list[dict[str, Any]], dict[str, dict[str, str]] | None]:
        """The plugins installed here, with what breaks each one's contract (`service.study.plugins.listing`),
        and each Ray node's once a cluster is joined (None on an embedded Ray: this machine's are the
        server's)."""
        nodes = self.runner.node_plugins()
        return listing(), (None if nodes is None else {node: dict(there) for node, there in nodes.items()})

    def plan(self, spec: StudySpec, recalibrate: bool = False) -> StudyPlan:
        """What the spec's study would run and cost (`service.planning.plan`), calibrating the shapes the
        cache lacks on this server's Ray (brought up for them) unless the server runs no studies;
        nothing is stored but calibrations."""
        self._placeable(spec)
        calibrate = self.runner.workers > 0
        try:  # Ray lives in the runner's thread, started there only when the plan needs it
            # the plugins' checks a study made of this spec meets (a plan that said it would run, or
            # reuse results of a plugin's old code, for a study the door then refused)
            admit_plugins(self.engine.space(spec), self.runner.node_plugins)
            planned = plan_spec(
                self.engine,
                spec,
                calibrate=calibrate,
                recalibrate=recalibrate,
                start_ray=self.runner.start_ray,
            )
        except StudyError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise StudyError(
                f"{exc}; fix the spec's values (GET /presets/{{name}} shows valid ones)"
            ) from None
        if not calibrate:
            planned.notes.append(
                "this server runs no studies (MEMSWEEP_MAX_PARALLEL_STUDIES=0): no Ray to calibrate on, "
                "only cached calibrations are used"
            )
        return planned

    def extend(self, study_id: str, changes: StudyExtend) -> StudyExtended:
        study = self._get(study_id)
        if self.runner.is_active(study_id) or study.state == "running":
            raise ConflictError(
                f"study {study_id} is {self._state_word(study)}; extend it once it has finished, "
                f"or POST /studies/{study_id}/cancel first"
            )
        data = stored_values_once(study.spec)
        for key, value in changes.model_dump(exclude_none=True).items():
            data[key] = {**(data.get(key) or {}), **value} if key in ("dims", "base") else value
        try:
            spec = StudySpec.model_validate(data)
            added = self.engine.extend_study(study_id, spec, nodes=self.runner.node_plugins)
        except ValidationError as exc:  # a value the spec's own checks refuse: named by its path
            raise SpecInvalidError.of(exc) from None
        except StudyError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise StudyError(f"{exc}; fix the extension's values") from None
        if added > 0:  # nothing new: the study stays as it was
            self.runner.submit(study_id)
        return StudyExtended(added=added, study=self.public(self._get(study_id)))

    # ----- state changes -----------------------------------------------------------------------------
    def cancel(self, study_id: str) -> StudyPublic:
        study = self._get(study_id)
        if not self.runner.cancel(study_id):
            if self.runner.is_queued(study_id):  # held by another process, or a dead one's: not ours yet
                raise ConflictError(
                    f"study {study_id} is queued here, but the ledger says another process holds it (a "
                    f"`memsweep run` on this ledger), or one that died left it running: this server may "
                    f"cancel it once it starts it. Cancel it where it runs, or again once it runs here"
                )
            if study.state in ("pending", "running"):
                raise ConflictError(
                    f"study {study_id} is {study.state} in the ledger but this server is not running it "
                    f"(another process is, or it waits for a restart); cancel it where it runs"
                )
            raise ConflictError(
                f"study {study_id} is {study.state}: there is nothing to cancel"
                + (
                    f"; POST /studies/{study_id}/resume runs its unfinished trials"
                    if study.state != "done"
                    else ""
                )
            )
        return self.public(self._get(study_id))

    def resume(self, study_id: str) -> StudyPublic:
        study = self._get(study_id)
        if self.runner.is_active(study_id):
            raise ConflictError(
                f"study {study_id} is {self._state_word(study)} already; "
                f"GET /studies/{study_id} follows it, POST /studies/{study_id}/cancel stops it"
            )
        if study.state == "running":
            raise ConflictError(
                f"study {study_id} is running in another process; resume it there once it stops"
            )
        if study.state == "done" and not self._unfinished(study_id):
            raise ConflictError(
                f"study {study_id} is done: every trial finished. POST /studies/{study_id}/extend adds points"
            )
        # refused here, as an extension is, not accepted and then failed by the run
        admit_plugins(
            self.engine.space(study.validated_spec()),
            self.runner.node_plugins,
            again=f"resume study {study_id} again",
        )
        spec = study.validated_spec()
        drawn_otherwise = (
            None if spec.sampler == "grid" else drawn_under_other_code(self.ledger.trials(study_id), "resume")
        )
        if drawn_otherwise:
            raise ConflictError(drawn_otherwise)
        previous = {"state": study.state, "error": study.error}
        self.ledger.update_study(study_id, state="pending", error=None)
        if not self.runner.submit(study_id):
            self.ledger.update_study(study_id, **previous)
            raise ConflictError("the server is shutting down; resume the study after it restarts")
        return self.public(self._get(study_id))

    def sync(self, study_id: str) -> StudyPublic:
        """Rebuild the study's MLflow runs from the ledger (after MLflow lost writes, or its store)."""
        study = self._get(study_id)
        if self.runner.is_active(study_id) or study.state == "running":
            raise ConflictError(
                f"study {study_id} is {self._state_word(study)}: its runs are being written; sync it once it stops"
            )
        try:
            summary = self.engine.sync_tracking(study_id)
        except StudyBusyError as exc:  # a run claimed it after the check above, or a sync holds it
            raise ConflictError(str(exc)) from None
        self.runner.tracking_uri = self.runner.tracking_uri or self.engine.tracking_uri()  # its links
        if summary["mlflow_errors"]:
            raise UnavailableError(
                f"MLflow did not take the study's runs ({summary['mlflow_errors'][0][:300]}); "
                "the ledger keeps every result: sync again once MLflow answers"
            )
        return self.public(self._get(study_id))

    # ----- a comparison logged to MLflow -------------------------------------------------------------
    def compare(
        self, study_ids: list[str], by: list[str], query: SuccessQuery = OWN, log: bool = False
    ) -> Comparison:
        """Success counts of the studies side by side (`service.reports.compare`); with `log`, also an MLflow
        run holding the table and its figure."""
        comparison = super().compare(study_ids, by, query)
        if log:
            comparison.mlflow = self._log_comparison(comparison)
        return comparison

    def _log_comparison(self, comparison: Comparison) -> MlflowLinks:
        from service.tracking.server import server_healthy
        from service.tracking.tracker import is_server

        uri = self.runner.tracking_uri or self.engine.settings.mlflow_tracking_uri
        if uri is None:
            uri = self.engine.tracking_uri()  # starts the local MLflow server, as a study would
        if is_server(uri) and not server_healthy(uri):
            raise UnavailableError(
                f"MLflow at {uri} does not answer, so the comparison was not logged; ask again without "
                "log=true for the table, or when MLflow is up (GET /ready)"
            )
        tracker = self.engine.new_tracker(uri)
        try:
            exp_id, run_id = log_comparison(comparison, tracker)
        finally:
            tracker.close()
        return self.links_of(exp_id, run_id)

    # ----- helpers -----------------------------------------------------------------------------------
    def _unfinished(self, study_id: str) -> bool:
        c = self.ledger.counts(study_id)
        return c["total"] > sum(c[s] for s in FINISHED)

    def _state_word(self, study: Study) -> str:
        return "queued" if self.runner.is_queued(study.id) else "running"


def spec_digest(spec: StudySpec) -> str:
    return hashlib.sha256(json.dumps(spec.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()
