"""An extension refused because it would train a study's trials again names what made them other trials:
a plugin's code (as `memsweep compare` reads it from their provenance), the trainer version, or the
extension's settings, only those that apply."""

from __future__ import annotations

from typing import Any

import pytest

from service.core.errors import StudyError
from service.core.spec import StudySpec
from tests.service.test_lifecycle import grid, make_engine  # noqa: F401  (a fixture)
from trainers import plugins

THEN, NOW = "memsweep-cornn==0.1.0+5739548f", "memsweep-cornn==0.1.0+ec85ca60"


def as_plugin(monkeypatch: pytest.MonkeyPatch, identity: str) -> None:
    """Every cell of the study as if a plugin with this identity gave it (its trials' hashes and provenance)."""
    monkeypatch.setattr(plugins, "identities", lambda cell, task: {"cell": identity})


def test_an_extension_after_a_plugins_code_changed_names_the_plugin_and_not_the_trainer_version(
    make_engine: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Study trained with one code of a plugin cell, another loaded since: the refusal blamed "another
    trainer version … or a preset's settings changed"."""
    engine, _, _ = make_engine()
    as_plugin(monkeypatch, THEN)
    study = engine.create_study(grid())
    engine.run_study(study.id)
    assert {t.provenance["plugin.cell"] for t in engine.ledger.trials(study.id)} == {THEN}
    as_plugin(monkeypatch, NOW)
    with pytest.raises(StudyError) as refused:
        engine.extend_study(study.id, grid(seeds=[1, 2, 3]))
    said = str(refused.value)
    assert said.startswith("extend would train 6 of the study's trials again beside their results: ")
    assert (
        f"the cell memsweep-cornn plugin's code changed since they were made (then {THEN}; now {NOW})" in said
    )
    assert "Put the code they ran back" in said and "or create a new study for the new code" in said
    assert "trainer version" not in said and "settings" not in said
    # the plugin's code and the settings both: each named, with its fix
    longer = grid(seeds=[1, 2, 3]).model_dump(mode="json", exclude_unset=True)
    longer["base"] = {**longer["base"], "steps": 20}
    with pytest.raises(StudyError) as both:
        engine.extend_study(study.id, StudySpec.model_validate(longer))
    said = str(both.value)
    assert "the extension changes their settings (steps: 10 → 20)" in said and "plugin's code changed" in said
    assert "make a setting a dimension of its space" in said and "trainer version" not in said
    # the code they ran put back: the same trials, the new seed's alone are added
    as_plugin(monkeypatch, THEN)
    assert engine.extend_study(study.id, grid(seeds=[1, 2, 3])) == 3


def test_an_extension_of_trials_that_never_ran_under_a_plugin_says_both_possible_causes(
    make_engine: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No provenance tells which code a pending trial was made under: the trainer version or the plugin's."""
    engine, _, _ = make_engine()
    as_plugin(monkeypatch, THEN)
    study = engine.create_study(grid())
    as_plugin(monkeypatch, NOW)
    with pytest.raises(StudyError) as refused:
        engine.extend_study(study.id, grid(seeds=[1, 2, 3]))
    said = str(refused.value)
    assert "they were made under another trainer version (TRAINER_VERSION" in said
    assert f"or other code of the plugins they use (now {NOW})" in said and "settings" not in said


def test_a_stored_config_that_no_longer_resolves_is_refused_as_made_under_other_code(
    make_engine: Any,  # noqa: F811
) -> None:
    """A trial's stored config with a setting this code no longer has (renamed since, in a trainer version
    or a plugin) raised `ConfigError: unknown field …` out of the refusal's own message, which the API
    answered as a mistake in the extension's values."""
    engine, _, _ = make_engine()
    study = engine.create_study(grid())
    (row, *_) = engine.ledger.trials(study.id)
    config = {**row.config, "cell_params": {**row.config["cell_params"], "renamed_gain": 1.0}}
    engine.ledger.update_trial(row.id, config=config, config_hash="0" * 64)  # made under other code
    with pytest.raises(StudyError) as refused:
        engine.extend_study(study.id, grid(seeds=[1, 2, 3]))
    said = str(refused.value)
    assert said.startswith("extend would train 1 of the study's trials again beside their results: ")
    assert "they were made under another trainer version" in said and "settings (" not in said


def test_a_sampled_study_drawn_under_a_plugins_old_code_draws_no_more_under_the_new(
    make_engine: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sampled study has no enumerated trials to compare: its extension (more max_trials) and its
    resume drew new points under the plugin's edited code beside those drawn under the old, and its
    sampler and tables mixed the two (only `memsweep compare` noticed)."""
    engine, _, _ = make_engine()
    as_plugin(monkeypatch, THEN)
    study = engine.create_study(grid(sampler="random", max_trials=2, seeds=[1]))
    engine.run_study(study.id)
    drawn = len(engine.ledger.trials(study.id))
    as_plugin(monkeypatch, NOW)
    with pytest.raises(StudyError) as refused:
        engine.extend_study(study.id, grid(sampler="random", max_trials=4, seeds=[1]))
    said = str(refused.value)
    assert said.startswith(f"extend would draw new points beside {drawn} drawn under other code: ")
    assert (
        f"the cell memsweep-cornn plugin's code changed since they were made (then {THEN}; now {NOW})" in said
    )
    with pytest.raises(StudyError, match=r"^a run would draw new points beside"):
        engine.run_study(study.id)
    assert len(engine.ledger.trials(study.id)) == drawn  # nothing drawn, nothing trained
    as_plugin(monkeypatch, THEN)  # the code they ran put back: it extends
    assert engine.extend_study(study.id, grid(sampler="random", max_trials=4, seeds=[1])) == 2
