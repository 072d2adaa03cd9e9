"""The ledger: studies and trials in a real database — the source of truth (Ray is only an executor).

Trials are keyed by the hash of their full resolved config (trainer version included). Resume runs
what is not finished; extending adds only new hashes; a finished trial of another study with the
same hash is reused instead of re-run. A trial's result columns are the fields of
`trainers.TrialResult`, under the same names. SQLite by default; any SQLAlchemy URL (PostgreSQL)
works. The schema is kept by Alembic migrations (`service/store/migrations/`): opening a ledger brings it
to this version's schema, a ledger written by an older memsweep included.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    delete,
    event,
    func,
    inspect,
    select,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from service.core.trial import TrialSpec, objective
from service.core.values import value_matches
from trainers.criterion import HALF_BASELINE, Criterion
from trainers.result import RECORDED_FIELDS, Evaluation, TrialResult

if TYPE_CHECKING:
    from alembic.config import Config as AlembicConfig

log = logging.getLogger(__name__)

STUDY_STATES = ("pending", "running", "done", "failed", "cancelled")
#: error: the trial's worker, node or process died, and the retries did too (an infrastructure fault,
#: not a result: never counted as a run that did not succeed; a later run of the study tries again)
TRIAL_STATES = ("pending", "running", "done", "failed", "pruned", "cancelled", "error")
#: the trials with a result (trained to the end, failed in training, or pruned by a scheduler)
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
    plan: Mapped[dict[str, Any] | None] = mapped_column(
        JSON, default=None
    )  # estimated cost, and what it took
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now, onupdate=now)


class Trial(Base):
    """A study's trial: its identity (hash, model, varied values, config) and, once it finished, its
    result in the columns `status` … `history`, named as `trainers.TrialResult`'s fields."""

    __tablename__ = "trials"
    __table_args__ = (UniqueConstraint("study_id", "config_hash", name="uq_trial_study_hash"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study_id: Mapped[str] = mapped_column(ForeignKey("studies.id"), index=True)
    config_hash: Mapped[str] = mapped_column(String(32), index=True)
    model: Mapped[str] = mapped_column(String(100))
    params: Mapped[dict[str, Any]] = mapped_column(JSON)  # the point's varied settings, seed included
    config: Mapped[dict[str, Any]] = mapped_column(JSON)  # the full resolved trial config
    # the result (trainers.TrialResult), pending until the trial finishes
    status: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    reason: Mapped[str | None] = mapped_column(Text, default=None)
    traceback: Mapped[str | None] = mapped_column(Text, default=None)
    final_val_loss: Mapped[float | None] = mapped_column(Float, default=None)
    final_metric: Mapped[float | None] = mapped_column(Float, default=None)
    metric_name: Mapped[str | None] = mapped_column(String(64), default=None)
    baseline_loss: Mapped[float | None] = mapped_column(Float, default=None)
    reference_baselines: Mapped[dict[str, float] | None] = mapped_column(JSON, default=None)
    steps: Mapped[int | None] = mapped_column(Integer, default=None)
    budget_steps: Mapped[int | None] = mapped_column(Integer, default=None)
    early_stopped: Mapped[bool | None] = mapped_column(Boolean, default=None)
    seconds: Mapped[float | None] = mapped_column(Float, default=None)
    param_count: Mapped[int | None] = mapped_column(Integer, default=None)
    henrici_index: Mapped[float | None] = mapped_column(Float, default=None)
    profile: Mapped[list[float] | None] = mapped_column(JSON, default=None)  # weight profile over i − j
    history: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, default=None)
    device: Mapped[str | None] = mapped_column(String(32), default=None)
    node: Mapped[str | None] = mapped_column(String(128), default=None)
    # where its numbers came from: numerics mode, CPU, capability, MKL, torch (trainers.numerics)
    provenance: Mapped[dict[str, str] | None] = mapped_column(JSON, default=None)
    # the trained W and V (float32 .npz), from which MLflow's recurrent_matrix.json can be rebuilt
    matrices: Mapped[bytes | None] = mapped_column(LargeBinary, default=None, deferred=True)
    # bookkeeping
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64), default=None)
    reused_from: Mapped[int | None] = mapped_column(Integer, default=None)
    runs: Mapped[int] = mapped_column(Integer, default=0)  # times it was started (resume evidence)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now, onupdate=now)

    def result(self) -> TrialResult:
        """The stored result as the trainers' record (a pending trial's is empty)."""
        values = {name: getattr(self, name) for name in RECORDED_FIELDS if name != "history"}
        values = {k: v for k, v in values.items() if v is not None}
        if self.status not in ("done", "failed", "pruned"):
            values.pop("status", None)
        history = [Evaluation.from_dict(e) for e in self.history or []]
        return TrialResult(**values, history=history)

    def succeeded(self, criterion: Criterion) -> bool:
        """Whether the stored result succeeds under `criterion` (`Criterion.judge`, the one rule)."""
        return criterion.judge(self.status, self.final_val_loss, self.baseline_loss, self.reference_baselines)

    def spec(self) -> TrialSpec:
        """The trial as it was planned, its stored config resolved again."""
        return TrialSpec.stored(self.config_hash, self.model, self.params, self.config)


class IdempotencyKey(Base):
    """A client's Idempotency-Key: the request it came with and the study that request created."""

    __tablename__ = "idempotency_keys"

    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    study_id: Mapped[str | None] = mapped_column(String(32), default=None)  # None while being created
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)


class Calibration(Base):
    """A unit shape timed on a node type (`service.planning.calibration`): what a study's plan costs per step."""

    __tablename__ = "calibrations"
    __table_args__ = (UniqueConstraint("shape_key", "node_type", name="uq_calibration_shape_node"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    shape_key: Mapped[str] = mapped_column(
        String(32)
    )  # the shape, fused or not, bundle size, trainer version
    node_type: Mapped[str] = mapped_column(String(300))  # CPU model × count (+ GPU)
    trainer_version: Mapped[str] = mapped_column(String(16))
    bundle_size: Mapped[int] = mapped_column(Integer)
    shape: Mapped[dict[str, Any]] = mapped_column(JSON)  # the trial config without the grid's values
    measurement: Mapped[dict[str, Any]] = mapped_column(JSON)  # step, evaluation, set-up and finish times
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)


TRIAL_SORTS = ("id", "final_val_loss", "seconds", "updated_at", "model")


#: how long a ledger call waits for its database to come back (a restart, a failover) before it fails
OUTAGE_PATIENCE = 120.0

F = TypeVar("F", bound=Callable[..., Any])


def outlasting(method: F) -> F:
    """Retry a ledger call while its database is unreachable (PostgreSQL restarting, SQLite locked
    past its timeout), up to OUTAGE_PATIENCE seconds, so that a database restart loses no result: the
    engine's recording waits instead of failing. Each call is one transaction, written to be safe to
    repeat (inserts check what exists)."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + OUTAGE_PATIENCE
        delay = 0.2
        while True:
            try:
                return method(*args, **kwargs)
            except (OperationalError, InterfaceError) as exc:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning(
                    "ledger: the database is unreachable (%s); retrying in %.1f s",
                    str(exc).splitlines()[0],
                    delay,
                )
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    return cast(F, wrapper)


class Ledger:
    """Sessions over one database; every write goes through this class's methods."""

    def __init__(self, url: str) -> None:
        self.url = url
        kwargs: dict[str, Any] = {}
        if url.startswith("sqlite"):
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        # pre-ping: a pooled connection the database dropped (a restart) is replaced before it is used
        self.engine: Engine = create_engine(url, pool_pre_ping=True, **kwargs)
        if url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
        upgrade(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self._sessions() as s, s.begin():
            yield s

    # ----- studies ---------------------------------------------------------------------------------
    @outlasting
    def create_study(self, name: str, spec: dict[str, Any]) -> Study:
        study = Study(id=uuid.uuid4().hex[:12], name=name, spec=spec, state="pending")
        with self.session() as s:
            s.add(study)
        return study

    @outlasting
    def get_study(self, study_id: str) -> Study | None:
        with self.session() as s:
            return s.get(Study, study_id)

    @outlasting
    def list_studies(self) -> list[Study]:
        with self.session() as s:
            return list(s.scalars(select(Study).order_by(Study.created_at.desc())))

    @outlasting
    def update_study(self, study_id: str, **fields: Any) -> None:
        self._update(Study, study_id, fields)

    # ----- trials ----------------------------------------------------------------------------------
    @outlasting
    def add_trials(self, study_id: str, trials: Sequence[TrialSpec]) -> int:
        """Insert trials whose hash the study doesn't hold yet; reuse finished results of other
        studies. Returns how many were added."""
        added = 0
        with self.session() as s:
            have = set(s.scalars(select(Trial.config_hash).where(Trial.study_id == study_id)))
            hashes = [t.config_hash for t in trials if t.config_hash not in have]
            reusable: dict[str, Trial] = {}
            for chunk in _chunks(hashes, 500):
                for t in s.scalars(
                    select(Trial).where(Trial.config_hash.in_(chunk), Trial.status.in_(("done",)))
                ):
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
                    for f in (*RECORDED_FIELDS, "matrices"):
                        setattr(trial, f, getattr(prior, f))
                    trial.reused_from = prior.id
                s.add(trial)
                added += 1
        return added

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
    def point_fields(self, study_id: str) -> tuple[set[str], set[str]]:
        """The study's models and the names its points set (seed included): what filters may name."""
        models: set[str] = set()
        names: set[str] = set()
        with self.session() as s:
            for model, params in s.execute(
                select(Trial.model, Trial.params).where(Trial.study_id == study_id)
            ):
                models.add(model)
                names.update(params)
        return models, names

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
            trial.status = "running"
            trial.runs = (trial.runs or 0) + 1
            return trial.id

    @outlasting
    def finish_trial(self, trial_id: int, result: TrialResult) -> Trial:
        """Record a trial's result and its trained matrices (its success is the study's to judge)."""
        with self.session() as s:
            trial = s.get(Trial, trial_id)
            if trial is None:
                raise KeyError(trial_id)
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

    def cancel_trial(self, trial_id: int, reason: str, history: Sequence[Evaluation]) -> None:
        """A trial stopped with its study: cancelled, with the evaluations it made (it runs again on resume)."""
        self.interrupt_trial(trial_id, "cancelled", reason, history)

    def interrupt_trial(self, trial_id: int, status: str, reason: str, history: Sequence[Evaluation]) -> None:
        """A trial that ended without a result: cancelled, back to pending (to run again), or error."""
        self.update_trial(
            trial_id, status=status, reason=reason, history=[e.to_dict() for e in history] or None
        )

    @outlasting
    def finished_objectives(self, study_id: str, hashes: Iterable[str]) -> dict[str, float]:
        """The objective of each of these trials that has a result already: finished in this study,
        or done in another (reused when the study adds it)."""
        wanted = list(hashes)
        out: dict[str, float] = {}
        with self.session() as s:
            for chunk in _chunks(wanted, 500):
                for t in s.scalars(select(Trial).where(Trial.config_hash.in_(chunk))):
                    mine = t.study_id == study_id and t.status in FINISHED
                    if mine or t.status == "done":
                        out.setdefault(t.config_hash, objective(t.final_val_loss, t.baseline_loss, t.status))
        return out

    @outlasting
    def counts(self, study_id: str, criterion: Criterion = HALF_BASELINE) -> dict[str, int]:
        """Trials per status, and how many succeeded under `criterion`."""
        out = dict.fromkeys(TRIAL_STATES, 0)
        out["succeeded"] = 0
        for t in self.trials(study_id):
            out[t.status] = out.get(t.status, 0) + 1
            out["succeeded"] += int(t.succeeded(criterion))
        out["total"] = sum(out[s] for s in TRIAL_STATES)
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

    @outlasting
    def bind_key(self, key: str, study_id: str) -> None:
        with self.session() as s:
            row = s.get(IdempotencyKey, key)
            if row is not None:
                row.study_id = study_id

    @outlasting
    def release_key(self, key: str) -> None:
        with self.session() as s:
            row = s.get(IdempotencyKey, key)
            if row is not None and row.study_id is None:
                s.delete(row)


def pack_matrices(w: Any, v: Any | None) -> bytes:
    """W (and V) as float32 .npz bytes: 4 bytes a weight (N = 100: 40 kB a trial)."""
    import io

    import numpy as np

    buf = io.BytesIO()
    if v is None:
        np.savez(buf, W=np.asarray(w, dtype=np.float32))
    else:
        np.savez(buf, W=np.asarray(w, dtype=np.float32), V=np.asarray(v, dtype=np.float32))
    return buf.getvalue()


def unpack_matrices(data: bytes) -> dict[str, Any]:
    import io

    import numpy as np

    with np.load(io.BytesIO(data)) as z:
        return {"W": z["W"].tolist(), "V": z["V"].tolist() if "V" in z.files else None}


#: the Alembic revision of a ledger written before memsweep kept migrations
FIRST_REVISION = "0001"


def migrations(connection: Connection) -> AlembicConfig:
    """Alembic's configuration of the ledger's migrations (`service/store/migrations/`), on `connection`."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).with_name("migrations")))
    cfg.attributes["connection"] = connection
    return cfg


#: PostgreSQL advisory lock key under which one process at a time migrates a ledger
MIGRATION_LOCK = 0x6D656D73


def upgrade(engine: Engine) -> None:
    """Bring the database to this version's schema, one process at a time (an API and a CLI may
    open one ledger at once): SQLite takes its write lock first (BEGIN IMMEDIATE, which also makes its
    DDL transactional), PostgreSQL an advisory lock."""
    from alembic import command

    migrator = engine
    if engine.dialect.name == "sqlite":
        _wal(engine.url.database)
        migrator = create_engine(engine.url, connect_args={"timeout": 60, "isolation_level": None})
        event.listen(migrator, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))
    try:
        with migrator.begin() as connection:
            if engine.dialect.name == "postgresql":
                connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
            cfg = migrations(connection)
            tables = set(inspect(connection).get_table_names())
            if "studies" in tables and "alembic_version" not in tables:  # from before migrations
                command.stamp(cfg, FIRST_REVISION)
            command.upgrade(cfg, "head")
    finally:
        if migrator is not engine:
            migrator.dispose()


def _chunks(items: Sequence[str], n: int) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def _wal(path: str | None, wait: float = 60.0) -> None:
    """Put a SQLite ledger in WAL mode (readers — the API — don't block the engine's writes), once:
    the mode stays with the file. Switching needs the database to itself, and SQLite refuses at once
    (no busy wait) while another process switches it too, so this tries again until it holds."""
    import sqlite3

    if not path or path == ":memory:":
        return
    deadline = time.monotonic() + wait
    while True:
        try:
            with contextlib.closing(sqlite3.connect(path, timeout=wait)) as db:
                db.execute("PRAGMA journal_mode=WAL")  # a file system without WAL keeps its mode: fine
                return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(0.05)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA synchronous=NORMAL")  # WAL is the file's mode already (`_wal`, in `upgrade`)
    cur.close()
