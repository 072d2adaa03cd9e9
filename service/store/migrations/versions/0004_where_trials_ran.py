"""Where a trial ran (its Ray node and device), the trained matrices kept in the ledger (so MLflow can be
rebuilt from it), the traceback of a trial an exception ended (its reason is one line), and a study's
plan: its estimated cost beside what it really took."""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("node", sa.String(128), nullable=True))
        batch.add_column(sa.Column("device", sa.String(32), nullable=True))
        batch.add_column(sa.Column("matrices", sa.LargeBinary, nullable=True))
        batch.add_column(sa.Column("traceback", sa.Text, nullable=True))
    with op.batch_alter_table("studies") as batch:
        batch.add_column(sa.Column("plan", sa.JSON, nullable=True))
