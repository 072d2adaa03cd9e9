"""A boolean setting reads true or false, as YAML 1.2 and JSON write them: `--set layer_norm=yes` was
taken as True while `--set layer_norm=1` (a number once parsed) was refused, one setting read two ways."""

from __future__ import annotations

import pytest

from trainers import ConfigError, TrainConfig, apply_overrides, resolve
from trainers.params import coerce


@pytest.mark.parametrize(
    ("raw", "read"),
    [(True, True), (False, False), ("true", True), ("false", False), ("True", True), ("FALSE", False)],
)
def test_true_and_false_are_read_as_written_and_as_text(raw: object, read: bool) -> None:
    """Text from a command line (`python -m trainers --set`, `memsweep --set flag=True`) as YAML 1.2
    reads it: true, True, TRUE (and false alike)."""
    assert coerce(raw, bool, "cell 'rnn'.layer_norm") is read


@pytest.mark.parametrize("raw", ["yes", "no", "on", "off", "y", "n", "1", "0", 1, 0, 1.0, None, "nope"])
def test_anything_else_is_refused_naming_the_field_and_the_values_it_takes(raw: object) -> None:
    with pytest.raises(ConfigError) as caught:
        coerce(raw, bool, "cell 'rnn'.layer_norm")
    assert str(caught.value) == (
        f"cell 'rnn'.layer_norm = {raw!r} is not a boolean: it takes true or false (as YAML 1.2 and JSON "
        "write them; yes/no, on/off and 1/0 are text or numbers there); a study stored with such text "
        "(before memsweep refused it) is extended with the setting given again: --set layer_norm=true "
        "(base: {layer_norm: true})"
    )


def test_a_trials_and_a_cells_boolean_are_refused_where_the_config_resolves() -> None:
    """What `python -m trainers --set` and the service's door both go through."""
    with pytest.raises(
        ConfigError, match=r"^cell 'rnn'\.layer_norm = 'yes' is not a boolean: it takes true or"
    ):
        resolve(apply_overrides(TrainConfig(task="copy"), {"layer_norm": "yes"}))
    with pytest.raises(ConfigError, match=r"^trial config\.cuda_graphs = 'off' is not a boolean"):
        resolve({"cuda_graphs": "off"})


def test_a_boolean_enters_the_stored_config_and_its_hash_as_a_boolean() -> None:
    """A config is coerced before it is hashed and stored: text never reaches a ledger's configs, so
    reading only true/false moves no recorded trial's hash."""
    as_text = resolve(apply_overrides(TrainConfig(task="copy"), {"layer_norm": "true"}))
    as_bool = resolve({"task": "copy", "cell_params": {"layer_norm": True}})
    assert as_text.to_dict()["cell_params"]["layer_norm"] is True
    assert as_text.config_hash() == as_bool.config_hash()
    assert resolve(as_text.to_dict()).config_hash() == as_bool.config_hash()  # a stored config, read again
