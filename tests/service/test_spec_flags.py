"""The spec flags' table (`service.cli.console.SPEC_FLAGS`) drives the parser, the spec, a study's
extension and a resume's refusals: these tests run over the table, so a flag added to it is tested by
being added (with its example here), and one added anywhere else fails them."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from service.application.records import StudyExtend
from service.cli import parser as cli_parser
from service.cli.commands import changes_spec, refuse_on_resume
from service.cli.console import SPEC_FLAGS, Refused, SpecFlag, add_spec_flags, build_spec, extension_of
from service.cli.parser import build_parser

PRESET = "orhan2020-copy500"

#: each flag's text on a command line, and what it needs beside it (a sampler, its budget)
EXAMPLES = {
    "--set": ["--set", "steps=500"],
    "--dim": ["--dim", "lr=1e-3,3e-4"],
    "--models": ["--models", "chain"],
    "--seeds": ["--seeds", "1,2"],
    "--sampler": ["--sampler", "random", "--max-trials", "8"],
    "--max-trials": ["--max-trials", "100000"],
    "--concurrency": ["--concurrency", "3"],
    "--scheduler": ["--scheduler", "asha"],
    "--success-fraction": ["--success-fraction", "0.25"],
    "--success-threshold": ["--success-threshold", "0.02"],
    "--cpus": ["--cpus", "2"],
    "--gpus": ["--gpus", "0.5"],
    "--name": ["--name", "other"],
}


def field_of(spec: Any, field: str) -> Any:
    """A spec's field, dotted for one inside another (resources.cpus)."""
    for name in field.split("."):
        spec = getattr(spec, name)
    return spec


def example(flag: SpecFlag) -> list[str]:
    assert flag.name in EXAMPLES, f"give {flag.name} an example in EXAMPLES"
    return EXAMPLES[flag.name]


def test_the_flags_that_extend_a_study_are_the_fields_its_extension_takes():
    """`POST /studies/{id}/extend` takes `StudyExtend`'s fields: each has its flag, and a flag that
    extends sends one of them (`extension_of`; the table writes it: see `console.OnStudy`)."""
    assert {flag.field for flag in SPEC_FLAGS if flag.extends} == set(StudyExtend.model_fields)


def test_the_parser_takes_the_tables_flags_and_no_other():
    p = argparse.ArgumentParser()
    add_spec_flags(p)
    added = {option for action in p._actions for option in action.option_strings} - {"-h", "--help"}
    assert added == {flag.name for flag in SPEC_FLAGS}


@pytest.mark.parametrize("flag", SPEC_FLAGS, ids=lambda flag: flag.name)
def test_each_spec_flag_reaches_the_spec(flag: SpecFlag):
    args = build_parser().parse_args(["plan", PRESET, *example(flag)])
    value, spec = flag.value(args), build_spec(args)
    assert value is not None
    got = field_of(spec, flag.field)
    if isinstance(value, dict):  # --set, --dim: their keys over the preset's own
        assert {key: got[key] for key in value} == value
    else:
        assert got == value
    assert got != field_of(build_spec(build_parser().parse_args(["plan", PRESET])), flag.field)


@pytest.mark.parametrize("flag", [f for f in SPEC_FLAGS if f.extends], ids=lambda flag: flag.name)
def test_a_flag_that_extends_a_study_is_sent_as_the_extension_the_server_takes(flag: SpecFlag):
    args = build_parser().parse_args(["submit", "--study", "s1", *example(flag)])
    changes = extension_of(args)
    assert changes == {flag.field: flag.value(args)}
    assert StudyExtend.model_validate(changes).model_dump(exclude_unset=True) == changes
    assert changes_spec(args)


@pytest.mark.parametrize("flag", [f for f in SPEC_FLAGS if not f.extends], ids=lambda flag: flag.name)
def test_a_flag_that_does_not_extend_a_study_is_no_part_of_its_extension(flag: SpecFlag):
    """`--sampler` goes to `run --study`'s extension, whose engine refuses another sampler; the rest a
    resume refuses, naming the field the study keeps."""
    args = build_parser().parse_args(["run", "--study", "s1", *example(flag)[:2]])  # the flag alone
    assert extension_of(args) == {}
    if flag.on_study == "checked":
        assert changes_spec(args)
        return
    assert not changes_spec(args)
    with pytest.raises(Refused) as refused:
        refuse_on_resume(args)
    assert str(refused.value).startswith(
        f"error: {flag.name}: a resumed study keeps its spec's {flag.field} ("
    )


def test_the_usage_lists_every_spec_flag():
    usage = " ".join(cli_parser.USAGE.split())  # (wrapped: a flag and its value may sit on two lines)
    for flag in SPEC_FLAGS:
        assert f"{flag.name} {flag.example}" in usage
