"""Success is judged by the study, not stored per trial (TRAINER_VERSION 4): success and
success_threshold leave the trials; the reference baselines a task reports are kept beside its own."""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("success")
        batch.drop_column("success_threshold")
        batch.add_column(sa.Column("reference_baselines", sa.JSON, nullable=True))
