"""The ledger: studies and trials in a real database — the source of truth (Ray is only an executor).

Trials are keyed by the hash of their full resolved config (trainer version included). Resume runs
what is not finished; extending adds only new hashes; a finished trial of another study with the
same hash is reused instead of re-run. SQLite by default; any SQLAlchemy URL (Postgres) works.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    func,
    select,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

STUDY_STATES = ("pending", "running", "done", "failed", "cancelled")
TRIAL_STATES = ("pending", "running", "done", "failed", "pruned", "cancelled")
FINISHED = ("done", "failed", "pruned")


def now() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class Study(Base):
    __tablename__ = "studies"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    mlflow_experiment_id: Mapped[str | None] = mapped_column(String(64), default=None)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64), default=None)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now, onupdate=now)


class Trial(Base):
    __tablename__ = "trials"
    __table_args__ = (UniqueConstraint("study_id", "config_hash", name="uq_trial_study_hash"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study_id: Mapped[str] = mapped_column(ForeignKey("studies.id"), index=True)
    config_hash: Mapped[str] = mapped_column(String(32), index=True)
    model: Mapped[str] = mapped_column(String(100))
    params: Mapped[dict[str, Any]] = mapped_column(JSON)  # the point's varied settings, seed included
    config: Mapped[dict[str, Any]] = mapped_column(JSON)  # the full resolved trial config
    status: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    reason: Mapped[str | None] = mapped_column(Text, default=None)
    final_val_loss: Mapped[float | None] = mapped_column(Float, default=None)
    final_metric: Mapped[float | None] = mapped_column(Float, default=None)
    baseline_loss: Mapped[float | None] = mapped_column(Float, default=None)
    success_threshold: Mapped[float | None] = mapped_column(Float, default=None)
    success: Mapped[bool | None] = mapped_column(default=None)
    steps: Mapped[int | None] = mapped_column(Integer, default=None)
    seconds: Mapped[float | None] = mapped_column(Float, default=None)
    henrici: Mapped[float | None] = mapped_column(Float, default=None)
    profile: Mapped[list[float] | None] = mapped_column(JSON, default=None)  # weight profile over i − j
    history: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, default=None)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64), default=None)
    reused_from: Mapped[int | None] = mapped_column(Integer, default=None)
    runs: Mapped[int] = mapped_column(Integer, default=0)  # times it was started (resume evidence)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now, onupdate=now)

    RESULT_FIELDS = (
        "status", "reason", "final_val_loss", "final_metric", "baseline_loss", "success_threshold",
        "success", "steps", "seconds", "henrici", "profile", "history",
    )  # fmt: skip


class IdempotencyKey(Base):
    """A client's Idempotency-Key: the request it came with and the study that request created."""

    __tablename__ = "idempotency_keys"

    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    study_id: Mapped[str | None] = mapped_column(String(32), default=None)  # None while being created
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)


TRIAL_SORTS = ("id", "final_val_loss", "seconds", "updated_at", "model")


class Ledger:
    """Sessions over one database; every write goes through this class's methods."""

    def __init__(self, url: str) -> None:
        self.url = url
        kwargs: dict[str, Any] = {}
        if url.startswith("sqlite"):
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        self.engine: Engine = create_engine(url, **kwargs)
        if url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
        Base.metadata.create_all(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self._sessions() as s, s.begin():
            yield s

    # ----- studies ---------------------------------------------------------------------------------
    def create_study(self, name: str, spec: dict[str, Any]) -> Study:
        study = Study(id=uuid.uuid4().hex[:12], name=name, spec=spec, state="pending")
        with self.session() as s:
            s.add(study)
        return study

    def get_study(self, study_id: str) -> Study | None:
        with self.session() as s:
            return s.get(Study, study_id)

    def list_studies(self) -> list[Study]:
        with self.session() as s:
            return list(s.scalars(select(Study).order_by(Study.created_at.desc())))

    def update_study(self, study_id: str, **fields: Any) -> None:
        self._update(Study, study_id, fields)

    # ----- trials ----------------------------------------------------------------------------------
    def add_trials(self, study_id: str, rows: Sequence[dict[str, Any]]) -> int:
        """Insert trials whose hash the study doesn't hold yet; reuse finished results of other studies.
        Each row: config_hash, model, params, config. Returns how many were added."""
        added = 0
        with self.session() as s:
            have = set(s.scalars(select(Trial.config_hash).where(Trial.study_id == study_id)))
            hashes = [r["config_hash"] for r in rows if r["config_hash"] not in have]
            reusable: dict[str, Trial] = {}
            for chunk in _chunks(hashes, 500):
                for t in s.scalars(
                    select(Trial).where(Trial.config_hash.in_(chunk), Trial.status.in_(("done",)))
                ):
                    reusable.setdefault(t.config_hash, t)
            for r in rows:
                if r["config_hash"] in have:
                    continue
                have.add(r["config_hash"])
                trial = Trial(study_id=study_id, **r)
                prior = reusable.get(r["config_hash"])
                if prior is not None:
                    for f in Trial.RESULT_FIELDS:
                        setattr(trial, f, getattr(prior, f))
                    trial.reused_from = prior.id
                s.add(trial)
                added += 1
        return added

    def trials(self, study_id: str, statuses: Sequence[str] | None = None) -> list[Trial]:
        with self.session() as s:
            q = select(Trial).where(Trial.study_id == study_id)
            if statuses:
                q = q.where(Trial.status.in_(statuses))
            return list(s.scalars(q.order_by(Trial.id)))

    def page_trials(
        self,
        study_id: str,
        statuses: Sequence[str] | None = None,
        success: bool | None = None,
        sort: str = "id",
        descending: bool = False,
        offset: int = 0,
        limit: int = 100,
    ) -> tuple[int, list[Trial]]:
        """(how many match, one page of them): filtered by status and success, sorted (empty values last)."""
        if sort not in TRIAL_SORTS:
            raise ValueError(f"sort {sort!r}: one of {', '.join(TRIAL_SORTS)}")
        where = [Trial.study_id == study_id]
        if statuses:
            where.append(Trial.status.in_(statuses))
        if success is not None:
            where.append(Trial.success.is_(success))
        column = getattr(Trial, sort)
        order = [column.is_(None), column.desc() if descending else column.asc(), Trial.id]
        with self.session() as s:
            total = s.scalar(select(func.count()).select_from(Trial).where(*where)) or 0
            rows = s.scalars(select(Trial).where(*where).order_by(*order).offset(offset).limit(limit))
            return int(total), list(rows)

    def get_trial(self, study_id: str, config_hash: str) -> Trial | None:
        with self.session() as s:
            return s.scalars(
                select(Trial).where(Trial.study_id == study_id, Trial.config_hash == config_hash)
            ).first()

    def update_trial(self, trial_id: int, **fields: Any) -> None:
        self._update(Trial, trial_id, fields)

    def _update(self, table: type[Study] | type[Trial], key: str | int, fields: dict[str, Any]) -> None:
        with self.session() as s:
            row = s.get(table, key)
            if row is None:
                raise KeyError(key)
            for k, v in fields.items():
                setattr(row, k, v)

    def start_trial(self, study_id: str, config_hash: str) -> int | None:
        """Mark a trial running (one more start); None when it is finished already."""
        with self.session() as s:
            trial = s.scalars(
                select(Trial).where(Trial.study_id == study_id, Trial.config_hash == config_hash)
            ).first()
            if trial is None or trial.status in FINISHED:
                return None
            trial.status = "running"
            trial.runs = (trial.runs or 0) + 1
            return trial.id

    def finish_trial(self, trial_id: int, fields: dict[str, Any], judge: Callable[[Trial], bool]) -> Trial:
        """Record a trial's result and its success (judged from the stored loss and threshold), at once."""
        with self.session() as s:
            trial = s.get(Trial, trial_id)
            if trial is None:
                raise KeyError(trial_id)
            for k, v in fields.items():
                setattr(trial, k, v)
            trial.success = judge(trial)
            return trial

    def counts(self, study_id: str) -> dict[str, int]:
        out = dict.fromkeys(TRIAL_STATES, 0)
        out["succeeded"] = 0
        for t in self.trials(study_id):
            out[t.status] = out.get(t.status, 0) + 1
            out["succeeded"] += int(bool(t.success))
        out["total"] = sum(out[s] for s in TRIAL_STATES)
        return out

    # ----- idempotency keys ------------------------------------------------------------------------
    def claim_key(self, key: str, request_hash: str) -> tuple[bool, IdempotencyKey]:
        """(True, row) when this call claimed the key; (False, the existing row) when it was taken."""
        try:
            with self.session() as s:
                row = IdempotencyKey(key=key, request_hash=request_hash)
                s.add(row)
            return True, row
        except IntegrityError:
            with self.session() as s:
                existing = s.get(IdempotencyKey, key)
            if existing is None:  # released between the two statements: claim again
                return self.claim_key(key, request_hash)
            return False, existing

    def bind_key(self, key: str, study_id: str) -> None:
        with self.session() as s:
            row = s.get(IdempotencyKey, key)
            if row is not None:
                row.study_id = study_id

    def release_key(self, key: str) -> None:
        with self.session() as s:
            row = s.get(IdempotencyKey, key)
            if row is not None and row.study_id is None:
                s.delete(row)


def _chunks(items: Sequence[str], n: int) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")  # readers (the API) don't block the engine's writes
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def to_jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
