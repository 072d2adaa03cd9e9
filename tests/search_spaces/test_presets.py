"""Every registered preset: citation, expected size, no repeated trial, and every model's first grid
point resolves through the trainers (so a misspelt field fails here, not in a study).

A new preset is covered by being registered; it must also add its expected size to EXPECTED_SIZES."""

from __future__ import annotations

import json
from typing import Any

import pytest

import trainers
from search_spaces import describe, get_preset, list_presets
from trainers.cells import list_cells
from trainers.tasks import list_tasks

ORHAN = {"chain": 462, "fbchain": 462, "identity": 594, "orthogonal": 594}  # 11 lr × 7 or 9 scales × 6 seeds
NRU_SYNTHETIC = {m: 1 for m in ("nru", "lstm", "lstm-chrono", "gru", "janet", "rnn-orth", "rnn-id")}
SRNN = {m: 6 for m in ("srnn", "rnn", "lstm", "gru", "urnn", "nru")}  # 6 lengths × 1 seed
EMAMI = {m: 7 * 30 for m in ("rnn", "urnn", "lstm")}  # 7 hidden sizes × 30 teachers × 1 seed

#: preset → trials per model, written out by hand from the papers' grids
EXPECTED_SIZES: dict[str, dict[str, int]] = {
    "orhan2020-copy500": ORHAN,
    "orhan2020-addition750": ORHAN,
    "orhan2020-psmnist": ORHAN,
    # Table 3's four initialisers × 3 runs (the paper's) × memsweep's 2 learning rates
    "orhan2020-lstm-ptbchar": {f"lstm-{i}": 2 * 3 for i in ("plain", "orthogonal", "chain", "mixed")},
    "sgornn2022-addition": {m: 3 * 3 for m in ("sgornn", "vprnn", "fastrnn", "lstm")},  # 3 T × 3 lr
    "sgornn2022-har2": {m: 10 for m in ("sgornn", "vprnn", "fastrnn", "lstm")},  # seeds 1–10
    "nru2019-sensitivity": {"baseline": 1, "heads": 3, "memory": 2, "hidden": 3},
    "nru2019-copy100": NRU_SYNTHETIC,
    "nru2019-copy200": NRU_SYNTHETIC,
    "nru2019-varcopy100": NRU_SYNTHETIC,
    "nru2019-varcopy200": NRU_SYNTHETIC,
    "nru2019-denoise100": NRU_SYNTHETIC,
    "srnn2020-copy": SRNN,
    "srnn2020-addition": SRNN,
    "emami2019-gaussian20db": EMAMI,
    "emami2019-sparse15db": EMAMI,
}
EXPECTED_TOTALS = {
    "orhan2020-copy500": 2_112,
    "orhan2020-addition750": 2_112,
    "orhan2020-psmnist": 2_112,
    "orhan2020-lstm-ptbchar": 24,
    "sgornn2022-addition": 36,
    "sgornn2022-har2": 40,
    "nru2019-sensitivity": 9,
    "nru2019-copy100": 7,
    "nru2019-copy200": 7,
    "nru2019-varcopy100": 7,
    "nru2019-varcopy200": 7,
    "nru2019-denoise100": 7,
    "srnn2020-copy": 36,
    "srnn2020-addition": 36,
    "emami2019-gaussian20db": 630,
    "emami2019-sparse15db": 630,
}

PRESETS = list_presets()
MODEL_CASES = [(name, m.name) for name in PRESETS for m in get_preset(name).models]


def build(point: dict[str, Any]) -> trainers.Resolved:
    """Flat trial settings → a resolved config: task and cell first, then every other field by name."""
    rest = dict(point)
    cfg = trainers.TrainConfig(task=str(rest.pop("task")), cell=str(rest.pop("cell")))
    return trainers.resolve(trainers.apply_overrides(cfg, rest))


@pytest.mark.parametrize("name", PRESETS)
def test_has_citation_and_description(name: str) -> None:
    space = get_preset(name)
    assert space.name == name
    assert space.citation.strip()
    assert space.description.strip()
    json.dumps(describe(space))  # JSON-ready, as the service shows it


@pytest.mark.parametrize("name", PRESETS)
def test_size_is_the_papers(name: str) -> None:
    space = get_preset(name)
    assert name in EXPECTED_SIZES, f"add the expected size of {name!r} to EXPECTED_SIZES"
    assert space.size_per_model() == EXPECTED_SIZES[name]
    assert space.size() == EXPECTED_TOTALS[name] == sum(EXPECTED_SIZES[name].values())
    assert sum(1 for _ in space.trials()) == space.size()


@pytest.mark.parametrize("name", PRESETS)
def test_no_trial_twice(name: str) -> None:
    seen: set[str] = set()
    for model, trial in get_preset(name).trials():
        key = json.dumps(trial, sort_keys=True)  # a setting may be a list (`lr_drop_epochs`)
        assert key not in seen, f"{name}: model {model!r} repeats the trial {trial}"
        seen.add(key)


@pytest.mark.parametrize("name", PRESETS)
def test_every_point_names_a_task_and_a_cell(name: str) -> None:
    for model, point in get_preset(name).points():
        assert isinstance(point.get("task"), str), f"{name}/{model}: no task"
        assert isinstance(point.get("cell"), str), f"{name}/{model}: no cell"


@pytest.mark.parametrize(("name", "model"), MODEL_CASES, ids=[f"{n}/{m}" for n, m in MODEL_CASES])
def test_first_point_resolves(name: str, model: str) -> None:
    space = get_preset(name)
    point = next(p for m, p in space.points() if m == model)
    check_point(f"{name}/{model}", point, space.seeds[0])


def check_point(where: str, point: dict[str, Any], seed: int) -> None:
    """The point names a registered task and cell, resolves, and every setting lands where the
    trainers read it."""
    for kind, registered in (("task", list_tasks()), ("cell", list_cells())):
        assert point[kind] in registered, f"{where}: {kind} {point[kind]!r} is not registered ({registered})"
    resolved = build({**point, "seed": seed})
    full = resolved.to_dict()
    for key, value in point.items():  # every setting landed where the trainers read it
        where_read = (
            full
            if key in full
            else full["task_params"]
            if key in full["task_params"]
            else full["cell_params"]
        )
        assert where_read[key] == value, f"{where}: {key} = {where_read[key]!r}, preset says {value!r}"


def test_a_misspelt_cell_or_task_in_a_preset_fails_the_check() -> None:
    point = next(p for _, p in get_preset("orhan2020-copy500").points())
    for kind, typo in (("cell", "rnnn"), ("task", "coppy")):
        with pytest.raises(AssertionError, match=f"{kind} {typo!r} is not registered"):
            check_point("typo", {**point, kind: typo}, 1)


def test_each_copy_preset_reads_out_the_classes_its_authors_code_did() -> None:
    """SRNN's code reads every cell out over 10 classes (`Linear(hidden, 10)`: the marker's too, never a
    target); Orhan's Keras model and the NRU code (myTorch) over 9. It moves the loss of an untrained
    model by ln(10/9) a step, so a preset that left it at 9 was not its paper's protocol."""
    seen: dict[str, set[int]] = {}
    for name in PRESETS:
        for _, point in get_preset(name).points():
            if point["task"] == "copy":
                seen.setdefault(name, set()).add(build({**point, "seed": 1}).task_config.classes)
    expected = {
        "srnn2020-copy": {10},
        "orhan2020-copy500": {9},
        "nru2019-copy100": {9},
        "nru2019-copy200": {9},
    }
    assert seen == expected  # a new copy preset: add its authors' readout here


@pytest.mark.parametrize(
    ("name", "optimizer", "clip"),
    [
        ("nru2019-copy100", "keras_amsgrad", 0.5),  # their 100_lag/copy_v1/fm.yaml
        ("nru2019-copy200", "keras_amsgrad", 0.5),  # 200_lag/copy_v1/fm.yaml
        ("nru2019-varcopy100", "keras_adam", 1.0),  # 100_lag/copy_v2/fm.yaml
        ("nru2019-varcopy200", "keras_amsgrad", 1.0),  # 200_lag/copy_v2/fm.yaml
        ("nru2019-denoise100", "keras_adam", 1.0),  # 100_lag/denoise/fm.yaml
    ],
)
def test_the_nru_synthetic_presets_train_their_nru_as_their_configs(
    name: str, optimizer: str, clip: float
) -> None:
    """The NRU's optimiser and clip are its config's; every baseline keeps the paper's Adam and clip 1; each
    in torch 0.4's form, their code's (ε added to √v, as Keras adds it: `keras_adam`, `keras_amsgrad`)."""
    for model, point in get_preset(name).points():
        config = build(point).config
        want = (optimizer, clip) if model == "nru" else ("keras_adam", 1.0)
        assert (config.optimizer, config.clip_norm) == want, model


@pytest.mark.parametrize("name", PRESETS)
def test_every_presets_readout_is_its_codes(name: str) -> None:
    """Keras' Dense for the Keras and TensorFlow codes (Orhan, Emami, SGORNN); the NRU code's Xavier-normal
    `_W_h2o` for the NRU presets and SRNN's NRU; torch's nn.Linear for SRNN's other models."""
    for model, point in get_preset(name).points():
        got = build(point).config.readout_init
        if name.startswith("nru2019") or (name.startswith("srnn2020") and model == "nru"):
            assert got == "xavier_normal", (name, model)
        elif name.startswith("srnn2020"):
            assert got == "plain", (name, model)
        else:
            assert got == "glorot", (name, model)
