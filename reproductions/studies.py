"""What the reproductions share: their studies run through memsweep's engine (embedded Ray, fused
bundles, the SQLite ledger, an MLflow server on loopback), and the report lines that say where the
numbers came from and which trials failed.

A reproduction builds one study spec per part (a task, a figure), hands them to `run_studies` and writes
its report from what comes back: per study its summary (as `memsweep run` prints it), its trials as
plain records, the numerics they computed with and their MLflow link.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: the trial fields a reproduction's report reads (the ledger's row, as plain values)
RECORD_FIELDS = (
    "model",
    "params",
    "config",
    "status",
    "reason",
    "final_val_loss",
    "final_metric",
    "metric_name",
    "baseline_loss",
    "steps",
    "history",
)


def run_studies(specs: Mapping[str, dict[str, Any]], home: str | None, concurrency: int) -> dict[str, Any]:
    """Create and run each spec as a study, in order, in one engine on `home` (a new temporary folder
    when None); returns {"home", "parts": {name: what the report needs}}."""
    from service.core.settings import Settings
    from service.core.spec import StudySpec
    from service.reports.compare import numerics_of
    from service.study.engine import Engine
    from service.tracking.links import ui_link
    from service.tracking.tracker import prepare_mlflow_process

    prepare_mlflow_process()  # as memsweep's own entry points: MLflow down costs seconds, not minutes
    where = Path(home or tempfile.mkdtemp(prefix="memsweep-reproduce-"))
    os.environ.setdefault("MEMSWEEP_HOME", str(where))
    engine = Engine(Settings(home=where, ray_num_cpus=concurrency))
    out: dict[str, Any] = {"home": str(where), "parts": {}}
    try:
        for name, raw in specs.items():
            spec = StudySpec.model_validate(raw)
            study = engine.create_study(spec)
            started = time.perf_counter()
            summary = engine.run_study(study.id)
            seconds = time.perf_counter() - started
            trials = engine.ledger.trials(study.id)
            records = [{f: getattr(t, f) for f in RECORD_FIELDS} for t in trials]
            out["parts"][name] = {
                "study_id": study.id,
                "seconds": seconds,
                "trials": len(trials),
                "spec": spec.model_dump(mode="json"),
                "summary": summary,
                "records": records,
                "numerics": dict(zip(("modes", "machines"), numerics_of(trials), strict=True)),
                "failed": [r for r in records if r["status"] == "failed"],
                "mlflow_url": ui_link(
                    engine.tracking_uri(), summary["mlflow"]["experiment_id"], summary["mlflow"]["run_id"]
                ),
            }
            print(f"{name}: {len(trials)} trials in {seconds / 60:.1f} min", flush=True)
    finally:
        engine.executor.stop()  # the embedded Ray, and its record in the home
    return out


def numerics_lines(parts: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Where the numbers came from (trainers/numerics.py), and a warning when the parts' differ."""
    seen = [p.get("numerics", {"modes": ["unrecorded"], "machines": []}) for p in parts.values()]
    modes = sorted({m for n in seen for m in n["modes"]})
    machines = sorted({m for n in seen for m in n["machines"]})
    line = f"Numerics: {', '.join(modes)}; computed on {', '.join(machines) or 'an unrecorded machine'}."
    if modes == ["portable"]:
        line += " Portable numbers are the same on any x86-64 CPU with AVX2."
    elif len(modes) > 1:
        line += " The parts computed with different numerics modes: per-seed numbers are not comparable across them."
    else:
        line += " Native numbers hold on this kind of machine only (see docs/reproducibility.md)."
    return [line]


def failed_lines(failed: list[dict[str, Any]], trials: int, why: str) -> list[str]:
    """The trials that failed, each with its point and reason; `why` says how the report counts them."""
    if not failed:
        return []
    lines = ["", f"Failed: {len(failed)} of {trials} ({why}):", ""]
    for f in failed:
        point = " ".join(f"{k}={v}" for k, v in f["params"].items())
        lines.append(f"- {f['model']} {point}: {f['reason']}")
    return lines


def budget_marks(steps: list[int], n: int = 3) -> list[int]:
    """A few budgets to tabulate: evenly spaced evaluation steps, the last included."""
    if len(steps) <= n:
        return list(steps)
    return [steps[math.ceil((i + 1) * len(steps) / n) - 1] for i in range(n)]
