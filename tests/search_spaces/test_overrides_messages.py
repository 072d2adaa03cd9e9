"""What `SearchSpace.with_overrides` says to a study that sets, in `base`, a setting a model varies (a new
user's walkthrough: `--set leak=…` beside a preset's models and an arm whose cell's `grid` sweeps `leak`)."""

from __future__ import annotations

import re

import pytest

from search_spaces import Model, SearchSpace, SpaceError, Values


def preset_and_arm() -> SearchSpace:
    """A preset's model beside an arm whose cell's grid sweeps `leak`, as `service.core.space_build.cell_arms`
    makes it."""
    return SearchSpace(
        name="toy",
        models=(
            Model("chain", {"init": "chain"}, {"lr": Values((1e-3, 3e-4)), "scale": Values((1.0,))}),
            Model(
                "leakytanh",
                {"cell": "leakytanh"},
                {"lr": Values((1e-3, 3e-4)), "leak": Values((0.1, 0.5, 1.0))},
            ),
        ),
        base={"task": "addition"},
    )


@pytest.mark.parametrize(
    ("value", "written"), [(True, "true"), (0.3, "0.3"), ("1e-3", "0.001"), (None, "null"), ("tanh", "tanh")]
)
def test_a_base_value_a_model_varies_is_refused_with_the_dims_to_write_and_the_flag(
    value: object, written: str
) -> None:
    """The advice named the spec's form only, in Python's spelling (`{leak: [True]}`); on the command
    line (`--set leak=true`) the fix is `--dim leak=true`, a value each reads back as given."""
    with pytest.raises(SpaceError) as caught:
        preset_and_arm().with_overrides(base={"leak": value})
    assert str(caught.value) == (
        "base.leak: model 'leakytanh' varies leak over {'values': [0.1, 0.5, 1.0]}, so a base value would be "
        f"ignored; to run one value write dims: {{leak: [{written}]}} (on the command line: --dim leak={written})"
    )


def test_a_setting_given_in_base_and_in_dims_is_refused_as_both_not_as_the_models_values() -> None:
    """`--set leak=0.3 --dim leak=0.1` was told the arm varies leak over its grid's values (0.1, 0.5, 1.0),
    which the `--dim` given replaces: the clash is base's with dims, as for a setting no model varies."""
    both = "base.leak and dims.leak: give leak one value in base, or several in dims, not both"
    with pytest.raises(SpaceError, match=f"^{re.escape(both)}$"):
        preset_and_arm().with_overrides(base={"leak": 0.3}, dims={"leak": Values((0.1,))})
    # a dimension every model shares (the preset's lr), and one none varies (a spanned setting): the same
    with pytest.raises(SpaceError, match=r"^base\.lr and dims\.lr: give lr one value in base"):
        preset_and_arm().with_overrides(base={"lr": 1e-3}, dims={"lr": Values((1e-3,))})
    with pytest.raises(SpaceError, match=r"^base\.hidden and dims\.hidden: give hidden one value in base"):
        preset_and_arm().with_overrides(
            base={"hidden": 8}, dims={"hidden": Values((8, 16))}, settings={"lr", "hidden"}
        )
    # each alone is taken
    assert preset_and_arm().with_overrides(dims={"leak": Values((0.1,))}).model("leakytanh").dims[
        "leak"
    ] == Values((0.1,))
