"""The ledger as memsweep wrote it before migrations: studies, trials, idempotency keys."""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "studies",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("mlflow_experiment_id", sa.String(64), nullable=True),
        sa.Column("mlflow_run_id", sa.String(64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_studies_state", "studies", ["state"])
    op.create_table(
        "trials",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("study_id", sa.String(32), sa.ForeignKey("studies.id"), nullable=False),
        sa.Column("config_hash", sa.String(32), nullable=False),
        sa.Column("model", sa.String(100), nullable=False),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("final_val_loss", sa.Float, nullable=True),
        sa.Column("final_metric", sa.Float, nullable=True),
        sa.Column("baseline_loss", sa.Float, nullable=True),
        sa.Column("success_threshold", sa.Float, nullable=True),
        sa.Column("success", sa.Boolean, nullable=True),
        sa.Column("steps", sa.Integer, nullable=True),
        sa.Column("seconds", sa.Float, nullable=True),
        sa.Column("henrici", sa.Float, nullable=True),
        sa.Column("profile", sa.JSON, nullable=True),
        sa.Column("history", sa.JSON, nullable=True),
        sa.Column("mlflow_run_id", sa.String(64), nullable=True),
        sa.Column("reused_from", sa.Integer, nullable=True),
        sa.Column("runs", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("study_id", "config_hash", name="uq_trial_study_hash"),
    )
    op.create_index("ix_trials_study_id", "trials", ["study_id"])
    op.create_index("ix_trials_config_hash", "trials", ["config_hash"])
    op.create_index("ix_trials_status", "trials", ["status"])
    op.create_table(
        "idempotency_keys",
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("study_id", sa.String(32), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
