"""What a new user's walkthrough of `memsweep plan` found: a space model beside a preset, a plan whose
calibration failed, and a learning-rate course that never acts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.cli.console import plan_line
from service.core.errors import StudyError
from service.core.settings import Settings
from service.core.spec import STORED, StudySpec
from service.planning.plan import plan_spec
from service.study.engine import Engine
from service.study.search import study_space
from tests.service.conftest import TINY

#: Orhan's addition grid, shortened; its cell (rnn) takes `nonlinearity: relu`, the preset's setting
ADDITION = {"preset": "orhan2020-addition750", "base": {"seq_len": 30, "steps": 50}, "seeds": [1]}


def beside(cell: str, **spec: Any) -> dict[str, Any]:
    """ADDITION with a model of the user's own, `leakydecay`, of `cell`, in its space."""
    mine = {"leakydecay": {"fixed": {"cell": cell}, "dims": {"lr": [1e-3]}}}
    return {**ADDITION, "space": {"models": mine}, **spec}


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    return Engine(Settings(home=tmp_path, mlflow_tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"))


@pytest.mark.parametrize("cell", ["gru", "lstm", "srnn"])  # cells with no `nonlinearity` field
@pytest.mark.parametrize("models", [["leakydecay"], ["leakydecay", "chain"], ["leakydecay", "lstm"]])
def test_a_space_model_beside_a_preset_takes_only_the_preset_settings_its_cell_has(
    cell: str, models: list[str]
) -> None:
    """Alone beside the preset (`models: [leakydecay]`), a gru model was refused "unknown config field
    'nonlinearity'": the preset's setting of its own cell reached a cell without it (with chain or an
    lstm arm beside it, it planned). Now it runs at its cell's own settings, whatever else runs."""
    space = study_space(StudySpec.model_validate(beside(cell, models=models)), 50_000)
    assert space.model("leakydecay").fixed == {"cell": cell}
    assert "nonlinearity" not in space.base
    if "chain" in models:  # the preset's own model keeps its cell's setting
        assert {**space.base, **space.model("chain").fixed}["nonlinearity"] == "relu"


@pytest.mark.parametrize("models", [["leakydecay"], ["leakydecay", "chain"], ["leakydecay", "lstm"]])
def test_a_space_model_whose_cell_takes_the_presets_setting_takes_it_alone_or_not(models: list[str]) -> None:
    """A model of the space whose cell has the preset's settings (fastrnn's `nonlinearity`) trains under
    them, as it did beside the preset's models: the same trial whether the preset's models run or not."""
    space = study_space(StudySpec.model_validate(beside("fastrnn", models=models)), 50_000)
    assert {**space.base, **space.model("leakydecay").fixed}["nonlinearity"] == "relu"


def test_a_space_model_models_leaves_out_is_refused_naming_it() -> None:
    """`models: [chain]` beside a space model `mine` ran chain alone and exited 0: `mine` was dropped
    without a word. It is refused, saying how to run it; a stored spec is read as it was."""
    spec = {**beside("gru", models=["chain"]), "dims": {"lr": [1e-3], "scale": [1.0]}}
    said = (
        r"models: \[chain\] leaves out the space's model 'leakydecay' \(space\.models\.leakydecay\), so the "
        r"study would not run it: beside a preset, `models` names every model to run; add it: models: "
        r"\[chain, leakydecay\] \(on the command line: --models chain,leakydecay\), or leave it out of space"
    )
    with pytest.raises(ValueError, match=said):
        StudySpec.model_validate(spec)
    stored = StudySpec.model_validate(spec, context=STORED)  # a study made before the rule
    assert [m.name for m in stored.search_space().models] == ["chain"]
    named = StudySpec.model_validate({**spec, "models": ["chain", "leakydecay"]})
    assert [m.name for m in study_space(named, 50_000).models] == ["chain", "leakydecay"]
    # the shorthand's one model, too; and no `models`: every model runs, nothing to refuse
    with pytest.raises(ValueError, match=r"the space's model 'default' \(space\.dims\)"):
        StudySpec.model_validate({**ADDITION, "models": ["chain"], "space": {"dims": {"lr": [1e-3]}}})
    assert len(study_space(StudySpec.model_validate(beside("gru")), 10**6).models) == 5


def test_sweeping_a_setting_no_model_varies_says_to_name_ones_own_model_in_models() -> None:
    """`--models chain --dim init=chain,identity` (a setting the preset's chain fixes) is told to sweep it
    in a model of one's own in `space`, and to name that model in `models`, which `models: [chain]` would
    otherwise leave out. A setting no model varies nor fixes (`lr_decay_steps`) is spanned by the model."""
    spec = {**ADDITION, "models": ["chain"], "dims": {"init": ["chain", "identity"]}}
    with pytest.raises(
        StudyError,
        match=r"sweep it in a model of your own beside these \(space: \{models: \{NAME: .*\}\}\}\}\); and name "
        r"that model in `models`: models: \[chain, NAME\] \(on the command line: --models chain,NAME\)$",
    ):
        study_space(StudySpec.model_validate(spec), 50_000)
    with pytest.raises(StudyError, match=r"dims: \{init: \[value1, value2\]\}\}\}\}\)$"):
        study_space(StudySpec.model_validate({**spec, "models": None}), 50_000)  # no `models`: nothing to add
    spanned = {**ADDITION, "models": ["chain"], "dims": {"lr_decay_steps": [100, 200]}}
    space = study_space(StudySpec.model_validate(spanned), 50_000)
    assert space.model("chain").dims["lr_decay_steps"].values == (100, 200)


def test_a_plan_whose_calibration_failed_says_so_in_its_notes_and_last_line(engine: Engine) -> None:
    """A calibration whose loss was not finite left `estimate: null`, the error in the shapes table
    alone, and the last line's reason the numerics note."""
    error = "RuntimeError: 1 of 1 calibration trial(s) failed: training loss is not finite"
    spec = StudySpec.model_validate({"space": {"dims": {"lr": [1e4]}}, "base": TINY, "seeds": [1]})
    planned = plan_spec(engine, spec, calibrator=lambda probes: {p.key: {"error": error} for p in probes})
    assert planned.estimate is None and planned.shapes[0].error == error
    said = (
        f"calibration failed for 1 of 1 shape(s) ({error}): no estimate for their 1 unit(s); their trials "
        "may fail the same way when the study runs: check their settings (the learning rate, clip_norm), or "
        "plan again to measure once more"
    )
    assert planned.notes[0] == said, planned.notes
    line = plan_line(planned.model_dump(mode="json"))
    assert line.endswith(f"no estimate yet ({said})"), line  # the failure, not the numerics note


def test_a_plan_says_where_a_learning_rate_drop_never_acts(engine: Engine) -> None:
    """`lr_drop_epochs` at an epoch the budget never completes, or a `lr_drop_factor` of 1, trained a
    constant rate without a word. TINY: 64 examples, batch 16, so 4 steps an epoch."""
    tiny = {**TINY, "steps": 3, "lr_drop_epochs": [2]}
    chain = {"fixed": {"init": "chain"}, "dims": {"lr": [1e-3, 1e-2]}}
    spec = {"space": {"models": {"chain": chain}}, "base": tiny, "seeds": [1, 2]}
    notes = plan_spec(engine, StudySpec.model_validate(spec), calibrate=False).notes
    past = [n for n in notes if n.startswith("lr_drop")]
    assert past == [  # one note for the model's 4 trials
        "lr_drop_epochs [2] lies past the budget of model 'chain' (3 steps = 0.75 epochs of 4 steps): its rate "
        "never drops"
    ]
    # a budget of 8 steps: the drop after 2 epochs comes after step 8, the last
    at_the_end = {**spec, "base": {**tiny, "steps": 8}}
    assert any(
        "lies past" in n
        for n in plan_spec(engine, StudySpec.model_validate(at_the_end), calibrate=False).notes
    )
    # within the budget, at a factor below 1: nothing to say
    within = {**spec, "base": {**tiny, "steps": 9}}
    assert not any(
        n.startswith("lr_drop")
        for n in plan_spec(engine, StudySpec.model_validate(within), calibrate=False).notes
    )
    # some drops past, in some trials: one note per model and cause, saying which trials
    swept = {**chain, "dims": {"lr": [1e-3], "steps": [3, 6]}}
    base = {k: v for k, v in tiny.items() if k != "steps"}
    several = {
        "space": {"models": {"chain": swept}},
        "base": {**base, "lr_drop_epochs": [1, 3]},
        "seeds": [1],
    }
    notes = plan_spec(engine, StudySpec.model_validate(several), calibrate=False).notes
    assert [n for n in notes if n.startswith("lr_drop")] == [
        "lr_drop_epochs [1, 3] lies past the budget of model 'chain' (3 steps = 0.75 epochs of 4 steps; 1 of "
        "its 2 trials): its rate never drops",
        "lr_drop_epochs [1, 3]: the drop after epoch 3 lies past the budget of model 'chain' (6 steps = 1.5 "
        "epochs of 4 steps; 1 of its 2 trials): its rate drops only after epoch 1",
    ]
    # a factor of 1: the drops never move the rate, wherever they fall
    still = {**spec, "base": {**tiny, "steps": 20, "lr_drop_factor": 1}}
    notes = plan_spec(engine, StudySpec.model_validate(still), calibrate=False).notes
    assert [n for n in notes if n.startswith("lr_drop")] == [
        "lr_drop_factor 1 with lr_drop_epochs [2] of model 'chain': its rate never moves (each drop multiplies "
        "it by 1); give a factor below 1 (0.1: ÷10), or leave lr_drop_epochs out"
    ]
