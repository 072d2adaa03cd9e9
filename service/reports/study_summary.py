"""A study's summary: what it found under its own criterion (or another), in one record — counts,
success tables (also against budget, and under the other criteria it reports), best configurations
and Orhan's Table 2 (the Henrici index of successful trials). The run's end, `memsweep run`, the REST
server's status and MLflow's parent run all show this one record."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from service.core.spec import StudySpec
from service.reports.summary import (
    BestConfig,
    best_configs,
    henrici_table,
    success_table,
    success_vs_budget,
)
from service.store.ledger import Ledger
from service.store.models import Study, Trial
from trainers import TRAINER_VERSION, Criterion


def criteria(spec: StudySpec, trials: Sequence[Trial]) -> tuple[Criterion, list[Criterion]]:
    """The study's success criterion, and the others it reports beside it: its spec's extra
    criteria, and the same fraction of every reference baseline its trials' tasks report (copy:
    Arjovsky's)."""
    reported = {name for t in trials for name in (t.reference_baselines or {})}
    return spec.criterion(), spec.other_criteria(reported)


def summarise(
    ledger: Ledger, study: Study, criterion: Criterion | None = None, trials: Sequence[Trial] | None = None
) -> dict[str, Any]:
    """What the study found, under its own criterion (or `criterion`), as plain data (the record goes
    to MLflow as JSON, to the plots and to the terminal): each table as the REST API serves it.
    `trials`: its rows, when the caller has read them already."""
    trials = ledger.trials(study.id) if trials is None else trials
    main, extra = criteria(study.validated_spec(), trials)
    criterion = criterion or main
    table = success_table(trials, criterion)
    return {
        "study_id": study.id,
        "name": study.name,
        "state": study.state,
        "trainer_version": TRAINER_VERSION,
        # the spec as it stands (an extension's too): the parent run's params are the spec it was created with
        "spec": study.spec,
        "counts": ledger.counts(study.id, criterion),
        "success": table.model_dump(mode="json"),
        "success_other_criteria": [success_table(trials, c).model_dump(mode="json") for c in extra],
        "success_vs_budget": success_vs_budget(trials, criterion).model_dump(mode="json"),
        "best": _json(best_configs(trials, k=5, criterion=criterion)),
        "best_per_model": {
            m: _json(best_configs(trials, k=1, model=m, criterion=criterion)) for m in table.by_model
        },
        "henrici_index": henrici_table(trials, criterion),  # Orhan Table 2: d(W) of successful trials
        "mlflow": {"experiment_id": study.mlflow_experiment_id, "run_id": study.mlflow_run_id},
    }


def _json(best: Sequence[BestConfig]) -> list[dict[str, Any]]:
    return [b.model_dump(mode="json") for b in best]
