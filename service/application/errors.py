"""The study service's refusals, each a message that says what to do next; the API answers them as
404 / 409 / 422 / 503 (`service.api.errors`), the CLI prints them (`service.cli.console`)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from search_spaces import list_presets
from search_spaces.space import did_you_mean
from service.core.errors import StudyError


class NotFoundError(LookupError):
    """No such study (or preset); the message names it and where to find valid ones."""


def unknown_preset(name: str, listed_by: str) -> str:
    """Why `name` is no preset: the nearest preset's name, where the presets are `listed_by` (REST's
    `GET /presets`, the CLI's `memsweep presets`), and their names."""
    names = list_presets()
    near = did_you_mean(name, names)
    return (
        f"unknown preset {name!r}; {near + ' ' if near else ''}{listed_by} lists them with their sizes and "
        f"citations; presets: {', '.join(names)}"
    )


class ConflictError(RuntimeError):
    """The study's state does not allow the change; the message says which state would."""


class UnavailableError(RuntimeError):
    """A service the request needs (MLflow) does not answer; the message says what to do."""


class IdempotencyMismatchError(ValueError):
    """An Idempotency-Key reused with a different request."""


class SpecInvalidError(StudyError):
    """A spec the request's changes made invalid (`extend`), with pydantic's errors located in the
    request's body: answered as `POST /studies` answers an invalid spec (`service.api.errors`)."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        self.errors = errors
        super().__init__(
            "; ".join(
                e["msg"] if e["loc"] == ["body"] else f"{'.'.join(map(str, e['loc'][1:]))}: {e['msg']}"
                for e in errors
            )
        )

    @classmethod
    def of(cls, exc: ValidationError) -> SpecInvalidError:
        return cls(
            [
                {
                    "loc": ["body", *e["loc"]],
                    "msg": e["msg"].removeprefix("Value error, "),
                    "type": e["type"],
                }
                for e in exc.errors(include_url=False, include_input=False, include_context=False)
            ]
        )
