from __future__ import annotations

from collections.abc import Iterator

import pytest

from service.client import MemsweepClient
from tests.compose.stack import Stack, running_stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """docker/compose.yaml with docker/compose.cpu.yaml, built and up (one CPU worker) for the tier's
    tests, then taken down with the volumes and images it made (before the rest of the suite runs)."""
    with running_stack(tmp_path_factory.mktemp("compose")) as running:
        yield running


@pytest.fixture
def client(stack: Stack) -> Iterator[MemsweepClient]:
    with MemsweepClient(stack.api_url, token=stack.api_token, timeout=60) as c:
        yield c
