"""The ledger's rows: a study, its trials, the calibrations of unit shapes, the idempotency keys of
REST submissions — SQLAlchemy's ORM models, which the Alembic migrations (`migrations/`) follow.

A trial's result columns are the fields of `trainers.TrialResult`, under the same names; its W and V
are kept as float32 .npz bytes (`pack_matrices`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

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
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from service.core.spec import STORED, StudySpec
from service.core.states import FINISHED
from service.core.trial import TrialSpec
from trainers.criterion import Criterion
from trainers.result import RECORDED_FIELDS, Evaluation, TrialResult

if TYPE_CHECKING:
    pass


def now() -> datetime:
    return datetime.now(UTC)


def utc(value: datetime) -> datetime:
    """A time the database gave back, in UTC: SQLite drops the zone of what it stores."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


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
    # the process that runs it (`service.study.claim`): who, and when it last said it still does
    owner: Mapped[str | None] = mapped_column(String(200), default=None)
    owner_beat: Mapped[float | None] = mapped_column(Float, default=None)  # Unix time

    def validated_spec(self) -> StudySpec:
        """The study's spec (the `spec` column holds its JSON), validated once for this row."""
        cached: tuple[dict[str, Any], StudySpec] | None = self.__dict__.get("_validated_spec")
        if cached is None or cached[0] is not self.spec:  # an extension replaces the column's dict
            cached = (self.spec, StudySpec.model_validate(self.spec, context=STORED))
            self.__dict__["_validated_spec"] = cached
        return cached[1]


#: what a trial's row gives under its study's criterion (`Trial.judged`), named as REST and MLflow name it
JUDGED_FIELDS = ("success", "success_threshold")


class Trial(Base):
    """A study's trial: its identity (hash, model, varied values, config) and, once it finished, its
    result in the columns `status` … `history`, named as `trainers.TrialResult`'s fields."""

    __tablename__ = "trials"
    __table_args__ = (UniqueConstraint("study_id", "config_hash", name="uq_trial_study_hash"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study_id: Mapped[str] = mapped_column(ForeignKey("studies.id"), index=True)
    config_hash: Mapped[str] = mapped_column(String(32), index=True)
    model: Mapped[str] = mapped_column(String(100), index=True)
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
        if self.status not in FINISHED:
            values.pop("status", None)
        history = [Evaluation.from_dict(e) for e in self.history or []]
        return TrialResult(**values, history=history)

    def succeeded(self, criterion: Criterion) -> bool:
        """Whether the stored result succeeds under `criterion` (`Criterion.judge`, the one rule)."""
        return criterion.judge(self.status, self.final_val_loss, self.baseline_loss, self.reference_baselines)

    def judged(self, criterion: Criterion) -> dict[str, bool | float | None]:
        """Its JUDGED_FIELDS under `criterion`, as REST and its MLflow child run give them (never
        stored: studies that share a run may judge it differently): whether it succeeded (None until it
        finishes) and the loss it had to beat."""
        return {
            "success": self.succeeded(criterion) if self.status in FINISHED else None,
            "success_threshold": criterion.threshold_for(self.baseline_loss, self.reference_baselines),
        }

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
    owner: Mapped[str | None] = mapped_column(String(200), default=None)  # the creating process


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
