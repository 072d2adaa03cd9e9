"""The contract check reports every failing check in one run (`trainers.contract`), and names the ones that
could not run; `memsweep plugins check` and the door (`service.study.plugins.run_check`) say the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.plugin_dists import memsweep, run_python, toy_dist

pytestmark = pytest.mark.slow


def test_a_cell_with_two_faults_is_told_both_at_once_and_one_that_cannot_be_built_what_was_not_checked(
    tmp_path: Path,
) -> None:
    two = toy_dist(  # draws from torch's global generator, and mixes its examples across the batch
        tmp_path / "two",
        name="two",
        extra_init="torch.randn(1)",
        extra_forward="out = out - out.mean(1, keepdim=True)",
    )
    unbuildable = toy_dist(tmp_path / "unbuildable", name="unbuildable", extra_init="raise ValueError('no')")
    found = run_python(
        "import json; from service.study.plugins import run_check; "
        "print(json.dumps(run_check(['cell:two', 'cell:unbuildable'], 600)))",
        two,
        unbuildable,
    )
    assert isinstance(found, dict)
    two_problems = found["cell:two"]
    assert any(p.startswith("generator: building a 'two' cell") for p in two_problems), two_problems
    assert any(p.startswith("batch: on task") and "states must be its own" in p for p in two_problems), (
        two_problems
    )
    assert not any(p.startswith("not checked") for p in two_problems), two_problems
    assert found["cell:unbuildable"] == [
        "constructor: building it at its defaults failed: ValueError: no",
        "not checked: parameters, generator, shapes, loss, gradient, batch: they need a cell built at its "
        "defaults (constructor, above)",
    ]

    checked = memsweep("plugins", "check", "two", paths=(two,))
    assert checked.returncode == 1
    assert "  - generator: building a 'two' cell" in checked.stdout and "  - batch: on task" in checked.stdout
