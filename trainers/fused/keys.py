"""Which trials may train together: a bundle's members agree on every shape and schedule field
(`fusable_key`); `check_fusable` names the first field on which a config differs.

Members may differ in seed (so data, permutation and weights), learning rate and the optimiser's
constants, clip norm, initialiser and its scale, and the early-stop / divergence / success thresholds.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from trainers.config import Resolved
from trainers.fused.cells import FUSED_CELLS

#: trial fields every member must share: shapes, budget, schedule, optimiser kind, execution
SHARED_FIELDS = (
    "task",
    "cell",
    "hidden",
    "batch_size",
    "optimizer",
    "eval_every",
    "eval_batch_size",
    "device",
    "threads",
    "numerics",
    "cuda_graphs",
)


def fusable_key(resolved: Resolved) -> tuple[tuple[str, Any], ...] | None:
    """What a bundle's members must share, as (field, value) pairs; None when the config can't be fused.

    Configs with equal keys train together in `train_fused`. The budget enters as steps, or as
    epochs when no step budget is set.
    """
    cfg = resolved.config
    spec = FUSED_CELLS.get(cfg.cell)
    if spec is None or (spec.alone is not None and spec.alone(resolved.cell_config)):
        return None  # another cell, or a config whose recurrence the fused scan does not run
    if resolved.task_cls.embeds_inputs(resolved.task_config):
        return None  # token inputs (an embedding before the cell)
    key: list[tuple[str, Any]] = [(name, getattr(cfg, name)) for name in SHARED_FIELDS]
    key.append(("budget", ("steps", cfg.steps) if cfg.steps is not None else ("epochs", cfg.epochs)))
    key.append(("task_params", json.dumps(dict(cfg.task_params), sort_keys=True, default=str)))
    key.extend((f"cell_params.{name}", getattr(resolved.cell_config, name)) for name in spec.shared)
    if resolved.task_cls.batch_length_varies:  # each seed's batches have lengths of their own
        key.append(("seed", cfg.seed))
    return tuple(key)


def check_fusable(resolved: Sequence[Resolved]) -> None:
    """Raise ValueError naming the first field on which a config differs from the first one."""
    keys = [fusable_key(r) for r in resolved]
    for i, (r, key) in enumerate(zip(resolved, keys, strict=True)):
        if key is None:
            raise ValueError(
                f"config {i} (cell {r.config.cell!r}, task {r.config.task!r}) can't be fused: the fused "
                f"trainer supports cells {', '.join(FUSED_CELLS)} on tasks with real-valued inputs, without "
                "their layer_norm; train it with trainers.train"
            )
    first = keys[0]
    assert first is not None
    for i, key in enumerate(keys[1:], start=1):
        assert key is not None
        for (name, a), (_, b) in zip(first, key, strict=True):
            if a != b:
                raise ValueError(
                    f"configs 0 and {i} differ in {name!r} ({a!r} vs {b!r}); a fused bundle shares "
                    "every shape and schedule field: group configs by trainers.fused.fusable_key"
                )
