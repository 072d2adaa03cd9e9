"""docker/compose.yaml's topology as processes on this machine, for the cluster tier's tests.

`Topology.up()` starts the services in compose's `depends_on` order, each container from its compose
`command` and `environment` (see compose.py for how they are moved onto loopback), and waits for
each to pass its compose healthcheck: PostgreSQL (containers.Postgres), the MLflow server on it, the
Ray head, the Ray workers (replicas of `ray-worker`, each its own Ray node) and the API. The three
secrets get fresh values. Each container can be stopped, killed, restarted on its own (`containers`,
and the `postgres`, `mlflow`, `head`, `workers`, `api` shortcuts); `down()` ends every one of them.

What a container gets from Docker and a process does not, the tier gives explicitly:
- its own loopback address: every `ray start` is given `--node-ip-address` (Ray would otherwise see
  this machine's address, the same for every node) — so each Ray node is a node of its own, with
  its own IP, as on separate hosts;
- its own /tmp and home (TMPDIR, HOME, and `ray start --temp-dir`, under the container's directory):
  Ray keeps a node's sockets and session there, and a worker otherwise takes the head's temp dir;
- a worker's size: `--num-cpus` (a worker host's CPU count; 1 here, so two workers fit in two cores);
- the image's code: PYTHONPATH is this checkout, PATH this interpreter's environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.cluster.compose import Compose, Host
from tests.cluster.containers import Container, Postgres, tool_path

REPO = Path(__file__).resolve().parents[2]
SECRETS = ("POSTGRES_PASSWORD", "RAY_AUTH_TOKEN", "MEMSWEEP_API_TOKEN")
RAY_START = re.compile(r"\bray start\b")

# ray.nodes() and the actors (Tune's trials are actors) as seen by a driver joined to the cluster
RAY_STATE = """
import json, sys, ray
from ray._private import state
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
print(json.dumps({"nodes": ray.nodes(), "actors": list(state.actors().values())}, default=str))
"""


class Topology:
    """The compose services as containers under `root` (a short path: Ray's socket paths are limited
    to 107 characters), `workers` replicas of ray-worker with `worker_cpus` CPUs each."""

    def __init__(
        self, root: Path, workers: int = 2, worker_cpus: int = 1, worker_gpus: tuple[float, ...] = ()
    ):
        self.root = root
        self.worker_gpus = worker_gpus  # GPUs each worker replica declares (`ray start --num-gpus`)
        self.secrets = {name: secrets.token_hex(16) for name in SECRETS}
        self.compose = Compose(root, self.secrets, {"ray-worker": workers})
        # browsers (this test process) reach MLflow at its container's address
        self.compose.interpolate({"MLFLOW_PUBLIC_HOST": self.compose.host("mlflow").ip})
        self.worker_cpus = worker_cpus
        self.containers: dict[str, Container] = {
            h.name: self._container(h) for h in self.compose.hosts.values()
        }

    # ----- building the containers ------------------------------------------------------------------
    def base_env(self, host: Host) -> dict[str, str]:
        """What any container has before its image and compose add theirs."""
        return {
            "PATH": tool_path(),
            "HOME": str(host.root / "home"),
            "TMPDIR": str(host.root / "tmp"),
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(REPO),
        }

    def _container(self, host: Host) -> Container:
        env = {**self.base_env(host), **self.compose.environment(host)}
        log = self.root / "logs" / f"{host.name}.log"
        if host.service == "postgres":
            return Postgres(self.compose, host, env, log)
        argv = self.compose.command(host)
        extra = f"ray start --node-ip-address={host.ip} --temp-dir={host.root / 'tmp' / 'ray'}"
        if host.service == "ray-worker":
            extra += f" --num-cpus={self.worker_cpus}"
            replica = [h.name for h in self.compose.replicas("ray-worker")].index(host.name)
            if replica < len(self.worker_gpus) and self.worker_gpus[replica]:
                extra += f" --num-gpus={self.worker_gpus[replica]:g}"
        argv = shlex.split(RAY_START.sub(extra, shlex.join(argv)))  # also inside `sh -c "…"`
        return Container(host, argv, env, self.compose.health(host), log)

    # ----- the services -----------------------------------------------------------------------------
    def service(self, name: str) -> list[Container]:
        return [self.containers[h.name] for h in self.compose.replicas(name)]

    @property
    def postgres(self) -> Postgres:
        pg = self.containers["postgres"]
        assert isinstance(pg, Postgres)
        return pg

    @property
    def mlflow(self) -> Container:
        return self.containers["mlflow"]

    @property
    def head(self) -> Container:
        return self.containers["ray-head"]

    @property
    def workers(self) -> list[Container]:
        return self.service("ray-worker")

    @property
    def api(self) -> Container:
        return self.containers["api"]

    def up(self) -> Topology:
        """Every service in compose's start order, each replica healthy before the next service;
        the Ray workers also registered with the head (their healthcheck asks only the head)."""
        for name in self.compose.start_order():
            group = self.service(name)
            for container in group:
                if isinstance(container, Postgres):
                    container.start()
                else:
                    container.launch()
            for container in group:
                container.wait_healthy()
            if name == "ray-worker":
                self.wait_ray_nodes(self.ray_node_count_expected(before_api=True))
        return self

    def down(self) -> None:
        """Stop every container, the last started first; SIGKILL whatever is left."""
        for name in reversed(self.compose.start_order()):
            for container in self.service(name):
                with contextlib.suppress(Exception):
                    container.stop(grace=20)
        for container in self.containers.values():
            container.kill()

    # ----- addresses and credentials, as this machine reaches them -----------------------------------
    def url(self, service: str, port: int) -> str:
        host = self.compose.host(service)
        return f"http://{host.ip}:{host.ports[port]}"

    @property
    def api_url(self) -> str:
        return self.url("api", 8000)

    @property
    def api_token(self) -> str:
        return self.secrets["MEMSWEEP_API_TOKEN"]

    @property
    def mlflow_uri(self) -> str:
        return self.url("mlflow", 5000)

    @property
    def ray_address(self) -> str:
        host = self.compose.host("ray-head")
        return f"{host.ip}:{host.ports[6379]}"

    def database_url(self) -> str:
        """The ledger's URL, as the API is given it."""
        return self.api.env["MEMSWEEP_DATABASE_URL"]

    # ----- Ray ---------------------------------------------------------------------------------------
    def ray_env(self) -> dict[str, str]:
        env = self.head.env
        keep = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "PATH", "LANG", "PYTHONPATH")
        return {k: env[k] for k in keep} | {
            "HOME": str(self.root / "driver"),
            "TMPDIR": str(self.root / "driver"),
        }

    def ray_status(self) -> str:
        done = subprocess.run(
            ["ray", "status", "--address", self.ray_address], env=self.ray_env(),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        return done.stdout if done.returncode == 0 else ""

    def ray_node_count_expected(self, before_api: bool = False) -> int:
        """Head and workers; the API's container runs a Ray node too (its driver needs one)."""
        api_node = 0 if before_api else int("ray start" in " ".join(self.api.argv))
        return 1 + len(self.workers) + api_node

    def wait_ray_nodes(self, count: int, timeout: float = 180) -> None:
        """Until `ray status` lists `count` active nodes."""
        deadline = time.monotonic() + timeout
        while (active := _active_nodes(self.ray_status())) != count:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the Ray cluster has {active} active nodes, not {count}:\n{self.ray_status()}"
                )
            time.sleep(2)

    def ray_state(self) -> dict[str, Any]:
        """ray.nodes() and every actor the GCS knows (alive or dead), from a driver joined with the token."""
        Path(self.root / "driver").mkdir(exist_ok=True)
        done = subprocess.run(
            [sys.executable, "-c", RAY_STATE, self.ray_address], env=self.ray_env(),
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"the Ray state driver failed:\n{done.stderr[-3000:]}")
        state: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return state


def _active_nodes(status: str) -> int:
    """The number of active nodes in `ray status` output (one ` 1 node_<id>` line each)."""
    active = status.split("Active:", 1)[-1].split("Pending:", 1)[0] if "Active:" in status else ""
    return len(re.findall(r"^\s*\d+\s+node_[0-9a-f]+", active, re.MULTILINE))


@contextlib.contextmanager
def running_topology(workers: int = 2, worker_cpus: int = 1, worker_gpus: tuple[float, ...] = ()):  # type: ignore[no-untyped-def]
    """The topology up, in a fresh directory under /tmp (short paths); everything ended and removed after."""
    root = Path(tempfile.mkdtemp(prefix="ms-", dir="/tmp"))
    root.chmod(0o711)  # PostgreSQL's user must reach its directory
    topology = Topology(root, workers=workers, worker_cpus=worker_cpus, worker_gpus=worker_gpus)
    try:
        yield topology.up()
    finally:
        topology.down()
        if os.environ.get("MEMSWEEP_KEEP_CLUSTER_LOGS"):
            print(f"cluster logs kept in {root / 'logs'}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
