from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.topology import Topology, running_topology


@pytest.fixture(scope="session")
def cluster() -> Iterator[Topology]:
    """docker/compose.yaml's services as processes on this machine (PostgreSQL, MLflow on it, a Ray
    head, two Ray workers of 1 CPU each — the second declaring one GPU, as a GPU host would — and the
    API), up for the whole session, ended after it. This machine has no GPU: the declared one only
    places trials (the trainers see no CUDA there and train on the CPU)."""
    with running_topology(workers=2, worker_cpus=1, worker_gpus=(0, 1)) as topology:
        yield topology
