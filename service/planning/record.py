"""What a study keeps of its plans: the estimate before each run (`record_plan`, `plan_run`) and, after
it, what the run took beside it (`record_actual`), in `studies.plan`."""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from service.core.states import FINISHED
from service.core.trial import PointKey, Unit, point_key
from service.planning.plan import Ground, plan_study, spec_of
from service.planning.types import StudyPlan
from service.store.ledger import Ledger

log = logging.getLogger(__name__)


def record_plan(
    engine: Ground, study_id: str, *, calibrate: bool, cancel: threading.Event | None = None
) -> tuple[StudyPlan, list[Unit] | None] | None:
    """Keep the study's plan (what is left of it to run, its estimate) in `studies.plan["planned"]`;
    the plan and its units (`plan_study`), or None without one: never raises (a plan is information,
    not a condition of running)."""
    try:
        planned, units = plan_study(engine, study_id, calibrate=calibrate, cancel=cancel)
        study = engine.ledger.get_study(study_id)
        kept = dict(study.plan or {}) if study is not None else {}
        if kept.get("actual"):  # an earlier run's estimate and cost, kept beside the next run's
            estimate = (kept.get("planned") or {}).get("estimate")
            earlier = {"planned_at": kept.get("planned_at"), "estimate": estimate}
            earlier |= {k: kept.pop(k) for k in ("actual", "accuracy") if k in kept}
            kept["earlier"] = [*kept.get("earlier", []), earlier]
        rows = engine.ledger.trials(study_id)
        kept.update(
            planned=planned.model_dump(mode="json"),
            planned_at=datetime.now(UTC).isoformat(),
            # what this run will train: the unfinished rows now, and any a sampler adds (a higher id)
            unfinished_ids=[t.id for t in rows if t.status not in FINISHED],
            last_id=max((t.id for t in rows), default=0),
        )
        engine.ledger.update_study(study_id, plan=kept)
        return planned, units
    except Exception as exc:
        log.warning("study %s: no plan (%s: %s)", study_id, type(exc).__name__, exc)
        return None


def plan_run(engine: Ground, study_id: str, cancel: threading.Event | None = None) -> list[Unit] | None:
    """Before each run of a study (the first, a resume, an extension): its plan of what is left to run,
    calibrating the shapes the cache lacks, kept so that `record_actual` compares the run with it. The
    units it packed, for the run to train (packed once), or None (the run packs: `plan_study`)."""
    kept = record_plan(engine, study_id, calibrate=True, cancel=cancel)
    return kept[1] if kept is not None else None


def record_actual(
    ledger: Ledger,
    study_id: str,
    phases: Mapping[str, float],
    units_run: Sequence[Sequence[str]] = (),
    complete: bool = True,
) -> None:
    """After a run: what it took — its wall seconds, the training time of the units it ran (each unit's
    slowest member: `units_run`, the units the run packed, as their members' config hashes; a sampled
    study's points) — beside the estimate kept before it,
    in `studies.plan["actual"]` and, for a run that trained what the plan counted (`complete`: it ended
    `done`, not stopped part way, which read as an estimate many times too high), `["accuracy"]`
    (`record_plan` moves them to `["earlier"]` before the next run); never raises."""
    try:
        study = ledger.get_study(study_id)
        if study is None:
            return
        spec = study.validated_spec()
        kept = dict(study.plan or {})
        planned_ids = set(kept.get("unfinished_ids") or [])
        last_id = int(kept.get("last_id") or 0)
        ran = [
            t
            for t in ledger.trials(study_id)
            if t.status in FINISHED
            and t.runs > 0
            and t.reused_from is None
            and (t.id in planned_ids or t.id > last_id)
        ]
        seconds = {t.config_hash: t.seconds or 0.0 for t in ran}
        units: list[Sequence[str]]
        if spec.sampler == "grid":  # a unit's finished members (an interrupted one ran again later)
            units = [m for m in ([h for h in u if h in seconds] for u in units_run) if m]
        else:
            specs = [s for s in (spec_of(t) for t in ran) if s is not None]
            points: dict[PointKey, list[str]] = defaultdict(list)
            for s in specs:
                points[point_key(s.model, s.params)].append(s.config_hash)
            units = list(points.values())
        actual = {
            "runs": len(kept.get("earlier", [])) + 1,
            "wall_seconds": sum(phases.values()),
            "phases": dict(phases),
            "training_seconds": sum(max(seconds[h] for h in u) for u in units if u),
            "trials_run": len(ran),
            "units": len(units),
            "finished_at": datetime.now(UTC).isoformat(),
        }
        kept["actual"] = actual
        estimate = (kept.get("planned") or {}).get("estimate")
        if estimate and estimate.get("complete") and complete:
            kept["accuracy"] = {
                key: {
                    "estimate": estimate[key],
                    "range": estimate[f"{key}_range"],
                    "actual": actual[key],
                    "ratio": actual[key] / estimate[key] if estimate[key] else None,
                    "within_range": estimate[f"{key}_range"][0] <= actual[key] <= estimate[f"{key}_range"][1],
                }
                for key in ("training_seconds", "wall_seconds")
            }
        ledger.update_study(study_id, plan=kept)
    except Exception as exc:
        log.warning("study %s: its cost was not recorded (%s: %s)", study_id, type(exc).__name__, exc)
