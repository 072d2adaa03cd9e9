"""A trial's thread count and validation batch join its hash where they leave their defaults (1 and
1000): both move its numbers' rounding (`trainers.config.ROUNDING_FIELDS`), and the ledger reuses
results by hash.

Every stored trial that ran with other values is re-keyed to the hash it has now: its stored hash (its
identity without execution fields, as it was hashed then) hashed again with those values. A trial
that had taken another trial's result (`reused_from`) computed under other values than its own has no
result of its own: it is pending again, its copied result cleared, and its study says so when resumed
(`memsweep run --study ID`, or POST /studies/{id}/resume). No result a trial computed itself is lost.

The hash rule is copied here, as a migration must hold the code it ran (`trainers.config.with_rounding`
is the living one; tests/service/test_migrations.py holds the two together)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"

log = logging.getLogger("memsweep.ledger")

ROUNDING_FIELDS = {"threads": 1, "eval_batch_size": 1000}

#: a trial's result and what came with it, as the trials table held them at 0007
RESULT_COLUMNS = (
    "reason", "traceback", "final_val_loss", "final_metric", "metric_name", "baseline_loss",
    "reference_baselines", "steps", "budget_steps", "early_stopped", "seconds", "param_count",
    "henrici_index", "profile", "history", "device", "node", "provenance", "matrices",
    "mlflow_run_id", "reused_from",
)  # fmt: skip

trials = sa.table(
    "trials",
    sa.column("id", sa.Integer),
    sa.column("study_id", sa.String),
    sa.column("config_hash", sa.String),
    sa.column("config", sa.JSON),
    sa.column("status", sa.String),
    sa.column("reused_from", sa.Integer),
    *(sa.column(name) for name in RESULT_COLUMNS if name != "reused_from"),
)


def rounding(config: Mapping[str, Any]) -> dict[str, Any]:
    """The trial's values of the rounding fields (defaults where its stored config lacks them)."""
    return {k: config.get(k, v) for k, v in ROUNDING_FIELDS.items()}


def with_rounding(base: str, config: Mapping[str, Any]) -> str:
    moved = {k: v for k, v in rounding(config).items() if v != ROUNDING_FIELDS[k]}
    if not moved:
        return base
    tail = "".join(f"/{k}={moved[k]}" for k in sorted(moved))
    return hashlib.sha256(f"{base}{tail}".encode()).hexdigest()[:16]


def upgrade() -> None:
    bind = op.get_bind()
    rows = bind.execute(sa.select(trials.c.id, trials.c.study_id, trials.c.config_hash, trials.c.config,
                                  trials.c.reused_from)).all()  # fmt: skip
    configs = {r.id: dict(r.config or {}) for r in rows}
    rekeyed, reset = 0, set()
    for r in rows:
        config = configs[r.id]
        new = with_rounding(r.config_hash, config)
        if new != r.config_hash:
            bind.execute(sa.update(trials).where(trials.c.id == r.id).values(config_hash=new))
            rekeyed += 1
        source = configs.get(r.reused_from) if r.reused_from is not None else None
        if source is not None and rounding(source) != rounding(config):
            cleared = {name: None for name in RESULT_COLUMNS}
            bind.execute(sa.update(trials).where(trials.c.id == r.id).values(status="pending", **cleared))
            reset.add(r.study_id)
    if rekeyed:
        log.info(
            "ledger: %d trial(s) run with other threads or validation batch re-keyed (migration 0008)",
            rekeyed,
        )
    for study in sorted(reset):
        log.warning(
            "ledger: study %s held results taken from trials run with other threads or validation batch "
            "than its own; those trials are pending again: resume the study to train them "
            "(memsweep run --study %s)",
            study,
            study,
        )
