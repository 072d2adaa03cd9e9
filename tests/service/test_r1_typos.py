"""A misspelt name gets the nearest valid one (`did you mean 'x'?`, search_spaces.did_you_mean's rule)
wherever it is given: a spec's fields, a preset, a model, a cell or a task, in the CLI and over REST alike
(one validation); and a plugin that could not join is named beside the valid cells, not left out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import trainers
from search_spaces import UnknownPresetError, get_preset
from service.api import create_app
from service.core.spec import StudySpec
from tests.plugin_dists import memsweep, toy_cell, write_dist
from tests.service.test_api_units import grid, settings
from trainers.registry import UnknownNameError


def test_a_misspelt_spec_field_preset_model_cell_or_task_is_answered_with_the_nearest_name(
    tmp_path: Path,
) -> None:
    with TestClient(create_app(settings(tmp_path))) as c:
        seed = c.post("/studies?dry_run=true", json={**grid(), "seed": [1]})
        cell = c.post(
            "/studies?dry_run=true", json={"preset": "orhan2020-copy500", "models": ["chain", "lstn"]}
        )
    assert (
        seed.status_code == 422
        and "seed: unknown field; did you mean 'seeds'? valid fields here: " in seed.text
    )
    assert cell.status_code == 422 and "unknown cell 'lstn'; did you mean 'lstm'? valid cells: " in cell.text
    with pytest.raises(ValueError, match=r"unknown cell 'chian'; did you mean 'chain'\? valid cells: "):
        StudySpec.model_validate({"preset": "orhan2020-copy500", "models": ["chian"]}).search_space()
    with pytest.raises(ValueError, match=r"has no model 'ortho'; did you mean 'orth'\? models: chain, orth"):
        StudySpec.model_validate({**grid(), "models": ["ortho"]}).search_space()
    with pytest.raises(UnknownPresetError, match=r"did you mean 'orhan2020-copy500'\? presets: "):
        get_preset("orhan2020-copy50")
    with pytest.raises(UnknownNameError, match=r"unknown task 'coppy'; did you mean 'copy'\? valid tasks: "):
        trainers.resolve(trainers.TrainConfig(task="coppy"))


def test_a_cell_name_near_a_refused_plugins_says_it_was_refused(tmp_path: Path) -> None:
    """The plugin's entry point is `cornn` but its class says `coRNN`: refused, and left out of "valid
    cells", so `models: [conrn]` (a typo of the right name) pointed nowhere."""
    dist = write_dist(
        tmp_path / "cornn",
        "memsweep-cornn",
        "0.1.0",
        {"memsweep.cells": {"cornn": "memsweep_cornn:ToyCell"}},
        {"memsweep_cornn/__init__.py": toy_cell("coRNN")},
    )
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"preset": "orhan2020-copy500", "models": ["chain", "conrn"]}))
    done = memsweep("plan", str(spec), paths=(dist,), environ={"MEMSWEEP_HOME": str(tmp_path / "home")})
    assert done.returncode != 0
    assert "unknown cell 'conrn'; did you mean 'cornn'? valid cells: " in done.stderr, done.stderr
    assert "(refused: cornn — see `memsweep plugins`)" in done.stderr
