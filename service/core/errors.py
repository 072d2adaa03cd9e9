"""The refusal every room raises when a study cannot be made or changed as asked, and pydantic's
refusals of a spec put in words (`invalid_fields`: the REST answer's and the CLI's). It lives apart
from the spec (`service.core.spec`, which reads the trainers' registries and so imports torch) so that
what only reports a refusal — the CLI in front of a server, the API's error handlers — imports no torch."""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from search_spaces.space import did_you_mean


class StudyError(ValueError):
    """A study cannot be created or changed as asked; the message says why and what to do."""


class UnknownFieldError(StudyError):
    """`by` names fields that no trial of the studies has. The message names them, the nearest field
    to the first and the fields there are, with REST's `?by=`; `on_the_command_line()` says it with
    `memsweep compare`'s `--by`."""

    def __init__(self, unknown: Sequence[str], known: Sequence[str]) -> None:
        self.unknown, self.known = list(unknown), list(known)
        super().__init__(self._said("by", "?by=cell,seq_len"))

    def on_the_command_line(self) -> str:
        return self._said("--by", "--by cell,seq_len")

    def _said(self, name: str, example: str) -> str:
        near = did_you_mean(self.unknown[0], self.known)
        return (
            f"{name}: unknown field {', '.join(repr(f) for f in self.unknown)}; {near + ' ' if near else ''}"
            f"these studies' trials can be grouped by {', '.join(self.known)} (comma-separated, e.g. {example})"
        )


def invalid_fields(
    found: Sequence[Mapping[str, Any]], model: type[BaseModel] | None, root: tuple[Any, ...] = ()
) -> tuple[list[dict[str, Any]], list[str]]:
    """Pydantic's errors (`found`; their `loc` starts with `root` where it is the model's, e.g. the REST
    request's `body`) as memsweep states them: each error with the field's valid names where it has
    them (`allowed`), and a line naming the field and its fix (a validator's own message, which names
    its path, without pydantic's "Value error, " in front)."""
    errors, lines = [], []
    for e in found:
        loc = tuple(e.get("loc", ()))
        where = ".".join(str(p) for p in loc) or "request"
        msg = str(e.get("msg", "invalid")).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        item: dict[str, Any] = {"loc": list(loc), "msg": msg, "type": e.get("type")}
        inside = loc[: len(root)] == root
        if e.get("type") == "extra_forbidden" and inside and model is not None:
            fields = _fields_at(model, loc[len(root) : -1])
            if fields:
                item["allowed"] = fields
                near = did_you_mean(str(loc[-1]), fields)
                msg = f"unknown field; {near + ' ' if near else ''}valid fields here: {', '.join(fields)}"
        elif e.get("type") == "missing":
            msg = "required: give a value"
        elif e.get("type") == "finite_number":
            msg = "not a finite number; give a finite value (NaN and infinities are refused)"
        errors.append(item)
        lines.append(msg if loc in (root, ()) else f"{where}: {msg}")  # the spec's own checks name the path
    return errors, lines


def _fields_at(model: type[BaseModel], path: tuple[Any, ...]) -> list[str]:
    """The field names of the model found by following `path` (field names, dict keys, list indices)
    from `model`."""
    current: Any = model
    for part in path:
        if isinstance(current, type) and issubclass(current, BaseModel):
            info = current.model_fields.get(str(part))
            if info is None:
                return []
            current = _unwrap(info.annotation)
        elif typing.get_origin(current) is dict:
            current = _unwrap(typing.get_args(current)[1])
        elif typing.get_origin(current) in (list, tuple) and isinstance(part, int):
            current = _unwrap(typing.get_args(current)[0])
        else:
            return []
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _unwrap(annotation: Any) -> Any:
    """`X | None` → X."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation
