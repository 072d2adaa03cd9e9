from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from service.cli.servers import free_port
from service.tracking.tracker import prepare_mlflow_process

# The tests drive the engine and the runner in this process as `memsweep`'s entry points do, which set
# MLflow's fail-fast settings first (a test of a tracking server that is down waits seconds, not minutes)
prepare_mlflow_process()

TINY = {
    "task": "addition",
    "seq_len": 20,
    "n_train": 64,
    "n_val": 32,
    "hidden": 16,
    "steps": 20,
    "eval_every": 10,
}


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real MLflow tracking server on loopback (SQLite backend store, artifacts on disk)."""
    from service.tracking.server import start_mlflow_server, stop_mlflow_server

    uri, proc = start_mlflow_server(tmp_path_factory.mktemp("mlflow"), free_port())
    yield uri
    stop_mlflow_server(proc)


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def engine(tmp_path: Path, mlflow_uri: str, ray_session: None):  # type: ignore[no-untyped-def]
    from service.core.settings import Settings
    from service.study.engine import Engine

    return Engine(Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri, ray_num_cpus=2))
