from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.topology import Topology, running_topology


@pytest.fixture(scope="session")
def cluster() -> Iterator[Topology]:
    """docker/compose.yaml's services as processes on this machine (PostgreSQL, MLflow on it, a Ray
    head, two Ray workers of 1 CPU each, the API), up for the whole session, ended after it."""
    with running_topology(workers=2, worker_cpus=1) as topology:
        yield topology
