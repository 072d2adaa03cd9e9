"""An index on a trial's model name: a plan looks up every trial of its models that the ledger finished
under other code (`service.planning.notes.other_code_notes`), which scanned the whole table before."""

from alembic import op

revision = "0010"
down_revision = "0009"


def upgrade() -> None:
    op.create_index("ix_trials_model", "trials", ["model"])
