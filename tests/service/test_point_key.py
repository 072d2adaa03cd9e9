"""A study's point (its model and values, every seed) is one key everywhere (`service.core.trial.point_key`):
a value in two spellings that make one trial (1 and 1.0: one config hash) is one point to asha's units,
the points asha stopped, best configs, the sampler's warm start and an extension's checks alike."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from service.core.spec import StudySpec
from service.core.trial import TrialSpec, point_key
from service.reports.summary import best_configs
from service.study.engine import dropped_values, retrained
from service.study.packing import by_point, stopped_points
from service.study.search import materialize, sampling, study_space
from tests.service.conftest import TINY


def trial(params: dict[str, Any]) -> TrialSpec:
    return TrialSpec.of("m", params, materialize({**TINY, **params}))


def row(params: dict[str, Any], status: str = "done", loss: float = 0.05) -> Any:
    """A ledger row as the reads use it."""
    return SimpleNamespace(
        model="m", params=params, status=status, final_val_loss=loss, baseline_loss=1 / 6, steps=20,
        history=[], reference_baselines={}, config_hash=f"h{sorted(params.items())}",
    )  # fmt: skip


def test_a_point_in_two_spellings_is_one_unit_to_asha_as_it_is_one_row_of_best_configs():
    """An extension that wrote scale 1.0 as 1 (JavaScript's JSON does) added seeds a study holds as
    1.0: best configs pooled them into one point, asha's packing judged them as two units."""
    seeds = [trial({"lr": 1e-3, "scale": 1.0, "seed": 1}), trial({"lr": 1e-3, "scale": 1, "seed": 2})]
    assert trial({"lr": 1e-3, "scale": 1, "seed": 1}).config_hash == seeds[0].config_hash  # one value
    (best,) = best_configs([row(t.params) for t in seeds])
    assert best.seeds == [1, 2]
    (unit,) = by_point(seeds, fused=False)
    assert [m.params["seed"] for m in unit.members] == [1, 2] and unit.lockstep


def test_a_seed_added_to_a_point_asha_stopped_is_pruned_with_it_whatever_its_spelling():
    stopped = stopped_points([row({"lr": 1e-3, "scale": 1.0, "seed": 1}, "pruned")])
    assert point_key("m", {"lr": 1e-3, "scale": 1, "seed": 2}) in stopped


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"lr": 1}, {"lr": 1.0}),  # a float field reads 1 as 1.0
        ({"hidden": 16}, {"hidden": 16.0}),  # an int field reads 16.0 as 16
        ({"lr": 1e-3}, {"lr": 0.001}),
    ],
)
def test_spellings_of_one_trial_are_one_point(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert materialize({**TINY, **a}).config_hash() == materialize({**TINY, **b}).config_hash()
    assert point_key("m", {**a, "seed": 1}) == point_key("m", {**b, "seed": 2})


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (True, 1),  # a bool is no number
        ("1", 1),  # text stays text (a new study refuses a number written as text)
        ("1", "1.0"),  # a text setting's two values
        (2**53, 2**53 + 1),  # one float, two ints (an int field's two trials)
        (0.3, 0.1 + 0.2),
    ],
)
def test_other_values_are_other_points(a: Any, b: Any) -> None:
    assert point_key("m", {"x": a}) != point_key("m", {"x": b})
    assert point_key("m", {"x": a}) != point_key("n", {"x": a})


def test_the_sampler_is_told_a_point_once_in_the_spelling_of_its_first_seed():
    spec = StudySpec.model_validate(
        {"space": {"dims": {"lr": {"loguniform": [1e-4, 1.0]}}}, "base": TINY, "seeds": [1, 2],
         "sampler": "random", "max_trials": 4}
    )  # fmt: skip
    rows = [row({"lr": 1.0, "seed": 1}, loss=0.05), row({"lr": 1, "seed": 2}, loss=0.15)]
    ((params, value, pruned_at),) = sampling(spec, study_space(spec, 10_000), rows, 1, dict).warm
    assert params == {"default.lr": 1.0} and value == pytest.approx(0.6) and pruned_at is None


def test_an_extension_compares_the_trials_it_holds_by_the_same_key():
    held = [row({"lr": 1.0, "seed": 1})]
    same = SimpleNamespace(model="m", params={"lr": 1, "seed": 1}, config_hash="other")
    assert dropped_values(held, [same]) == {}
    assert [t for _, t in retrained(held, [same])] == [same]
    # 2**53 + 1 is not 2**53 (as floats they were one)
    assert dropped_values([row({"n": 2**53, "seed": 1})], [row({"n": 2**53 + 1, "seed": 1})]) == {
        "n": [str(2**53)]
    }
