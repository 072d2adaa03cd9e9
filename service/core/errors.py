"""The refusal every room raises when a study cannot be made or changed as asked. It lives apart
from the spec (`service.core.spec`, which reads the trainers' registries and so imports torch) so that
what only reports a refusal — the CLI in front of a server, the API's error handlers — imports no torch."""

from __future__ import annotations


class StudyError(ValueError):
    """A study cannot be created or changed as asked; the message says why and what to do."""
