"""The space types: validation, grid enumeration, overrides, and reading dimensions from JSON/YAML."""

from __future__ import annotations

import pytest

from search_spaces import (
    IntRange,
    Model,
    SearchSpace,
    SpaceError,
    Uniform,
    UnknownPresetError,
    Values,
    describe,
    dim_from_dict,
    dim_to_dict,
    get_preset,
)
from search_spaces.space import check_distinct, check_single_values, did_you_mean


def small_space() -> SearchSpace:
    return SearchSpace(
        name="toy",
        models=(
            Model("a", {"init": "chain"}, {"lr": Values((1e-3, 1e-4)), "scale": Values((1.0, 1.1, 1.2))}),
            Model("b", {"init": "identity"}, {"lr": Values((1e-3,))}),
        ),
        seeds=(1, 2),
        base={"task": "copy", "cell": "rnn"},
        citation="toy",
        description="toy",
    )


# ----- dimensions -----------------------------------------------------------------------------------
def test_values_needs_a_value() -> None:
    with pytest.raises(SpaceError, match="at least one value"):
        Values(())


@pytest.mark.parametrize(("low", "high"), [(1.0, 1.0), (2.0, 1.0)])
def test_uniform_needs_low_below_high(low: float, high: float) -> None:
    with pytest.raises(SpaceError, match="low < high"):
        Uniform(low, high)


def test_log_uniform_needs_positive_low() -> None:
    with pytest.raises(SpaceError, match="low > 0"):
        Uniform(0.0, 1.0, log=True)
    assert Uniform(1e-5, 1e-2, log=True).log


def test_int_range_bounds() -> None:
    assert IntRange(3, 3).low == 3  # a single integer is a valid range
    with pytest.raises(SpaceError, match="low <= high"):
        IntRange(4, 3)
    with pytest.raises(SpaceError, match="low > 0"):
        IntRange(0, 8, log=True)


# ----- models and spaces ----------------------------------------------------------------------------
def test_space_validation() -> None:
    with pytest.raises(SpaceError, match="at least one model"):
        SearchSpace(name="empty", models=())
    with pytest.raises(SpaceError, match="duplicate model names"):
        SearchSpace(name="twice", models=(Model("a"), Model("a")))
    with pytest.raises(SpaceError, match="at least one seed"):
        SearchSpace(name="seedless", models=(Model("a"),), seeds=())


def test_grid_order_and_count() -> None:
    model = small_space().model("a")
    points = list(model.grid())
    assert model.grid_points() == len(points) == 6
    # the first dimension is the outer loop, fixed fields ride along
    assert [(p["lr"], p["scale"]) for p in points] == [
        (1e-3, 1.0),
        (1e-3, 1.1),
        (1e-3, 1.2),
        (1e-4, 1.0),
        (1e-4, 1.1),
        (1e-4, 1.2),
    ]
    assert all(p["init"] == "chain" for p in points)


def test_model_without_dims_is_one_point() -> None:
    model = Model("baseline", {"hidden": 200})
    assert model.grid_points() == 1
    assert list(model.grid()) == [{"hidden": 200}]


def test_space_size_points_and_trials() -> None:
    space = small_space()
    assert space.size_per_model() == {"a": 12, "b": 2}
    assert space.size() == 14
    points = list(space.points())
    assert len(points) == 7
    assert points[0] == ("a", {"task": "copy", "cell": "rnn", "init": "chain", "lr": 1e-3, "scale": 1.0})
    trials = list(space.trials())
    assert len(trials) == 14
    assert [t["seed"] for _, t in trials[:4]] == [1, 2, 1, 2]  # seeds are the innermost loop
    assert trials[-1] == ("b", {"task": "copy", "cell": "rnn", "init": "identity", "lr": 1e-3, "seed": 2})


def test_model_fields_override_base() -> None:
    space = SearchSpace(name="x", models=(Model("lstm", {"hidden": 64}),), base={"hidden": 128})
    assert next(space.points())[1]["hidden"] == 64


def test_continuous_space_has_no_grid() -> None:
    model = Model("c", dims={"lr": Uniform(1e-5, 1e-2, log=True), "scale": Values((1.0,))})
    space = SearchSpace(name="c", models=(model,))
    assert not model.is_grid and not space.is_grid
    with pytest.raises(SpaceError, match="continuous"):
        model.grid_points()
    with pytest.raises(SpaceError, match="continuous"):
        list(model.grid())
    assert "size" not in describe(space)


def test_unknown_model_lists_the_models() -> None:
    with pytest.raises(SpaceError, match="models: a, b"):
        small_space().model("c")


# ----- overrides ------------------------------------------------------------------------------------
def test_with_overrides_base_and_seeds() -> None:
    space = small_space().with_overrides(base={"epochs": 2}, seeds=[7])
    assert space.base == {"task": "copy", "cell": "rnn", "epochs": 2}
    assert space.seeds == (7,)
    assert space.size() == 7
    assert (space.name, space.citation, space.description) == ("toy", "toy", "toy")


def test_with_overrides_dims_replaces_only_where_present() -> None:
    space = small_space().with_overrides(dims={"scale": Values((1.05,))})
    assert space.size_per_model() == {"a": 4, "b": 2}  # model b has no scale: unchanged
    assert space.model("a").fixed == {"init": "chain"}
    assert space.model("a").dims["lr"] == Values((1e-3, 1e-4))


def test_with_overrides_models() -> None:
    space = small_space().with_overrides(models=["b"])
    assert [m.name for m in space.models] == ["b"]
    with pytest.raises(SpaceError, match="no model 'z'"):
        small_space().with_overrides(models=["z"])


def test_with_overrides_unknown_dim() -> None:
    with pytest.raises(
        SpaceError,
        match=r"cannot override \['hidden'\].*if hidden is a setting of these trials, give it one value for every trial in base",
    ):
        small_space().with_overrides(dims={"hidden": Values((8,))})
    # the space named once, with no doubled quote ("space 'toy''s models")
    with pytest.raises(SpaceError) as err:
        small_space().with_overrides(dims={"hidden": Values((8,))})
    assert str(err.value).startswith(
        "cannot override ['hidden']: not a dimension of the models a, b of space 'toy' (dimensions: ['lr', 'scale']); "
    )
    # the trials' settings known (the service's): a name that is none of them is said to be none, with the
    # nearest; a setting no model varies is said to be one, with how to give or sweep it
    settings = {"lr", "scale", "hidden", "alpha"}
    with pytest.raises(SpaceError, match=r"; foo is no setting of these trials, nor of their task or cells$"):
        small_space().with_overrides(dims={"foo": Values((1,))}, settings=settings)
    with pytest.raises(SpaceError, match=r"alpah is no setting .*: did you mean 'alpha'\?$"):
        small_space().with_overrides(dims={"alpah": Values((1,))}, settings=settings)
    # a setting no model varies, the trials' settings known: every chosen model spans it (a researcher's
    # lr sweep over a preset's models); one that a model fixes, or that base gives too, is refused
    spanned = small_space().with_overrides(dims={"hidden": Values((8, 16))}, settings=settings)
    assert {m.name: m.dims["hidden"] for m in spanned.models} == {"a": Values((8, 16)), "b": Values((8, 16))}
    assert spanned.size_per_model() == {"a": 24, "b": 4}
    with pytest.raises(
        SpaceError, match=r"^dims.init: model 'a' fixes init = 'chain', so it cannot span init; "
    ):
        small_space().with_overrides(
            dims={"init": Values(("chain", "identity"))}, settings=settings | {"init"}
        )
    with pytest.raises(SpaceError, match=r"^base.hidden and dims.hidden: give hidden one value in base, or "):
        small_space().with_overrides(base={"hidden": 8}, dims={"hidden": Values((8, 16))}, settings=settings)
    # b alone has no scale: said so, not "set it in base" (b's cell has no scale to set)
    with pytest.raises(SpaceError, match="scale is a dimension of a, not of the models chosen"):
        small_space().with_overrides(models=["b"], dims={"scale": Values((1.0,))})
    with pytest.raises(SpaceError, match="did you mean 'scale'"):
        small_space().with_overrides(dims={"scal": Values((1.0,))})


def test_a_name_in_another_case_is_matched_case_aside() -> None:
    """`--dim Lr=1e-3` got no suggestion: as written, `Lr` and `lr` share too few letters to be near."""
    assert did_you_mean("Lr", ["lr", "scale"]) == "did you mean 'lr'?"
    assert did_you_mean("SEQ_LEN", ["seq_len", "steps"]) == "did you mean 'seq_len'?"
    assert did_you_mean("Orhan2020-Copy50", ["orhan2020-copy500"]) == "did you mean 'orhan2020-copy500'?"
    assert did_you_mean("alpah", ["alpha"]) == "did you mean 'alpha'?"  # a misspelling, as before
    assert did_you_mean("foo", ["lr", "scale"]) == ""
    with pytest.raises(SpaceError, match=r"Lr is no setting .*: did you mean 'lr'\?$"):
        small_space().with_overrides(dims={"Lr": Values((1e-3,))}, settings={"lr", "scale"})


def test_with_overrides_leaves_the_preset_alone() -> None:
    preset = get_preset("orhan2020-copy500")
    preset.with_overrides(base={"epochs": 1}, seeds=[1], models=["chain"])
    assert preset.size() == 2_112
    assert "epochs" in preset.base and preset.base["epochs"] == 100


def test_unknown_preset_lists_the_presets() -> None:
    with pytest.raises(UnknownPresetError, match="orhan2020-copy500"):
        get_preset("nope")


# ----- dimensions from JSON / YAML ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ([1e-3, 1e-4], Values((1e-3, 1e-4))),
        ((1, 2), Values((1, 2))),
        (5, Values((5,))),
        ("relu", Values(("relu",))),
        ({"values": [True, False]}, Values((True, False))),
        ({"uniform": [0.5, 1.5]}, Uniform(0.5, 1.5)),
        ({"loguniform": [1e-5, 1e-2]}, Uniform(1e-5, 1e-2, True)),
        ({"int": [2, 14]}, IntRange(2, 14)),
        ({"int": [1, 64], "log": True}, IntRange(1, 64, True)),
    ],
)
def test_dim_from_dict_forms(raw: object, expected: object) -> None:
    assert dim_from_dict(raw, "dims.x") == expected


@pytest.mark.parametrize(
    "dim", [Values((1, "a", None)), Uniform(0.1, 0.2), Uniform(1e-4, 1.0, True), IntRange(1, 9)]
)
def test_dim_round_trip(dim: Values | Uniform | IntRange) -> None:
    assert dim_from_dict(dim_to_dict(dim), "x") == dim


def test_dim_from_dict_unknown_form_says_what_to_write() -> None:
    with pytest.raises(SpaceError) as err:
        dim_from_dict({"range": [1, 2]}, "dims.lr")
    message = str(err.value)
    assert message.startswith("dims.lr: cannot read {'range': [1, 2]} as a dimension")
    for form in (
        '{"values": [...]}',
        '{"uniform": [low, high]}',
        '{"loguniform": [low, high]}',
        '{"int": [low, high]}',
    ):
        assert form in message


@pytest.mark.parametrize(
    "raw",
    [
        {"uniform": [1.0]},
        {"uniform": [2.0, 1.0]},
        {"int": ["a", 3]},
        {"uniform": ["1e-5", 1e-2], "log": True},  # text, where a list of values refuses it too
        {"loguniform": [0.0, 1.0]},
        {"values": []},
        {"uniform": [1e-4, 1e-2], "lgo": True},  # a typo: was linear, without a word
        {"uniform": [1e-4, 1e-2], "log": "false"},  # was log space: bool("false")
        {"int": [8.7, 64.9]},  # was 8 to 64
        {"values": [1, 2], "log": True},  # was ignored
        {"loguniform": [1e-4, 1e-2], "log": False},
        {"uniform": [1e-4, 1e-2], "int": [1, 2]},
        {"uniform": [True, 2]},
        {"uniform": "1,2"},
    ],
)
def test_dim_from_dict_bad_bounds_name_the_place(raw: object) -> None:
    with pytest.raises(SpaceError, match=r"dims\.x"):
        dim_from_dict(raw, "dims.x")


def test_dim_from_dict_reads_every_form() -> None:
    assert dim_from_dict([1, 2], "x") == dim_from_dict({"values": [1, 2]}, "x") == Values((1, 2))
    assert dim_from_dict({"uniform": [1, 2]}, "x") == Uniform(1.0, 2.0, False)
    assert dim_from_dict({"uniform": [1e-4, 1e-2], "log": True}, "x") == Uniform(1e-4, 1e-2, True)
    assert dim_from_dict({"loguniform": [1e-4, 1e-2]}, "x") == Uniform(1e-4, 1e-2, True)
    assert dim_from_dict({"int": [8.0, 64], "log": True}, "x") == IntRange(8, 64, True)
    assert dim_from_dict(3, "x") == Values((3,))


@pytest.mark.parametrize("raw", [[], (), {"values": []}])
def test_an_empty_dimension_names_its_place_and_the_fix(raw: object) -> None:
    """Issue 35 item 7: `dims.lr: []` said `a Values dimension needs at least one value`, naming no field."""
    with pytest.raises(SpaceError) as err:
        dim_from_dict(raw, "space.models.a.dims.lr")
    assert str(err.value) == (
        "space.models.a.dims.lr is empty: give at least one value to try (a list, e.g. lr: [value1, value2]), "
        "or leave space.models.a.dims.lr out"
    )


def test_text_that_reads_as_a_number_is_refused_with_the_number_to_write() -> None:
    """A range's text bound was read as its number while a list's text value was refused: both are
    refused now, with the number to write; and a fix a message proposes is one the door takes."""
    with pytest.raises(
        SpaceError, match=r"dims\.lr\.loguniform\[1\] = '1e-2' is text: write it as a number, 0\.01"
    ):
        dim_from_dict({"loguniform": [1e-4, "1e-2"]}, "dims.lr")
    with pytest.raises(SpaceError, match=r"to run one value write dims: \{lr: \[0\.001\]\}"):
        get_preset("orhan2020-copy500").with_overrides(base={"lr": "1e-3"})


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ([1e-3, 0.001], r"dims\.lr\[0\] = 0\.001 and dims\.lr\[1\] = 0\.001 are the same value"),
        ([8, 16, 8.0], r"dims\.lr\[0\] = 8 and dims\.lr\[2\] = 8\.0 are the same value"),
        (["0.001", 1e-3], r"dims\.lr\[0\] = '0\.001' and dims\.lr\[1\] = 0\.001 are the same value"),
    ],
)
def test_a_value_given_twice_is_refused_naming_the_dimension_and_both_spellings(values, said) -> None:
    """`lr: [1e-3, 0.001]` planned both values' trials, but the study held them once (one config hash).
    A new spec is refused it (`check_distinct`, from `StudySpec`); a space read from a spec stored before
    keeps each value once, as its ledger did."""
    with pytest.raises(SpaceError, match=said + r".*give each value once, e.g\. lr: "):
        check_distinct(values, "dims.lr")
    assert len(dim_from_dict(values, "dims.lr").values) == len(values) - 1
    assert dim_from_dict([True, 1], "dims.lr") == Values((True, 1))  # a boolean is no number here


@pytest.mark.parametrize("values", [[[100], [200]], [100, [100, 200]], [{"a": 1}]])
def test_a_dimensions_value_is_a_single_value(values: list[object]) -> None:
    """A list among a dimension's values (a setting that takes a list, `lr_drop_epochs`) is no choice a
    sampler can draw: a new spec is refused it, naming it, with where a list goes instead (a stored
    spec's grid, which may have swept one, is read as it was: `dim_from_dict` takes it)."""
    with pytest.raises(SpaceError) as err:
        check_single_values(values, "dims.lr_drop_epochs")
    message = str(err.value)
    assert message.startswith("dims.lr_drop_epochs[") and "is not a single value" in message
    assert "base: {lr_drop_epochs:" in message
    check_single_values([100, 200.0, "x", None, True], "dims.v")
    assert dim_from_dict([[100], [200]], "dims.lr_drop_epochs") == Values(([100], [200]))
