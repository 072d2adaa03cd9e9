"""The ledger: studies and trials in a real database — the source of truth (Ray is only an executor).

Trials are keyed by the hash of their full resolved config (trainer version included). Resume runs
what is not finished; extending adds only new hashes; a finished trial of another study with the
same hash is reused instead of re-run. Its rows are `models`, its
database `database` (SQLite by default; any SQLAlchemy URL, PostgreSQL for a cluster), migrated when
a ledger opens. Every call is one transaction that outlasts a database restart (`service.store.patience`).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from enum import StrEnum
from typing import Any, NamedTuple, TypeVar, cast

from sqlalchemy import (
    Select,
    Table,
    bindparam,
    delete,
    func,
    select,
    text,
    update,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError
from sqlalchemy.orm import Session, load_only, sessionmaker

from service.core.states import FINISHED, TrialStatus
from service.core.trial import Known, TrialSpec, known_of
from service.core.values import value_matches
from service.store.database import connect
from service.store.models import (
    Calibration,
    IdempotencyKey,
    Study,
    Trial,
    now,
    pack_matrices,
    unpack_matrices,
)
from service.store.patience import outlasting
from trainers.criterion import HALF_BASELINE, Criterion
from trainers.result import RECORDED_FIELDS, Evaluation, TrialResult

T = TypeVar("T")

log = logging.getLogger(__name__)


class StudyHead(NamedTuple):
    """A study as a list shows it: its row without the plan (`Ledger.page_studies`)."""

    id: str
    name: str
    state: str
    error: str | None
    spec: dict[str, Any]
    created_at: datetime
    updated_at: datetime


class _KeyBound(Exception):
    """Another creation under the same Idempotency-Key bound it first (`Ledger.create_study`)."""


class Holder(NamedTuple):
    """Another running study that holds a trial still to train (`Ledger.holders`)."""

    config_hash: str
    status: str  # the trial's there: pending or running
    study_id: str
    created_at: datetime
    owner: str | None
    owner_beat: float | None


class TrialSort(StrEnum):
    ID = "id"
    FINAL_VAL_LOSS = "final_val_loss"
    SECONDS = "seconds"
    UPDATED_AT = "updated_at"
    MODEL = "model"


TRIAL_SORTS = tuple(s.value for s in TrialSort)
STATUSES = tuple(s.value for s in TrialStatus)


class ClaimLostError(RuntimeError):
    """A write for a study this process had claimed, refused: another process took the study over
    (this one's beats had stopped past the claim's lease), and runs it now."""


class Ledger:
    """Sessions over one database; every write goes through this class's methods.

    A study this process claimed (`claim_study`, until `release_study`) is *fenced*: every write of
    the study or its trials first writes the claim itself, conditionally — the study's row where its
    owner is still this process — in the same transaction (the write lock from there to the commit, on
    SQLite and PostgreSQL alike), and is refused with `ClaimLostError` once another process took the
    study over. So a process that lost a study (paused, or cut off from the database past the lease)
    writes none of its results over those of the process that runs it now; `claim_lost` says so."""

    def __init__(self, url: str) -> None:
        self.url = url
        #: SQLAlchemy's engine on the database (`database.connect`)
        self.database: Engine = connect(url)
        self._sessions = sessionmaker(self.database, expire_on_commit=False)
        self._held: dict[str, str] = {}  # the studies this process claimed: id → owner
        self._lost: set[str] = set()  # of those, the ones another process took over since

    @property
    def dialect(self) -> str:
        """The database's kind, as SQLAlchemy names it ("sqlite", "postgresql")."""
        return str(self.database.dialect.name)

    def unreachable(self) -> str | None:
        """The kind of error the database answers a query with (its type: the text may hold the URL's
        password); None when it answers (the server's readiness check, with `unwritable`)."""
        try:
            with self.database.connect() as conn:
                conn.execute(text("SELECT 1"))
        except Exception as exc:
            return type(exc).__name__
        return None

    def unwritable(self) -> str | None:
        """Why the database refuses writes now (None: it takes them): SQLite takes its write lock and
        lets it go (a read-only file, directory or mount refuses it), PostgreSQL says whether its
        transactions are read-only (a standby); the reason in the driver's words, without the URL."""
        try:
            with self.database.connect() as conn:
                if self.database.dialect.name == "sqlite":
                    raw = conn.connection.dbapi_connection
                    assert raw is not None
                    cursor = raw.cursor()
                    try:
                        cursor.execute("BEGIN IMMEDIATE")
                        cursor.execute("ROLLBACK")
                    finally:
                        cursor.close()
                elif (
                    self.database.dialect.name == "postgresql"
                    and conn.exec_driver_sql("SHOW transaction_read_only").scalar() == "on"
                ):
                    return "its transactions are read-only (a standby?)"
        except (OperationalError, InterfaceError) as exc:
            return str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
        except Exception as exc:  # the driver's own error (sqlite3's, psycopg2's), not wrapped
            return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self._sessions() as s, s.begin():
            yield s

    # ----- studies ---------------------------------------------------------------------------------
    @outlasting
    def create_study(
        self, name: str, spec: dict[str, Any], trials: Sequence[TrialSpec] = (), key: str | None = None
    ) -> Study:
        """A new study with its trials, and bound to its request's claimed idempotency `key`, in one
        transaction: never a study without the trials it holds (which a resume would have ended `done`
        with nothing run), nor one its request's retry cannot find."""
        study = Study(id=uuid.uuid4().hex[:12], name=name, spec=spec, state="pending")
        try:
            with self.session() as s:
                claimed = s.get(IdempotencyKey, key) if key is not None else None
                if claimed is not None and claimed.study_id is not None:  # this call's commit, retried
                    made = s.get(Study, claimed.study_id)
                    if made is not None:
                        return made
                s.add(study)
                s.flush()  # the row before its trials' foreign keys
                self._add_trials(s, study.id, trials)
                if claimed is not None:  # compare-and-set: of two creations under one key, one binds it
                    bound = s.execute(
                        update(IdempotencyKey)
                        .where(IdempotencyKey.key == key, IdempotencyKey.study_id.is_(None))
                        .values(study_id=study.id)
                    )
                    if getattr(bound, "rowcount", 1) != 1:
                        raise _KeyBound()
        except _KeyBound:  # the other creation's study, this one's rolled back
            with self.session() as s:
                row = s.get(IdempotencyKey, key)
                made = s.get(Study, row.study_id) if row is not None and row.study_id else None
            if made is None:
                raise
            return made
        return study

    @outlasting
    def get_study(self, study_id: str) -> Study | None:
        with self.session() as s:
            return s.get(Study, study_id)

    def study(self, study_id: str) -> Study:
        """The study, or KeyError naming it (`get_study`: None)."""
        study = self.get_study(study_id)
        if study is None:
            raise KeyError(f"no study {study_id!r}")
        return study

    @outlasting
    def list_studies(self) -> list[Study]:
        with self.session() as s:
            return list(s.scalars(select(Study).order_by(Study.created_at.desc())))

    @outlasting
    def page_studies(
        self,
        state: str | None = None,
        offset: int = 0,
        limit: int = 50,
        criterion: Callable[[StudyHead], Criterion] = lambda study: HALF_BASELINE,
    ) -> tuple[int, list[tuple[StudyHead, dict[str, int]]]]:
        """(how many studies are in `state` — or at all —, one page of them, newest first, each with its
        `counts` under `criterion(study)`): one transaction of two queries whatever the page's size
        (a third, the count, for a page past the end). A study's plan is not read: it is served one
        study at a time."""
        where = [Study.state == state] if state is not None else []
        columns = (
            Study.id,
            Study.name,
            Study.state,
            Study.error,
            Study.spec,
            Study.created_at,
            Study.updated_at,
        )
        with self.session() as s:
            query = (
                select(*columns, func.count().over().label("total"))
                .where(*where)
                .order_by(Study.created_at.desc(), Study.id)
                .offset(offset)
                .limit(limit)
            )
            rows = s.connection().execute(query).all()  # Core: plain rows, without the ORM's loading
            if rows:
                total = rows[0].total
            else:
                total = s.scalar(select(func.count()).select_from(Study).where(*where)) or 0
            heads = [StudyHead(*r[: len(columns)]) for r in rows]
            counts = self._counts(s, {h.id: criterion(h) for h in heads})
        return int(total), [(h, counts[h.id]) for h in heads]

    @outlasting
    def update_study(self, study_id: str, **fields: Any) -> None:
        self._update(Study, study_id, fields)

    @outlasting
    def claim_study(
        self, study_id: str, owner: str, gone: Callable[[str, float | None], bool]
    ) -> tuple[str, float | None] | None:
        """Make `owner` the process that runs the study when it has none, has `owner` already, or
        `gone(owner, beat)` says the one it has no longer runs (`service.study.claim`). None when
        claimed, else (the owner that holds it, its last beat). Compare-and-set: of two processes
        claiming at once, one wins; a retry after a lost commit finds itself the owner. A study this
        process holds already (another run of it here, or a sync of its MLflow runs: another owner) is
        refused like another process's: this process's fence of it is one owner's."""
        mine = self._held.get(study_id)
        if mine is not None and (mine == owner or not gone(mine, None)):
            return mine, None
        with self.session() as s:
            current, beat = s.execute(select(Study.owner, Study.owner_beat).where(Study.id == study_id)).one()
            if current not in (None, owner) and not gone(current, beat):
                return current, beat
            held = Study.owner.is_(None) if current is None else Study.owner == current
            claimed = s.connection().execute(  # Core: its rowcount
                update(Study).where(Study.id == study_id, held).values(owner=owner, owner_beat=time.time())
            )
            if claimed.rowcount != 1:
                row = s.execute(select(Study.owner, Study.owner_beat).where(Study.id == study_id)).one()
                return row.owner, row.owner_beat
        self._held[study_id] = owner  # committed: from here its writes are fenced
        self._lost.discard(study_id)
        return None

    @outlasting
    def cancel_unclaimed_study(self, study_id: str) -> bool:
        """Mark a pending study no process runs (none holds it, or only a sync of its MLflow runs)
        `cancelled`: a run cancelled before it could claim it; False when it is not so (another process
        claimed it meanwhile: its state is that one's)."""
        with self.session() as s:
            unclaimed = Study.owner.is_(None) | Study.owner.like("%/sync")
            done = s.connection().execute(
                update(Study)
                .where(Study.id == study_id, Study.state == "pending", unclaimed)
                .values(state="cancelled")
            )
            return done.rowcount == 1

    @outlasting
    def beat_study(self, study_id: str, owner: str) -> bool:
        """`owner` still runs the study; False when it no longer holds it (another process took it)."""
        with self.session() as s:
            beat = (
                update(Study)
                .where(Study.id == study_id, Study.owner == owner)
                .values(owner_beat=time.time(), updated_at=Study.updated_at)  # a beat is no change
            )
            beaten = s.connection().execute(beat).rowcount == 1
        if not beaten and self._held.get(study_id) == owner:
            self._lost.add(study_id)
        return beaten

    @outlasting
    def release_study(self, study_id: str, owner: str) -> None:
        """`owner` no longer runs the study (when it still holds it)."""
        if self._held.get(study_id) == owner:
            del self._held[study_id]
            self._lost.discard(study_id)
        with self.session() as s:
            s.connection().execute(
                update(Study)
                .where(Study.id == study_id, Study.owner == owner)
                .values(owner=None, owner_beat=None, updated_at=Study.updated_at)
            )

    def claim_lost(self, study_id: str) -> bool:
        """Whether another process took over a study this process holds (a write of it was refused,
        or a beat found it gone)."""
        return study_id in self._lost

    def _fence(self, s: Session, study_id: str) -> None:
        """Refuse this transaction's write (`ClaimLostError`) when this process claimed the study and
        no longer holds it; nothing for a study it did not claim. The check is a write of the claim
        (owner set to itself where it is this process's), so the transaction holds the write lock from
        the check to its commit: no takeover can fall between them."""
        owner = self._held.get(study_id)
        if owner is None:
            return
        still = update(Study).where(Study.id == study_id, Study.owner == owner)
        if s.connection().execute(still.values(owner=Study.owner, updated_at=Study.updated_at)).rowcount != 1:
            self._lost.add(study_id)
            current = s.scalar(select(Study.owner).where(Study.id == study_id))
            raise ClaimLostError(
                f"study {study_id} was taken over by another process ({current or 'none now'}) after this "
                f"one ({owner}) stopped beating for over its lease: this process's write was refused and its "
                "run stops; the study's results are that process's to write"
            )

    # ----- trials ----------------------------------------------------------------------------------
    @outlasting
    def add_trials(self, study_id: str, trials: Sequence[TrialSpec]) -> int:
        """Insert trials whose hash the study doesn't hold yet; reuse finished results of other
        studies. Returns how many were added."""
        with self.session() as s:
            self._fence(s, study_id)
            return self._add_trials(s, study_id, trials)

    @staticmethod
    def _add_trials(s: Session, study_id: str, trials: Sequence[TrialSpec]) -> int:
        added = 0
        have = set(s.scalars(select(Trial.config_hash).where(Trial.study_id == study_id)))
        hashes = [t.config_hash for t in trials if t.config_hash not in have]
        reusable: dict[str, Trial] = {}
        for chunk in _chunks(hashes, 500):
            for t in s.scalars(_reusable(select(Trial), chunk)):
                reusable.setdefault(t.config_hash, t)
        for spec in trials:
            if spec.config_hash in have:
                continue
            have.add(spec.config_hash)
            trial = Trial(
                study_id=study_id,
                config_hash=spec.config_hash,
                model=spec.model,
                params=dict(spec.params),
                config=spec.config,
            )
            prior = reusable.get(spec.config_hash)
            if prior is not None:
                _take_result(trial, prior)
            s.add(trial)
            added += 1
        return added

    @outlasting
    def done_of_models(self, models: Sequence[str]) -> list[Trial]:
        """Every trial of these model names that some study finished `done`, under any hash: its identity,
        config and provenance only (not its history or matrices), where a plan looks for results made
        under other code."""
        with self.session() as s:
            wanted = (Trial.id, Trial.study_id, Trial.config_hash, Trial.model, Trial.params, Trial.config)
            q = (
                select(Trial)
                .options(load_only(*wanted, Trial.provenance, raiseload=True))
                .where(Trial.model.in_(list(models)), Trial.status == "done")
                .order_by(Trial.id)
            )
            return list(s.scalars(q))

    @outlasting
    def holders(self, study_id: str, hashes: Sequence[str]) -> list[Holder]:
        """The other running studies that hold one of these trials still to train (pending or
        running): who may be training it now (`service.study.elsewhere` decides whether to wait)."""
        out: list[Holder] = []
        with self.session() as s:
            for chunk in _chunks(hashes, 500):
                rows = s.execute(
                    select(
                        Trial.config_hash, Trial.status, Study.id, Study.created_at, Study.owner,
                        Study.owner_beat,
                    )
                    .join(Study, Study.id == Trial.study_id)
                    .where(
                        Trial.config_hash.in_(chunk),
                        Trial.study_id != study_id,
                        Trial.status.in_((TrialStatus.PENDING, TrialStatus.RUNNING)),
                        Study.state == "running",
                    )
                )  # fmt: skip
                out += [Holder(*r) for r in rows]
        return out

    @outlasting
    def statuses(self, study_id: str, hashes: Sequence[str]) -> dict[str, str]:
        """The study's trials of these hashes: config hash → status."""
        out: dict[str, str] = {}
        with self.session() as s:
            for chunk in _chunks(hashes, 500):
                q = select(Trial.config_hash, Trial.status).where(
                    Trial.study_id == study_id, Trial.config_hash.in_(chunk)
                )
                out.update({h: st for h, st in s.execute(q)})
        return out

    @outlasting
    def finished_among(self, study_id: str, ids: Sequence[int]) -> int:
        """How many of the study's trials of these ids have finished (`FINISHED`)."""
        n = 0
        with self.session() as s:
            for chunk in _chunks(ids, 500):
                q = select(func.count()).where(
                    Trial.study_id == study_id, Trial.id.in_(chunk), Trial.status.in_(FINISHED)
                )
                n += int(s.execute(q).scalar_one())
        return n

    @outlasting
    def take_results(self, study_id: str, hashes: Sequence[str]) -> list[str]:
        """The study's unfinished trials of these hashes that another study has finished `done` since
        take that result (as `add_trials` does at their creation); the hashes that did."""
        taken = []
        with self.session() as s:
            self._fence(s, study_id)
            for chunk in _chunks(hashes, 500):
                done: dict[str, Trial] = {}
                for t in s.scalars(_reusable(select(Trial), chunk).where(Trial.study_id != study_id)):
                    done.setdefault(t.config_hash, t)
                mine = s.scalars(
                    select(Trial).where(
                        Trial.study_id == study_id,
                        Trial.config_hash.in_(list(done)),
                        Trial.status.not_in(FINISHED),
                    )
                )
                for trial in mine:
                    _take_result(trial, done[trial.config_hash])
                    taken.append(trial.config_hash)
        return taken

    @outlasting
    def reserve_trials(
        self, study_id: str, hashes: Sequence[str], alive: Callable[[str, float | None], bool]
    ) -> set[str]:
        """The study's unfinished trials of these hashes that no other running study holds `running`
        (reserved, or training) in a process that is `alive(owner, beat)`, marked `running` in the same
        transaction: a unit about to start holds them, so that another study's look sees them trained
        here from now on, not only once the unit's worker starts (it may wait for a free slot), and
        they no longer carry the reason an earlier run stopped them for (`start_trial` neither). The
        hashes it reserved (its own rows running already among them). The rows of every study with these
        hashes are locked while it looks (PostgreSQL; SQLite's writer lock, taken by the fence, holds
        every other writer): two studies reserve one trial one after the other, never both."""
        reserved: set[str] = set()
        with self.session() as s:
            self._fence(s, study_id)
            for chunk in _chunks(sorted(hashes), 500):
                rows = s.execute(
                    select(Trial, Study.state, Study.owner, Study.owner_beat)
                    .join(Study, Study.id == Trial.study_id)
                    .where(Trial.config_hash.in_(chunk))
                    .with_for_update(of=Trial)
                ).all()
                elsewhere = {
                    t.config_hash
                    for t, state, owner, beat in rows
                    if t.study_id != study_id and t.status == TrialStatus.RUNNING and state == "running"
                    and owner is not None and alive(owner, beat)
                }  # fmt: skip
                for t, *_ in rows:
                    if t.study_id == study_id and t.status not in FINISHED and t.config_hash not in elsewhere:
                        if t.status != TrialStatus.RUNNING:  # why a run before stopped it is no longer so
                            t.reason = None
                        t.status = TrialStatus.RUNNING
                        reserved.add(t.config_hash)
        return reserved

    @outlasting
    def pend_running(
        self, study_id: str, hashes: Sequence[str] | None, reason: str | None, forget_history: bool = True
    ) -> list[str]:
        """The study's trials of these hashes (None: all) still `running` back to `pending`: those a
        process that died left running (at the start of the study's next run, which holds its claim:
        no other process trains them), with `reason` and without that run's evaluations; or those its
        run reserved and never started (`forget_history` False: what an earlier run left, a cancelled
        one's evaluations, stays; `reason` None: as it was, none since the reservation). The hashes it
        sent back."""
        with self.session() as s:
            self._fence(s, study_id)
            q = select(Trial).where(Trial.study_id == study_id, Trial.status == TrialStatus.RUNNING)
            wanted = None if hashes is None else set(hashes)
            rows = [t for t in s.scalars(q) if wanted is None or t.config_hash in wanted]
            for t in rows:
                t.status = TrialStatus.PENDING
                if reason is not None:
                    t.reason = reason
                if forget_history:
                    t.history = None
            return [t.config_hash for t in rows]

    @outlasting
    def pend_orphans(
        self, study_id: str, reason: str, gone: Callable[[str, float | None], bool]
    ) -> list[str]:
        """The study's trials `running` back to `pending` with `reason`, their evaluations forgotten, when
        no live process holds the study: it has no owner, or `gone(owner, beat)` says the one it has died
        (`service.study.claim.gone`), so nothing trains them: a study queued before its turn, which its
        claim would take up only then (`pend_running`). A live owner's rows (a `memsweep run` in another
        shell, or a run of it in this process) are left as they are. The config hashes it sent back."""
        running = select(Trial).where(Trial.study_id == study_id, Trial.status == TrialStatus.RUNNING)
        with self.session() as s:
            owner, beat = s.execute(select(Study.owner, Study.owner_beat).where(Study.id == study_id)).one()
            if (owner is not None and not gone(owner, beat)) or s.scalar(running.limit(1)) is None:
                return []
        with self.session() as s:  # the owner it judged, written first: a claim since then waits or wins
            held = Study.owner.is_(None) if owner is None else Study.owner == owner
            unchanged = update(Study).where(Study.id == study_id, held)
            if s.connection().execute(unchanged.values(updated_at=Study.updated_at)).rowcount != 1:
                return []  # claimed since it looked: its new owner's to take up
            rows = list(s.scalars(running))
            for t in rows:
                t.status, t.reason, t.history = TrialStatus.PENDING, reason, None
            return [t.config_hash for t in rows]

    @outlasting
    def reusable(self, hashes: Sequence[str]) -> set[str]:
        """The hashes some study finished `done`: a trial of one of them that a study adds takes that
        result instead of running (`add_trials`)."""
        found: set[str] = set()
        with self.session() as s:
            for chunk in _chunks(hashes, 500):
                found.update(s.scalars(_reusable(select(Trial.config_hash), chunk)))
        return found

    @outlasting
    def trials(self, study_id: str, statuses: Sequence[str] | None = None) -> list[Trial]:
        with self.session() as s:
            q = select(Trial).where(Trial.study_id == study_id)
            if statuses:
                q = q.where(Trial.status.in_(statuses))
            return list(s.scalars(q.order_by(Trial.id)))

    @outlasting
    def page_trials(
        self,
        study_id: str,
        statuses: Sequence[str] | None = None,
        success: bool | None = None,
        criterion: Criterion = HALF_BASELINE,
        sort: str = "id",
        descending: bool = False,
        offset: int = 0,
        limit: int = 100,
        models: Sequence[str] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> tuple[int, list[Trial]]:
        """(how many match, one page of them): filtered by status, model, the point's values (`params`:
        field → value as tables print it, e.g. {"lr": "0.001"}) and success under `criterion`, sorted
        (empty values last)."""
        if sort not in TRIAL_SORTS:
            raise ValueError(f"sort {sort!r}: one of {', '.join(TRIAL_SORTS)}")
        where = [Trial.study_id == study_id]
        if statuses:
            where.append(Trial.status.in_(statuses))
        if models:
            where.append(Trial.model.in_(models))
        column = getattr(Trial, sort)
        order = [column.is_(None), column.desc() if descending else column.asc(), Trial.id]
        with self.session() as s:
            if success is None and not params:
                total = s.scalar(select(func.count()).select_from(Trial).where(*where)) or 0
                rows = s.scalars(select(Trial).where(*where).order_by(*order).offset(offset).limit(limit))
                return int(total), list(rows)
            # judged here, on the few columns the filters read: success by `Criterion.judge` (the one
            # rule), the point's values as the success tables print them
            light = s.execute(
                select(
                    Trial.id, Trial.status, Trial.final_val_loss, Trial.baseline_loss,
                    Trial.reference_baselines, Trial.params,
                ).where(*where).order_by(*order)
            )  # fmt: skip
            ids = []
            for r in light:
                if params and not all(value_matches(r.params.get(k), v) for k, v in params.items()):
                    continue
                if success is not None:
                    won = criterion.judge(r.status, r.final_val_loss, r.baseline_loss, r.reference_baselines)
                    if won != success or (not success and r.status not in FINISHED):
                        continue
                ids.append(r.id)
            page = ids[offset : offset + limit]
            found = {t.id: t for t in s.scalars(select(Trial).where(Trial.id.in_(page)))} if page else {}
            return len(ids), [found[i] for i in page]

    @outlasting
    def point_fields(self, study_id: str) -> tuple[set[str], dict[str, list[Any]]]:
        """The study's models, and each name its points set (seed included) with the values they set:
        what filters may name."""
        models: set[str] = set()
        values: dict[str, dict[str, Any]] = {}
        with self.session() as s:
            for model, params in s.execute(
                select(Trial.model, Trial.params).where(Trial.study_id == study_id)
            ):
                models.add(model)
                for k, v in params.items():
                    values.setdefault(k, {}).setdefault(repr(v), v)
        return models, {k: list(v.values()) for k, v in values.items()}

    @outlasting
    def trial(self, trial_id: int) -> Trial:
        with self.session() as s:
            row = s.get(Trial, trial_id)
            if row is None:
                raise KeyError(trial_id)
            return row

    @outlasting
    def update_trial(self, trial_id: int, **fields: Any) -> None:
        self._update(Trial, trial_id, fields)

    def _update(self, table: type[Study] | type[Trial], key: str | int, fields: dict[str, Any]) -> None:
        with self.session() as s:
            row = s.get(table, key)
            if row is None:
                raise KeyError(key)
            self._fence(s, row.id if isinstance(row, Study) else cast(Trial, row).study_id)
            for k, v in fields.items():
                setattr(row, k, v)

    @outlasting
    def start_trial(self, study_id: str, config_hash: str) -> int | None:
        """Mark a trial running (one more start); None when it is finished already."""
        with self.session() as s:
            trial = s.scalars(
                select(Trial).where(Trial.study_id == study_id, Trial.config_hash == config_hash)
            ).first()
            if trial is None or trial.status in FINISHED:
                return None
            self._fence(s, study_id)
            trial.status = "running"
            trial.runs = (trial.runs or 0) + 1
            # it trains from its first step: an earlier run's evaluations are not its, nor why that run
            # stopped (a cancel, a shutdown, a fault), nor where it ran (a lost node, until its new
            # worker says: `place_trials`); `runs` says it is a start again
            trial.history = None
            trial.reason = None
            trial.device = trial.node = None
            return trial.id

    def record_evaluations(self, study_id: str, histories: Mapping[int, Sequence[Evaluation]]) -> bool:
        """Running trials' evaluations so far (trial id → its evaluations), in one transaction of one
        statement (no row loaded): what a trial shows while it trains. A trial no longer running keeps
        what its end wrote. Best effort: False, at once, while the database does not answer (the
        caller writes them later; a result is what must outlast an outage, and its end writes it whole).
        A study this process no longer holds raises `ClaimLostError`, as every write does."""
        trials = cast(Table, Trial.__table__)
        write = (
            update(trials)
            .where(
                trials.c.id == bindparam("b_id"), trials.c.study_id == study_id, trials.c.status == "running"
            )
            .values(history=bindparam("b_history", type_=trials.c.history.type))
        )
        rows = [{"b_id": i, "b_history": [e.to_dict() for e in h] or None} for i, h in histories.items()]
        try:
            with self.session() as s:
                self._fence(s, study_id)
                if rows:
                    s.connection().execute(write, rows)
        except (OperationalError, InterfaceError) as exc:
            log.warning("ledger: the running trials' evaluations wait (%s)", str(exc).splitlines()[0])
            return False
        return True

    def place_trials(self, study_id: str, trial_ids: Sequence[int], device: str, node: str) -> bool:
        """Where running trials train (their device and node), as soon as their worker says: a running
        trial showed none until its end, so which node to take down, or which one was slow, could not be
        told. One statement; a trial no longer running keeps what its end wrote. Best effort, as
        `record_evaluations`: False, at once, while the database does not answer (its end writes both)."""
        trials = cast(Table, Trial.__table__)
        write = (
            update(trials)
            .where(
                trials.c.id.in_(list(trial_ids)), trials.c.study_id == study_id, trials.c.status == "running"
            )
            .values(device=device, node=node)
        )
        try:
            with self.session() as s:
                self._fence(s, study_id)
                if trial_ids:
                    s.connection().execute(write)
        except (OperationalError, InterfaceError) as exc:
            log.warning("ledger: where the running trials train waits (%s)", str(exc).splitlines()[0])
            return False
        return True

    @outlasting
    def finish_trial(self, trial_id: int, result: TrialResult) -> Trial:
        """Record a trial's result and its trained matrices (its success is the study's to judge)."""
        with self.session() as s:
            trial = s.get(Trial, trial_id)
            if trial is None:
                raise KeyError(trial_id)
            self._fence(s, trial.study_id)
            for name, value in result.to_dict().items():
                setattr(trial, name, value)
            if result.recurrent_matrix is not None:
                trial.matrices = pack_matrices(result.recurrent_matrix, result.input_matrix)
            return trial

    @outlasting
    def matrices(self, trial_id: int) -> dict[str, Any] | None:
        """A trial's trained {"W": [N][N], "V": [N][d] or None}, or None when it kept none."""
        with self.session() as s:
            data = s.scalar(select(Trial.matrices).where(Trial.id == trial_id))
        return unpack_matrices(data) if data else None

    def stop_trial(
        self,
        trial_id: int,
        status: str,
        reason: str,
        history: Sequence[Evaluation],
        task: TrialResult | None = None,
    ) -> None:
        """A trial that ended without a result, with the evaluations it made: `cancelled` by its study's
        user, `pending` to run again (its process stopped, or a fault its run retries), or `error` (a
        fault past its attempts); with a stop's `task`, what it records of its task (its baselines and
        budget, which judge those evaluations at a budget they reached)."""
        recorded = (
            {"baseline_loss": task.baseline_loss, "reference_baselines": task.reference_baselines or None,
             "budget_steps": task.budget_steps or None, "metric_name": task.metric_name}
            if task is not None and task.baseline_loss is not None
            else {}
        )  # fmt: skip
        self.update_trial(
            trial_id,
            status=status,
            reason=reason,
            history=[e.to_dict() for e in history] or None,
            **recorded,
        )

    @outlasting
    def finished_objectives(self, study_id: str, hashes: Iterable[str]) -> dict[str, Known]:
        """Each of these trials that has a result already — finished in this study, or done in another
        (reused when the study adds it) — as a unit counts it (`known_of`)."""
        wanted = list(hashes)
        out: dict[str, Known] = {}
        with self.session() as s:
            for chunk in _chunks(wanted, 500):
                for t in s.scalars(select(Trial).where(Trial.config_hash.in_(chunk))):
                    mine = t.study_id == study_id and t.status in FINISHED
                    if mine or t.status == "done":
                        out.setdefault(
                            t.config_hash,
                            known_of(t),
                        )
        return out

    @outlasting
    def counts(self, study_id: str, criterion: Criterion = HALF_BASELINE) -> dict[str, int]:
        """Trials per status, and how many succeeded under `criterion`."""
        with self.session() as s:
            return self._counts(s, {study_id: criterion})[study_id]

    def _counts(self, s: Session, criteria: Mapping[str, Criterion]) -> dict[str, dict[str, int]]:
        """`counts` of each study (id → its criterion), in one query for them all: each trial's status and
        the columns `Criterion.judge` (the one rule) reads (its reference baselines only when a
        criterion measures against one)."""
        out = {study_id: dict.fromkeys((*STATUSES, "succeeded"), 0) for study_id in criteria}
        references = any(c.threshold is None and c.baseline != "task" for c in criteria.values())
        columns: list[Any] = [Trial.study_id, Trial.status, Trial.final_val_loss, Trial.baseline_loss]
        if references:
            columns.append(Trial.reference_baselines)
        for chunk in _chunks(list(criteria), 500):
            for study_id, status, loss, baseline, *refs in s.connection().execute(
                select(*columns).where(Trial.study_id.in_(chunk))
            ):
                c = out[study_id]
                c[status] = c.get(status, 0) + 1
                reference = refs[0] if refs else None
                if status == "done" and criteria[study_id].judge(status, loss, baseline, reference):
                    c["succeeded"] += 1
        for c in out.values():
            c["total"] = sum(c[t] for t in STATUSES)
        return out

    # ----- calibrations ----------------------------------------------------------------------------
    def calibration(self, shape_key: str, node_type: str) -> Calibration | None:
        with self.session() as s:
            return s.scalars(
                select(Calibration).where(
                    Calibration.shape_key == shape_key, Calibration.node_type == node_type
                )
            ).first()

    def save_calibration(self, row: Calibration, replace: bool = False) -> None:
        """Keep a calibration; one already kept for its shape and node type stays unless `replace`
        (two plans that calibrated the same shape at once keep the first)."""
        with contextlib.suppress(IntegrityError), self.session() as s:
            if replace:
                s.execute(
                    delete(Calibration).where(
                        Calibration.shape_key == row.shape_key, Calibration.node_type == row.node_type
                    )
                )
            s.add(row)

    # ----- idempotency keys ------------------------------------------------------------------------
    @outlasting
    def claim_key(self, key: str, request_hash: str, owner: str | None = None) -> tuple[bool, IdempotencyKey]:
        """(True, row) when this call claimed the key for `owner`, the process that creates its study;
        (False, the existing row) when it was taken."""
        try:
            with self.session() as s:
                row = IdempotencyKey(key=key, request_hash=request_hash, owner=owner)
                s.add(row)
            return True, row
        except IntegrityError:
            with self.session() as s:
                existing = s.get(IdempotencyKey, key)
            if existing is None:  # released between the two statements: claim again
                return self.claim_key(key, request_hash, owner)
            return False, existing

    @outlasting
    def take_over_key(self, key: str, gone_owner: str | None, owner: str) -> bool:
        """Claim a key whose study was never made, from `gone_owner` (a process that died creating it):
        True when this call took it (no other retry did first)."""
        with self.session() as s:
            claimed = s.execute(
                update(IdempotencyKey)
                .where(
                    IdempotencyKey.key == key,
                    IdempotencyKey.study_id.is_(None),
                    IdempotencyKey.owner.is_(None)
                    if gone_owner is None
                    else IdempotencyKey.owner == gone_owner,
                )
                .values(owner=owner, created_at=now())
            )
            return bool(getattr(claimed, "rowcount", 0) == 1)

    @outlasting
    def release_key(self, key: str, owner: str | None = None) -> None:
        """Let go of a key whose study was not made, where `owner` still holds it (a retry may have
        taken it over meanwhile)."""
        with self.session() as s:
            row = s.get(IdempotencyKey, key)
            if row is not None and row.study_id is None and (owner is None or row.owner == owner):
                s.delete(row)


def _take_result(trial: Trial, prior: Trial) -> None:
    """`trial` takes `prior`'s finished result, naming it (`reused_from`)."""
    for f in (*RECORDED_FIELDS, "matrices"):
        setattr(trial, f, getattr(prior, f))
    trial.reused_from = prior.id


def _reusable(query: Select[Any], hashes: Sequence[str]) -> Select[Any]:
    """The reuse rule: a trial's result is reused by hash from any study that finished it `done`."""
    return query.where(Trial.config_hash.in_(hashes), Trial.status == "done")


def _chunks(items: Sequence[T], n: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]
