"""Which process runs a study, and when it last said so (`service.study.claim`): one process at a time."""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    with op.batch_alter_table("studies") as batch:
        batch.add_column(sa.Column("owner", sa.String(200), nullable=True))
        batch.add_column(sa.Column("owner_beat", sa.Float, nullable=True))
