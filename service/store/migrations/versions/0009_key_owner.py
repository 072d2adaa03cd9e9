"""Which process is creating the study an Idempotency-Key names (`StudyService.create`): a key whose
creator is gone is taken over by a retry, not refused as "still being processed" for ever."""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"


def upgrade() -> None:
    with op.batch_alter_table("idempotency_keys") as batch:
        batch.add_column(sa.Column("owner", sa.String(200), nullable=True))
