"""A trial's thread count and validation batch join its hash where they leave their defaults (1 and
1000): both move its numbers' rounding (`trainers.config.ROUNDING_FIELDS`), and the ledger reuses
results by hash. And a trial on more than one thread now has denormals flushed on every thread
(`trainers.runtime.flush_denormals`; before, a pool thread kept the flags its process's history gave
it), which its hash says (`THREADED_VERSION`).

Every stored trial that ran with other values is re-keyed: its stored hash (its identity without
execution fields, as it was hashed then) hashed again with those values. One that holds a result of
threads > 1 computed before is keyed without `THREADED_VERSION`, as a result of an older trainer: it
stays in its study and is never reused for a trial of now (a study extended or made anew trains that
point again). One without a result takes the hash it has now and trains when its study resumes.

A trial that had taken another trial's result (`reused_from`) computed under other values than its own
(directly or through a chain of reuses) has no result of its own: it is pending again, its copied
result cleared, and its study says why in a note; a `done` study is pending again (a server resumes
it; or `memsweep run --study ID`), a cancelled or failed one stays so until resumed. A result kept
through a chain of reuses then points at the row that computed it. No result a trial computed itself
is lost.

The hash rule is copied here, as a migration must hold the code it ran (`trainers.config.with_rounding`
is the living one; tests/service/test_records.py holds the two together)."""

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
THREADED_VERSION = "1"
#: the statuses of a trial that holds a result
RESULTS = ("done", "failed", "pruned")

#: a trial's result and what came with it, as the trials table held them at 0007
RESULT_COLUMNS = (
    "reason", "traceback", "final_val_loss", "final_metric", "metric_name", "baseline_loss",
    "reference_baselines", "steps", "budget_steps", "early_stopped", "seconds", "param_count",
    "henrici_index", "profile", "history", "device", "node", "provenance", "matrices",
    "mlflow_run_id", "reused_from",
)  # fmt: skip

studies = sa.table(
    "studies", sa.column("id", sa.String), sa.column("state", sa.String), sa.column("error", sa.Text)
)

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


def computed_by(rows: Mapping[int, Any], trial_id: int) -> Any | None:
    """The row that computed this row's result: itself, or the end of its chain of reuses (a result
    reused from a row that had reused it); None when a row of the chain is gone."""
    row, seen = rows.get(trial_id), set()
    while row is not None and row.reused_from is not None and row.id not in seen:
        seen.add(row.id)
        row = rows.get(row.reused_from)
    return None if row is None or row.id in seen else row


def with_rounding(base: str, config: Mapping[str, Any], threaded: bool) -> str:
    """The hash of now (`threaded`), or of a result computed with threads > 1 before it."""
    moved = {k: v for k, v in rounding(config).items() if v != ROUNDING_FIELDS[k]}
    if not moved:
        return base
    if threaded and "threads" in moved:
        moved["threaded"] = THREADED_VERSION
    tail = "".join(f"/{k}={moved[k]}" for k in sorted(moved))
    return hashlib.sha256(f"{base}{tail}".encode()).hexdigest()[:16]


def upgrade() -> None:
    bind = op.get_bind()
    rows = bind.execute(
        sa.select(trials.c.id, trials.c.study_id, trials.c.config_hash, trials.c.config, trials.c.status,
                  trials.c.reused_from)
    ).all()  # fmt: skip
    by_id = {r.id: r for r in rows}
    rekeyed, kept, reset = 0, 0, dict[str, int]()
    for r in rows:
        config = dict(r.config or {})
        source = computed_by(by_id, r.id) if r.reused_from is not None else r
        taken_across = source is None or rounding(dict(source.config or {})) != rounding(config)
        computed_before = r.status in RESULTS and not taken_across
        new = with_rounding(r.config_hash, config, threaded=not computed_before)
        values: dict[str, Any] = {}
        if new != r.config_hash:
            values["config_hash"] = new
            rekeyed += 1
            kept += new != with_rounding(r.config_hash, config, threaded=True)
        if taken_across:
            values.update(status="pending", **{name: None for name in RESULT_COLUMNS})
            reset[r.study_id] = reset.get(r.study_id, 0) + 1
        elif source is not None and source.id != r.id and source.id != r.reused_from:
            values["reused_from"] = source.id  # the row that computed it (the one between may be cleared)
        if values:
            bind.execute(sa.update(trials).where(trials.c.id == r.id).values(**values))
    states = dict(bind.execute(sa.select(studies.c.id, studies.c.state)).all())
    errors = dict(bind.execute(sa.select(studies.c.id, studies.c.error)).all())
    for study, n in reset.items():  # a study with trials to train again says why; a done one is pending
        note = (
            f"ledger migration 0008: {n} trial(s) had taken results computed with other threads or "
            "validation batch than their own; they are pending and train when the study runs again"
        )
        error = errors.get(study)
        values = {"error": f"{error}; {note}" if error else note}  # an `MLflow:` note stays first
        if states.get(study) == "done":  # a cancelled or failed study stays so, until resumed
            values["state"] = "pending"
        bind.execute(sa.update(studies).where(studies.c.id == study).values(**values))
    if rekeyed:
        log.info(
            "ledger: %d trial(s) run with other threads or validation batch re-keyed (migration 0008); %d "
            "hold results computed on several threads before each thread flushed denormals: kept, never reused",
            rekeyed,
            kept,
        )
    for study in sorted(reset):
        log.warning(
            "ledger: study %s held results taken from trials run with other threads or validation batch "
            "than its own; those trials are pending again, and the study with them (a server resumes it; "
            "or memsweep run --study %s)",
            study,
            study,
        )
