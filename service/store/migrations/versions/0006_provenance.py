"""Where a trial's numbers came from (trainers.TrialResult.provenance): its numerics mode, CPU and
ATen capability, MKL's version and setting, torch (and the GPU)."""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("provenance", sa.JSON, nullable=True))
