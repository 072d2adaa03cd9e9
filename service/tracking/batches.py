"""MLflow's LogBatch requests: params as flat strings, metrics stamped now, and everything sent in as
few requests as MLflow's limits allow."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

# MLflow's LogBatch limits: 1,000 metrics, 100 params, 100 tags and 1,000 entities per request
MAX_BATCH_ENTITIES, MAX_BATCH_PARAMS, MAX_BATCH_TAGS = 1000, 100, 100


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested dicts as MLflow params: dotted keys, values as strings of at most 500 characters."""
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, f"{key}."))
        else:
            out[key] = str(v)[:500]
    return out


def now_ms() -> int:
    """A metric's timestamp: now, in milliseconds since the epoch."""
    return int(time.time() * 1000)


class Batch(NamedTuple):
    params: list[Any]
    metrics: list[Any]
    tags: list[Any]


def batches(params: list[Any], metrics: list[Any], tags: list[Any]) -> list[Batch]:
    """Params, metrics and tags in as few LogBatch requests as MLflow's limits allow (at least one)."""
    out: list[Batch] = []
    params, metrics, tags = list(params), list(metrics), list(tags)
    while params or metrics or tags or not out:
        p, params = params[:MAX_BATCH_PARAMS], params[MAX_BATCH_PARAMS:]
        t, tags = tags[:MAX_BATCH_TAGS], tags[MAX_BATCH_TAGS:]
        room = MAX_BATCH_ENTITIES - len(p) - len(t)
        m, metrics = metrics[:room], metrics[room:]
        out.append(Batch(p, m, t))
    return out


def log_batches(
    client: MlflowClient,
    run_id: str,
    params: Sequence[Any] = (),
    metrics: Sequence[Any] = (),
    tags: Sequence[Any] = (),
) -> None:
    """Write params, metrics and tags to a run in `batches` (nothing at all: no request)."""
    for batch in batches(list(params), list(metrics), list(tags)):
        if not (batch.params or batch.metrics or batch.tags):
            return
        client.log_batch(run_id, metrics=batch.metrics, params=batch.params, tags=batch.tags)
