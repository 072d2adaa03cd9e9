"""A cell's settings declared as floats are numbers in its recurrence or its initial weights, not its
shape: a study that sweeps one (a plugin cell's `grid`) calibrates one shape, not one per value."""

from __future__ import annotations

import json
from pathlib import Path

from service.planning.calibration import shape_of
from tests.plugin_dists import run_python, toy_dist
from trainers import resolve


def shape(**cell: object) -> dict[str, object]:
    return shape_of(resolve({"task": "copy", "task_params": {"seq_len": 30}, "cell_params": cell}))


def test_a_float_cell_setting_is_no_part_of_a_shape_and_a_size_or_an_operation_is():
    assert shape(input_gain=0.9, fb_forward=0.5) == shape(input_gain=0.5)
    assert shape(bias=False) != shape() != shape(nonlinearity="tanh")
    assert shape_of(resolve({"task": "copy", "hidden": 64})) != shape_of(resolve({"task": "copy"}))


def test_a_study_sweeping_a_plugin_cells_grid_setting_calibrates_one_shape(tmp_path: Path):
    """The toy cell's `grid` sweeps its float `gain` over (0.5, 0.9): two shapes before, `· gain=0.5` and
    `· gain=0.9`, each calibrated, for the same compute."""
    dist = toy_dist(tmp_path / "toy", "1.0")
    spec = {
        "preset": "orhan2020-addition750", "models": ["chain", "toy"], "dims": {"lr": [1e-3], "scale": [1.0]},
        "base": {"seq_len": 20, "hidden": 16, "steps": 40, "eval_every": 20}, "seeds": [1, 2],
    }  # fmt: skip
    shapes = run_python(
        f"""
        import json
        from service.core.settings import Settings
        from service.core.spec import StudySpec
        from service.planning.plan import plan_spec
        from service.study.engine import Engine

        engine = Engine(Settings(home={str(tmp_path / "home")!r}, mlflow_tracking_uri="memory://r1"))
        plan = plan_spec(engine, StudySpec.model_validate_json({json.dumps(spec)!r}), calibrate=False)
        toy = plan.by_model["toy"]
        print(json.dumps([toy.trials, [(s.description, s.trials) for s in plan.shapes if "· toy" in s.description]]))
        """,
        dist,
    )
    assert isinstance(shapes, list)
    trials, toy = shapes
    assert trials == 4  # 2 gains × 2 seeds
    assert len(toy) == 1 and toy[0][1] == 4 and "gain" not in toy[0][0], toy
