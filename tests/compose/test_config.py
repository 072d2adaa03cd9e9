"""docker/compose.yaml's GPU reservation as Compose reads it (`docker compose config`, the schema checked
too): this machine has no GPU, so the tier runs CPU workers (docker/compose.cpu.yaml), and what a GPU
host would get is checked here, as far as a machine without one can (issue 34; docs/cluster.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.compose.stack import DOCKER, SECRETS, run

pytestmark = [pytest.mark.slow, pytest.mark.compose]


def config(tmp_path: Path, *files: str, **variables: str) -> dict[str, Any]:
    """The merged compose file as Compose reads it, with dummy secrets and `variables`."""
    env_file = tmp_path / "config.env"
    env_file.write_text(
        "".join(f"{k}={v}\n" for k, v in {**dict.fromkeys(SECRETS, "x"), **variables}.items())
    )
    argv = ["docker", "compose", "--project-name", "memsweep-config", "--env-file", str(env_file)]
    for name in files:
        argv += ["-f", str(DOCKER / name)]
    return dict(json.loads(run([*argv, "config", "--format", "json"], timeout=120)))


def reservations(cfg: dict[str, Any]) -> dict[str, Any]:
    """Each service's device reservations (empty when it reserves none)."""
    out = {}
    for name, service in cfg["services"].items():
        reserved = ((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}
        out[name] = reserved.get("devices") or []
    return out


def test_each_ray_worker_and_only_it_reserves_the_hosts_nvidia_gpus(tmp_path: Path):
    gpu = {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
    assert reservations(config(tmp_path, "compose.yaml")) == {
        "postgres": [], "mlflow": [], "ray-head": [], "api": [], "ray-worker": [gpu],
    }  # fmt: skip
    assert reservations(config(tmp_path, "compose.yaml", GPUS_PER_WORKER="4"))["ray-worker"] == [
        {**gpu, "count": 4}
    ]
    assert reservations(config(tmp_path, "compose.yaml", GPUS_PER_WORKER="all"))["ray-worker"] == [
        {**gpu, "count": -1}
    ]


def test_the_cpu_file_drops_the_reservation(tmp_path: Path):
    assert not any(reservations(config(tmp_path, "compose.yaml", "compose.cpu.yaml")).values())
