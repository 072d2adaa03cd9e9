"""`memsweep run --study ID --max-trials N` said "its sampler draws the rest of max_trials M" with the
study's budget before the extension (M < N): the study it goes on with is the one extended."""

from __future__ import annotations

from typing import Any

from service.cli.commands import _create_or_extend
from service.cli.parser import build_parser
from tests.service.test_lifecycle import grid, make_engine  # noqa: F401  (a fixture)


def test_an_extended_sampled_study_goes_on_with_its_new_budget(make_engine: Any) -> None:  # noqa: F811
    engine, _, _ = make_engine()
    study = engine.create_study(grid(sampler="random", max_trials=2, seeds=[1]))
    args = build_parser().parse_args(["run", "--study", study.id, "--max-trials", "4"])
    extended = _create_or_extend(args, engine, None)
    assert extended.id == study.id and extended.validated_spec().max_trials == 4
