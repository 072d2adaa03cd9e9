"""memsweep's asha scheduler (`PrimedAsha`, on Tune's public scheduler API) decides as Ray's ASHAScheduler
with one bracket: on random report sequences of interleaved units, unprimed against Ray's own, primed
against Ray's with its private rungs filled the way memsweep once filled them."""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from service.core.spec import ASHA_MAX_EVALUATIONS, Asha


def rays_asha(asha: Asha, history: Sequence[Mapping[int, float]]) -> Any:
    """Ray's ASHAScheduler, its rungs primed by writing into them (what memsweep did before)."""
    from ray.tune.schedulers import ASHAScheduler

    class Primed(ASHAScheduler):
        def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
            taken = bool(super().set_search_properties(metric, mode, **spec))
            for i, values in enumerate(history):
                for milestone, recorded in self._brackets[0]._rungs:
                    at = math.ceil(milestone)
                    if at in values:
                        recorded[f"before-{i}"] = self._metric_op * values[at]
            return taken

    return Primed(
        time_attr="evaluations", grace_period=asha.grace_period, reduction_factor=asha.reduction_factor,
        max_t=ASHA_MAX_EVALUATIONS, stop_last_trials=False,
    )  # fmt: skip


def objective(rng: random.Random) -> float:
    """Ties often (a few levels), a NaN now and then (a diverged point's mean)."""
    roll = rng.random()
    if roll < 0.05:
        return math.nan
    return rng.choice([0.1, 0.5, 1.0, 2.0]) if roll < 0.5 else rng.uniform(0.0, 3.0)


def scenario(
    seed: int, primed: bool
) -> tuple[Asha, str, list[dict[int, float]], list[tuple[str, str, dict]]]:
    """(settings, mode, history, calls): units reporting interleaved, each `evaluations` rising by 0 to
    3 at a time (passing several rungs at once), some results without the objective, each unit's last
    result told as its completion."""
    rng = random.Random(seed)
    asha = Asha(grace_period=rng.choice([1, 2, 3, 5]), reduction_factor=rng.choice([1.5, 2.0, 2.5, 3.0, 4.0]))
    history = []
    if primed:
        for _ in range(rng.randint(1, 8)):
            history.append({e: objective(rng) for e in range(1, rng.randint(1, 25) + 1)})
    units = {f"unit-{k}": (0, rng.randint(1, 30)) for k in range(rng.randint(2, 8))}
    calls: list[tuple[str, str, dict]] = []
    while units:
        unit = rng.choice(sorted(units))
        at, end = units[unit]
        at = min(end, at + rng.choice([0, 1, 1, 1, 2, 3]))
        result: dict[str, Any] = {"evaluations": at, "objective": objective(rng)}
        if rng.random() < 0.03:
            del result["objective"]
        calls.append(("result", unit, result))
        units[unit] = (at, end)
        if at == end:
            calls.append(("complete", unit, result))
            del units[unit]
    return asha, rng.choice(["min", "min", "max"]), history, calls


@pytest.mark.parametrize("primed", [False, True])
def test_primed_asha_decides_as_rays_asha(primed: bool):
    from ray.tune.schedulers import ASHAScheduler

    from service.study.ray_tune import PrimedAsha

    decided = 0
    for seed in range(300):
        asha, mode, history, calls = scenario(seed, primed)
        ours = PrimedAsha(asha, history)
        ray = (
            rays_asha(asha, history)
            if primed
            else ASHAScheduler(
                time_attr="evaluations", grace_period=asha.grace_period,
                reduction_factor=asha.reduction_factor, max_t=ASHA_MAX_EVALUATIONS, stop_last_trials=False,
            )
        )  # fmt: skip
        trials = {}
        for scheduler in (ours, ray):
            assert scheduler.set_search_properties("objective", mode)
        stopped: set[str] = set()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a rung of NaNs only: its cutoff is NaN
            for call, unit, result in calls:
                if unit in stopped:
                    continue
                if unit not in trials:
                    trials[unit] = SimpleNamespace(trial_id=unit)
                    ours.on_trial_add(None, trials[unit])
                    ray.on_trial_add(None, trials[unit])
                if call == "complete":
                    ours.on_trial_complete(None, trials[unit], dict(result))
                    ray.on_trial_complete(None, trials[unit], dict(result))
                    continue
                expected = ray.on_trial_result(None, trials[unit], dict(result))
                assert ours.on_trial_result(None, trials[unit], dict(result)) == expected, (
                    seed,
                    unit,
                    result,
                )
                decided += 1
                if expected == ASHAScheduler.STOP:  # Tune stops it and tells its last result
                    ours.on_trial_complete(None, trials[unit], dict(result))
                    ray.on_trial_complete(None, trials[unit], dict(result))
                    stopped.add(unit)
    assert decided > 3000
