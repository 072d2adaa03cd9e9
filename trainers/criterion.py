"""Success: whether a trial's final validation loss is below a criterion — the one rule, judged once.

Orhan & Pitkow count a run a success when its final validation loss is below half the random
baseline's loss (§3.1.1): `Criterion()`. A criterion is a fraction of a baseline — the task's random
baseline from its realised layout (`baseline="task"`), or one of the reference baselines a task
reports beside it (copy: `"arjovsky"`, 10·ln 8 / (T + 20)) — or an explicit loss threshold.
Training never looks at it: a study holds its criterion, judges its trials' stored losses with it,
and can be judged again with another one without training anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainers.params import ConfigError

if TYPE_CHECKING:
    from trainers.result import TrialResult


#: Orhan & Pitkow's success: a final validation loss below half the random baseline's (§3.1.1)
HALF = 0.5


@dataclass(frozen=True)
class Criterion:
    fraction: float | None = HALF  # success: final validation loss < fraction × the baseline
    threshold: float | None = None  # or: final validation loss < threshold (then fraction is None)
    baseline: str = "task"  # "task", or a reference baseline the task reports (e.g. copy's "arjovsky")

    def __post_init__(self) -> None:
        if (self.fraction is None) == (self.threshold is None):
            raise ConfigError(
                "a success criterion is a fraction of the baseline or an explicit threshold: give exactly "
                f"one (got fraction={self.fraction}, threshold={self.threshold}); e.g. fraction=0.5"
            )
        if self.fraction is not None and not (0 < self.fraction <= 1 and math.isfinite(self.fraction)):
            raise ConfigError(
                f"success fraction = {self.fraction} must be in (0, 1]: a run succeeds when its final "
                "validation loss is below that fraction of the baseline (Orhan & Pitkow: 0.5)"
            )
        if self.threshold is not None and not (self.threshold > 0 and math.isfinite(self.threshold)):
            raise ConfigError(f"success threshold = {self.threshold} must be a positive finite loss")

    @classmethod
    def of(
        cls, fraction: float | None = None, threshold: float | None = None, baseline: str = "task"
    ) -> Criterion:
        """The criterion of a spec's, a request's or a command line's optional fields: a loss threshold, or
        a fraction of the baseline (Orhan & Pitkow's half where none is given: the one place that default
        is applied); both given are refused, as the constructor refuses them."""
        if threshold is not None:
            return cls(fraction=fraction, threshold=threshold, baseline=baseline)
        return cls(fraction=HALF if fraction is None else fraction, baseline=baseline)

    @property
    def name(self) -> str:
        """How tables label it: `0.5 × baseline`, `0.5 × arjovsky baseline`, `loss < 0.02`."""
        if self.threshold is not None:
            return f"loss < {self.threshold:g}"
        which = "baseline" if self.baseline == "task" else f"{self.baseline} baseline"
        return f"{self.fraction:g} × {which}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "fraction": self.fraction,
            "threshold": self.threshold,
            "baseline": self.baseline,
        }

    def threshold_for(
        self, baseline_loss: float | None, reference_baselines: Mapping[str, float] | None
    ) -> float | None:
        """The loss a trial must beat; None when its baseline is unknown (it cannot succeed then)."""
        if self.threshold is not None:
            return self.threshold
        base = baseline_loss if self.baseline == "task" else (reference_baselines or {}).get(self.baseline)
        return None if base is None or not math.isfinite(base) else self.fraction * base  # type: ignore[operator]

    def judge(
        self,
        status: str,
        final_val_loss: float | None,
        baseline_loss: float | None,
        reference_baselines: Mapping[str, float] | None = None,
    ) -> bool:
        """Success: a finished trial (`done`) whose final validation loss is below the threshold."""
        threshold = self.threshold_for(baseline_loss, reference_baselines)
        return (
            status == "done"
            and final_val_loss is not None
            and threshold is not None
            and final_val_loss < threshold
        )

    def judge_result(self, result: TrialResult) -> bool:
        """`judge` on a trainers result."""
        return self.judge(
            result.status, result.final_val_loss, result.baseline_loss, result.reference_baselines
        )


#: Orhan & Pitkow's criterion: final validation loss below half the random baseline's loss
HALF_BASELINE = Criterion()
