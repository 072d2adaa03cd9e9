"""docker/compose.yaml really run: the base images (docker/base-images.sh), the project's image built,
the stack up under a project name, ports and secrets of its own (so a user's own stack on this host is
left alone), torn down after with what it made: containers, volumes, the image, and the stand-ins when
it built them (MEMSWEEP_COMPOSE_KEEP=1 keeps the images, to run the tier again without rebuilding).

Every command goes through `Stack.compose`, that is
`docker compose --project-name P --env-file F -f docker/compose.yaml -f docker/compose.cpu.yaml ...`,
the commands of docs/cluster.md with the tier's project name and env file."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.cli.servers import free_port
from tests.runs import child_runs

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
FILES = (DOCKER / "compose.yaml", DOCKER / "compose.cpu.yaml")  # this machine has no GPU
PROJECT = "memsweep-tier"
IMAGE = "memsweep:compose-tier"
BASE_IMAGES = ("python:3.11-slim", "postgres:16")
SECRETS = ("POSTGRES_PASSWORD", "RAY_AUTH_TOKEN", "MEMSWEEP_API_TOKEN")
PORTS = ("API_PORT", "MLFLOW_PORT", "RAY_PORT")
#: the plugins built into the tier's image (docs/plugins.md): the example cell, swept beside the papers'
PLUGINS = "./examples/indrnn"


class DockerMissing(RuntimeError):
    """No Docker to run the tier with, and what to do about it."""


def run(argv: list[str], timeout: float = 600, check: bool = True) -> str:
    """A command's stdout; a failure raises with its command line and the end of its output."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if check and done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise AssertionError(f"{' '.join(argv)} exited {done.returncode}:\n{tail}")
    return done.stdout


def check_docker() -> None:
    """Raises `DockerMissing` naming what is missing: the CLI, Compose v2 or a daemon."""
    fix = "run `make docker` as root (docker/host-setup.sh installs Docker and Compose and starts dockerd)"
    for argv, what in (
        (["docker", "--version"], "no Docker CLI"),
        (["docker", "compose", "version"], "no Docker Compose v2 (`docker compose`)"),
        (["docker", "info"], "no Docker daemon answers"),
    ):
        try:
            subprocess.run(argv, capture_output=True, timeout=60, check=True)
        except (OSError, subprocess.SubprocessError) as e:
            raise DockerMissing(f"the compose tier needs Docker: {what} ({e}); {fix}") from e


def image_exists(name: str) -> bool:
    return image_id(name) is not None


def image_id(name: str) -> str | None:
    """The image's id, None where there is no such image."""
    done = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Id}}", name], capture_output=True, text=True
    )
    return done.stdout.strip() if done.returncode == 0 else None


def is_standin(name: str) -> bool:
    labels = run(["docker", "image", "inspect", "-f", "{{json .Config.Labels}}", name])
    return "org.memsweep.standin" in (json.loads(labels) or {})


@dataclass
class Stack:
    """The running stack: its env file (secrets, free loopback ports, the image), and handles."""

    env_file: Path
    variables: dict[str, str]

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.variables['API_PORT']}"

    @property
    def mlflow_uri(self) -> str:
        return f"http://127.0.0.1:{self.variables['MLFLOW_PORT']}"

    @property
    def api_token(self) -> str:
        return self.variables["MEMSWEEP_API_TOKEN"]

    def compose(self, *args: str, timeout: float = 600, check: bool = True) -> str:
        files = [arg for f in FILES for arg in ("-f", str(f))]
        argv = ["docker", "compose", "--project-name", PROJECT, "--env-file", str(self.env_file), *files]
        return run([*argv, *args], timeout=timeout, check=check)

    def up(self, *services: str, workers: int | None = None) -> None:
        """`up -d --wait`: every service (or these) running and healthy; `workers` ray-workers if given."""
        scale = ["--scale", f"ray-worker={workers}"] if workers is not None else []
        self.compose("up", "-d", "--wait", "--wait-timeout", "300", *scale, *services)

    def containers(self, service: str) -> list[str]:
        """The ids of the service's containers, stopped ones included."""
        return self.compose("ps", "-a", "-q", service).split()

    def hostnames(self, service: str) -> set[str]:
        """The hostnames of the service's running containers (a Ray node's name in the ledger)."""
        ids = self.compose("ps", "-q", service).split()
        return {run(["docker", "inspect", "-f", "{{.Config.Hostname}}", i]).strip() for i in ids}

    def inspect(self, container: str, template: str) -> str:
        return run(["docker", "inspect", "-f", template, container]).strip()

    def exec(self, service: str, *argv: str, env: dict[str, str] | None = None) -> str:
        flags = [arg for k, v in (env or {}).items() for arg in ("-e", f"{k}={v}")]
        return self.compose("exec", "-T", *flags, service, *argv)

    def psql(self, database: str, sql: str) -> str:
        """`sql` run by psql in the postgres container, unaligned, fields split by `|`."""
        password = {"PGPASSWORD": self.variables["POSTGRES_PASSWORD"]}
        argv = ["psql", "-h", "127.0.0.1", "-U", "memsweep", "-d", database, "-At", "-c", sql]
        return self.exec("postgres", *argv, env=password).strip()

    def ledger(self, study_id: str) -> dict[str, tuple[str, int, str, str]]:
        """The study's trials as PostgreSQL holds them: config hash → (status, runs, MLflow run, node)."""
        rows = self.psql(
            "memsweep",
            "SELECT config_hash, status, runs, coalesce(mlflow_run_id, ''), coalesce(node, '') "
            f"FROM trials WHERE study_id = '{study_id}'",
        )
        out = {}
        for row in rows.splitlines():
            h, status, runs, run_id, node = row.split("|")
            out[h] = (status, int(runs), run_id, node)
        return out

    def child_runs(self, experiment_id: str, parent: str, every: bool = False) -> list[Any]:
        """The parent's child runs in this stack's MLflow; `every`: deleted ones too."""
        return child_runs(self.mlflow_uri, experiment_id, parent, every)

    def logs(self, *services: str) -> str:
        return self.compose("logs", "--no-color", "--tail", "80", *services, check=False)


def wait_until(check: Callable[[], bool], what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.5)


@contextmanager
def running_stack(root: Path) -> Iterator[Stack]:
    """Base images, the image built, the stack up with one worker; everything it made removed after."""
    check_docker()
    keep = os.environ.get("MEMSWEEP_COMPOSE_KEEP") == "1"
    bases_before = {name for name in BASE_IMAGES if image_exists(name)}
    image_before = image_id(IMAGE)
    variables = {name: secrets.token_hex(16) for name in SECRETS}
    variables |= {name: str(free_port("127.0.0.1")) for name in PORTS}
    variables["MEMSWEEP_IMAGE"] = IMAGE
    variables["MEMSWEEP_PLUGINS"] = PLUGINS
    env_file = root / "compose.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in variables.items()))
    stack = Stack(env_file, variables)
    stack.compose("down", "--volumes", "--remove-orphans", check=False)  # what a killed run left
    try:
        print(run([str(DOCKER / "base-images.sh")], timeout=1200), flush=True)
        started = time.monotonic()
        stack.compose("build", timeout=1800)
        print(f"compose tier: image {IMAGE} built in {time.monotonic() - started:.0f} s", flush=True)
        stack.up()
        yield stack
    except BaseException:
        print(stack.logs(), flush=True)
        raise
    finally:
        stack.compose("down", "--volumes", "--remove-orphans", "--timeout", "20", check=False)
        made = [] if keep else [IMAGE] if not image_before else []
        if image_before and image_id(IMAGE) != image_before:
            # the build moved the tag: the image it was on is now untagged (7 GB), and nothing else
            # removes it (three such filled this machine's disk and failed CI's set-up)
            made.append(image_before)
        made += [
            b for b in BASE_IMAGES if not keep and b not in bases_before and image_exists(b) and is_standin(b)
        ]
        for image in made:
            run(["docker", "rmi", image], check=False)
        if made:
            # the build cache of the images removed, now unreferenced: 7 GB a run (the dependency layer
            # is rebuilt on each run's new stand-ins), which filled this machine's disk after six runs
            run(["docker", "builder", "prune", "--force"], check=False)
