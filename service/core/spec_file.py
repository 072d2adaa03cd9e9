"""A study spec's file: YAML (read as YAML 1.2 reads a number) or JSON, read into its fields
(`spec_data`); `service.core.spec.load_spec` validates them as a `StudySpec`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml


class SpecLoader(yaml.SafeLoader):  # type: ignore[misc]
    """YAML read as YAML 1.2 reads a number and a boolean. PyYAML follows YAML 1.1: a float needs a dot
    (`1.0e-3`) and `1e-3` is text, so `lr: [1e-3, 3e-4]` was a study of two strings (a trainer reads them
    as numbers, but the study's tables, filters and best configs did not); and `yes`, `no`, `on` and `off`
    are booleans, which a trial setting given on the command line (`--set layer_norm=yes`) is not."""


SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)
# (the resolvers are this class's own copy since the call above: SafeLoader's stay as they are)
SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in SpecLoader.yaml_implicit_resolvers.items()
}
SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def names_spec_file(target: str | Path) -> bool:
    """Whether `target` names a spec file, not a preset: a `Path`, a name ending .yaml, .yml or .json (a
    missing one is refused naming it), or a file that exists."""
    return isinstance(target, Path) or target.endswith((".yaml", ".yml", ".json")) or Path(target).is_file()


def spec_data(path: str | Path) -> dict[str, Any]:
    """A spec file's fields, not validated yet; a file that cannot be read, or is no YAML, is refused naming
    it."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the spec file ({exc.strerror or exc})") from None
    try:
        data = yaml.load(text, Loader=SpecLoader)  # a SafeLoader
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: a scalar its resolver took for a number
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ValueError(f"{path}: not YAML or JSON: {getattr(exc, 'problem', None) or exc}{at}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of spec fields, got {type(data).__name__}")
    return data
