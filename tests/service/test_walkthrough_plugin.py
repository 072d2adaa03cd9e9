"""What a new user's walkthrough found, writing a plugin cell (`leakytanh`, settings `leak` and `radius`)
by docs/plugins.md and sweeping it beside Orhan's preset models: the advice of a refused `--set`, a
boolean read as YAML 1.2 reads one, where an unknown cell's plugin goes, and the trials table's columns."""

from __future__ import annotations

import argparse
import csv
import io
from typing import Any

import pytest

from service.cli.console import add_spec_flags, build_spec
from service.core.errors import StudyError
from service.reports.tables import trials_csv
from service.study.search import grid_trials, study_space
from trainers.registry import UnknownNameError, where_plugins_are

#: Orhan & Pitkow's addition preset with an arm of a built-in cell beside its chain model
ARM = ["orhan2020-addition750", "--models", "chain,lstm", "--dim", "lr=1e-3", "--seeds", "1"]


def spec_of(*flags: str) -> Any:
    """The study `memsweep run|plan` makes of these arguments."""
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    add_spec_flags(parser)
    return build_spec(parser.parse_args(list(flags)))


def refusal(*flags: str) -> str:
    with pytest.raises((StudyError, ValueError)) as caught:
        study_space(spec_of(*flags), 10_000)
    return str(caught.value)


def test_a_set_of_a_setting_a_model_varies_names_the_dim_flag_that_runs_one_value() -> None:
    said = refusal(*ARM, "--set", "scale=true")
    assert said.startswith("base.scale: model 'chain' varies scale over {'values': ")
    assert said.endswith(
        "to run one value write dims: {scale: [true]} (on the command line: --dim scale=true)"
    )


def test_a_setting_given_by_set_and_by_dim_is_refused_as_both() -> None:
    """`--set leak=0.3 --dim leak=0.1` was told the arm's grid values, not the `--dim` given (here lstm's
    forget_bias, a setting its arm sweeps when `--dim` names it)."""
    said = refusal(*ARM, "--set", "forget_bias=0.3", "--dim", "forget_bias=0.1")
    assert (
        said
        == "base.forget_bias and dims.forget_bias: give forget_bias one value in base, or several in dims, not both"
    )
    said = refusal(*ARM, "--set", "scale=1.0", "--dim", "scale=1.0")  # a preset model's own dimension
    assert said.startswith("base.scale and dims.scale: ")


@pytest.mark.parametrize("word", ["yes", "no", "on", "off"])
def test_a_boolean_set_as_yes_or_on_is_refused_at_the_door(word: str) -> None:
    """`--set flag=yes` was taken as True while `--set flag=1` was refused."""
    said = refusal(*ARM, "--set", f"layer_norm={word}")
    assert f"cell 'rnn'.layer_norm = {word!r} is not a boolean: it takes true or false" in said
    trials = grid_trials(study_space(spec_of(*ARM, "--set", "layer_norm=true"), 10_000), {})
    assert {t.config["cell_params"]["layer_norm"] for t in trials if t.model == "chain"} == {True}


def test_a_spec_file_reads_a_boolean_as_yaml_1_2_and_the_command_line_do(tmp_path: Any) -> None:
    """PyYAML reads YAML 1.1, where `yes` and `on` are booleans: a spec file's `layer_norm: yes` was True
    while `--set layer_norm=yes` is refused. A file now reads `yes` as text (refused alike), `true` as
    True."""
    spec_file = tmp_path / "arm.yaml"
    spec_file.write_text("preset: orhan2020-addition750\nmodels: [chain, lstm]\nbase: {layer_norm: yes}\n")
    said = refusal(str(spec_file), "--dim", "lr=1e-3", "--seeds", "1")
    assert "cell 'rnn'.layer_norm = 'yes' is not a boolean: it takes true or false" in said
    spec_file.write_text("preset: orhan2020-addition750\nmodels: [chain, lstm]\nbase: {layer_norm: True}\n")
    trials = grid_trials(study_space(spec_of(str(spec_file), "--dim", "lr=1e-3", "--seeds", "1"), 10_000), {})
    assert {t.config["cell_params"]["layer_norm"] for t in trials if t.model == "chain"} == {True}


def test_an_unknown_cell_says_both_ways_to_install_a_plugin() -> None:
    """The hint named `pip install -e` alone, never the documented `--target` folder on PYTHONPATH."""
    hint = where_plugins_are("a plugin cell")
    assert "-m pip install -e PATH`" in hint
    assert "-m pip install --no-deps --upgrade --target DIR PATH` then `PYTHONPATH=DIR memsweep …`" in hint
    said = refusal("orhan2020-addition750", "--models", "chain,leakytanh")
    assert "unknown cell 'leakytanh'" in said and hint in said
    from trainers.cells import CELLS

    with pytest.raises(UnknownNameError, match="--upgrade --target DIR PATH"):
        CELLS.get("leakytanh")


def trial(
    model: str, params: dict[str, Any], cell: str, cell_params: dict[str, Any], **more: Any
) -> dict[str, Any]:
    """A trial as `GET /studies/{id}/trials` answers it (the fields the columns come from)."""
    return {
        "id": 1,
        "config_hash": "abc",
        "model": model,
        "params": params,
        "status": "done",
        "last_evaluation": {"step": 20, "val_loss": 0.2},
        **more,
        "config": {
            "task": "addition",
            "cell": cell,
            "lr": params["lr"],
            "cell_params": cell_params,
            "seed": 1,
        },
        "provenance": {"torch": "2"},
    }


def columns(items: list[dict[str, Any]]) -> list[str]:
    text = trials_csv({"items": items, "criterion": {"name": "c"}, "total": len(items), "offset": 0}, "s")
    return next(
        csv.reader(io.StringIO("".join(line for line in text.splitlines(True) if not line.startswith("#"))))
    )


def test_the_trials_table_keeps_each_objects_fields_together_whichever_row_brings_them() -> None:
    """`params.leak` of an arm's trial was column ~91, after every `config.*` column of the chain's trials
    before it, while `params.lr` was column 4; likewise `config.cell_params.leak` after `config.seed`."""
    chain = trial("chain", {"lr": 1e-3, "scale": 1.0, "seed": 1}, "rnn", {"init": "chain", "scale": 1.0})
    arm = trial("leakytanh", {"lr": 1e-3, "leak": 0.1, "seed": 1}, "leakytanh", {"leak": 0.1, "radius": 1.0})
    got = columns([chain, arm])
    assert got == [
        "id", "config_hash", "model",
        "params.lr", "params.scale", "params.seed", "params.leak",
        "status",
        "last_evaluation.step", "last_evaluation.val_loss",
        "config.task", "config.cell", "config.lr",
        "config.cell_params.init", "config.cell_params.scale", "config.cell_params.leak", "config.cell_params.radius",
        "config.seed",
        "provenance.torch",
    ]  # fmt: skip
    assert columns([arm, chain]).index("params.scale") == 6  # after the arm's params, before `status`
    # an object one row has as null (a trial that never evaluated) and another as fields: side by side
    failed = trial("leakytanh", {"lr": 1e-3, "leak": 0.1, "seed": 1}, "leakytanh", {"leak": 0.1})
    failed["last_evaluation"] = None
    got = columns([failed, chain])
    at = got.index("last_evaluation")
    assert got[at : at + 3] == ["last_evaluation", "last_evaluation.step", "last_evaluation.val_loss"]
