"""A study's MLflow context: the one value its trials' writes carry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainers.criterion import Criterion


@dataclass(frozen=True)
class StudyContext:
    """Where a study's child runs go (its experiment, under its parent run) and the criterion that
    judges its trials."""

    experiment_id: str
    parent_run_id: str
    criterion: Criterion
