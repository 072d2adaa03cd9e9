"""A trial's result columns named as trainers.TrialResult's fields: henrici → henrici_index, and
metric_name, budget_steps, early_stopped, param_count recorded."""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.alter_column("henrici", new_column_name="henrici_index")
        batch.add_column(sa.Column("metric_name", sa.String(64), nullable=True))
        batch.add_column(sa.Column("budget_steps", sa.Integer, nullable=True))
        batch.add_column(sa.Column("early_stopped", sa.Boolean, nullable=True))
        batch.add_column(sa.Column("param_count", sa.Integer, nullable=True))
