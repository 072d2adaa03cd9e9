"""Calibrations: unit shapes timed on a node type, the cache behind a study's plan (service.planning.calibration)."""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    op.create_table(
        "calibrations",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("shape_key", sa.String(32), nullable=False),
        sa.Column("node_type", sa.String(300), nullable=False),
        sa.Column("trainer_version", sa.String(16), nullable=False),
        sa.Column("bundle_size", sa.Integer, nullable=False),
        sa.Column("shape", sa.JSON, nullable=False),
        sa.Column("measurement", sa.JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("shape_key", "node_type", name="uq_calibration_shape_node"),
    )
