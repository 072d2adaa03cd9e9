"""Build a component's frozen config dataclass from user values, with errors that name the fix.

Every component (task, cell, the trial itself) owns its defaults in a frozen dataclass; this module
only turns user input (CLI strings, JSON, dicts) into such a dataclass, checking names and types.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

C = TypeVar("C")


class ConfigError(ValueError):
    """A config value or name is invalid; the message names the field, the allowed values and the fix."""


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


#: the metadata of a config field added after trials were recorded, whose default computes what those
#: trials computed (`backend: ... = field(default="auto", metadata=UNHASHED_DEFAULT)`): a trial's identity
#: (`trainers.config.config_hash`) leaves such a field out while it holds its default, so adding it moves
#: no recorded hash; any other value is part of the identity
UNHASHED_DEFAULT: Mapping[str, Any] = types.MappingProxyType({"unhashed_default": True})


@functools.cache
def unhashed_defaults(cls: type) -> dict[str, Any]:
    """name → default of the fields of config class `cls` marked `UNHASHED_DEFAULT`."""
    return {f.name: f.default for f in dataclasses.fields(cls) if f.metadata.get("unhashed_default")}


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """A config class's field types, resolved once (get_type_hints evaluates every annotation)."""
    return typing.get_type_hints(cls)


def build(cls: type[C], values: Mapping[str, Any], *, where: str) -> C:
    """`cls(**values)` after checking every name and coercing every value to its declared type."""
    hints = _type_hints(cls)  # type: ignore[arg-type]  # classes are hashable
    known = field_names(cls)
    kwargs: dict[str, Any] = {}
    for name, raw in values.items():
        if name not in known:
            raise ConfigError(f"unknown field {name!r} for {where}; valid fields: {', '.join(known)}")
        kwargs[name] = coerce(raw, hints[name], f"{where}.{name}")
    return cls(**kwargs)


def coerce(raw: Any, tp: Any, where: str) -> Any:
    """Convert `raw` (possibly a CLI string) to type `tp`, or raise ConfigError naming `where`."""
    origin = get_origin(tp)
    if origin is Literal:
        allowed = get_args(tp)
        for option in allowed:
            if raw == option or (isinstance(raw, str) and str(option) == raw):
                return option
        folded = [o for o in allowed if isinstance(raw, str) and str(o).lower() == raw.lower()]
        hint = f" (did you mean {folded[0]!r}? names are lowercase)" if folded else ""
        raise ConfigError(
            f"{where} = {raw!r} is not allowed; choose one of: {', '.join(map(str, allowed))}{hint}"
        )
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        is_none = raw is None or (isinstance(raw, str) and raw.lower() in ("none", "null"))
        if is_none and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return coerce(raw, option, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{where} = {raw!r}: " + "; ".join(errors))
    if tp is bool:
        if isinstance(raw, bool):
            return raw
        # text as YAML 1.2 and JSON read a boolean (a CLI's `--set flag=true`), case aside: "yes", "on" or "1"
        # were True here while a spec's 1 was refused, so one setting read two ways
        if isinstance(raw, str) and raw.lower() in ("true", "false"):
            return raw.lower() == "true"
        name = where.rpartition(".")[2]
        raise ConfigError(
            f"{where} = {raw!r} is not a boolean: it takes true or false (as YAML 1.2 and JSON write them; "
            "yes/no, on/off and 1/0 are text or numbers there); a study stored with such text (before memsweep "
            f"refused it) is extended with the setting given again: --set {name}=true (base: {{{name}: true}})"
        )
    if tp is int:
        if isinstance(raw, bool):
            raise ConfigError(f"{where} = {raw!r} is not an integer")
        if isinstance(raw, int):
            return raw
        if isinstance(raw, float) and raw.is_integer():
            return int(raw)
        if isinstance(raw, str):
            try:
                return int(raw)
            except ValueError:
                pass
        raise ConfigError(f"{where} = {raw!r} is not an integer")
    if tp is float:
        value: float | None = None
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            value = float(raw)
        elif isinstance(raw, str):
            with contextlib.suppress(ValueError):
                value = float(raw)
        if value is None:
            raise ConfigError(f"{where} = {raw!r} is not a number")
        if not math.isfinite(value):
            raise ConfigError(f"{where} = {raw!r} is not a finite number; give a finite value")
        return value
    if tp is str:
        if isinstance(raw, str):
            return raw
        raise ConfigError(f"{where} = {raw!r} is not a string")
    return raw
