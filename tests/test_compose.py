"""The compose file's structure: services, GPU reservation, healthchecks, start order, no secret in it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

DOCKER = Path(__file__).resolve().parents[1] / "docker"
COMPOSE = yaml.safe_load((DOCKER / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]
SECRET_KEY = re.compile(r"(PASSWORD|TOKEN|SECRET)", re.IGNORECASE)
REQUIRED_VAR = re.compile(r"\$\{(\w+):\?[^}]+\}")
OUR_IMAGE = "${MEMSWEEP_IMAGE:-memsweep:latest}"  # a registry's name where workers join from other hosts


def test_services():
    assert set(SERVICES) == {"postgres", "mlflow", "ray-head", "ray-worker", "api"}
    for name in ("mlflow", "ray-head", "ray-worker", "api"):  # one image for all of ours
        assert SERVICES[name]["image"] == OUR_IMAGE
    # … built once: compose builds (and exports) an image once per service that has `build:`
    builds = {name: spec["build"] for name, spec in SERVICES.items() if "build" in spec}
    assert list(builds) == ["api"]
    assert {k: builds["api"][k] for k in ("context", "dockerfile")} == {
        "context": "..",
        "dockerfile": "docker/Dockerfile",
    }


def test_ray_worker_reserves_gpus_and_scales():
    devices = SERVICES["ray-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
    assert "container_name" not in SERVICES["ray-worker"]  # `--scale ray-worker=N` needs no fixed name
    assert "ports" not in SERVICES["ray-worker"]
    assert "--address=ray-head:6379" in SERVICES["ray-worker"]["command"]


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_has_a_healthcheck(name):
    check = SERVICES[name]["healthcheck"]
    assert check["test"] and check["interval"] and check["retries"] >= 3


def test_start_order_waits_for_health():
    api = SERVICES["api"]["depends_on"]
    assert {k: v["condition"] for k, v in api.items()} == {
        "postgres": "service_healthy", "mlflow": "service_healthy", "ray-head": "service_healthy",
    }  # fmt: skip
    assert SERVICES["mlflow"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert SERVICES["ray-worker"]["depends_on"]["ray-head"]["condition"] == "service_healthy"


def test_api_joins_the_cluster_and_uses_postgres_and_mlflow():
    env = SERVICES["api"]["environment"]
    assert env["MEMSWEEP_RAY_ADDRESS"] == "ray-head:6379"
    assert env["MEMSWEEP_DATABASE_URL"].startswith("postgresql+psycopg2://")
    assert env["MEMSWEEP_MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    for name in ("api", "ray-head", "ray-worker"):
        assert SERVICES[name]["environment"]["RAY_AUTH_MODE"] == "token"


def walk(node, path=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, f"{path}[{i}]")
    else:
        yield path, node


def test_no_secret_is_written_in_the_compose_file():
    for path, value in walk(COMPOSE):
        key = path.rsplit(".", 1)[-1]
        if SECRET_KEY.search(key):
            assert isinstance(value, str) and REQUIRED_VAR.fullmatch(value), (
                f"{path} must be ${{VAR:?…}}, not a value"
            )
    text = (DOCKER / "compose.yaml").read_text()
    for url in re.findall(r"postgresql\+psycopg2://[^\s\"']+", text):
        password = url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
        assert password.startswith("${POSTGRES_PASSWORD"), url
    # nor on a command line, which `ps` shows to every user of the host (MLflow's store URI was there)
    for path, value in walk(COMPOSE):
        if ".command" in f"{path}." and isinstance(value, str):
            assert not re.search(r"\$\{(POSTGRES_PASSWORD|RAY_AUTH_TOKEN|MEMSWEEP_API_TOKEN)", value), path


def test_env_example_lists_every_required_variable():
    text = (DOCKER / "compose.yaml").read_text()
    required = set(REQUIRED_VAR.findall(text))
    example = {
        line.split("=", 1)[0]
        for line in (DOCKER / ".env.example").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    }
    assert required == {"POSTGRES_PASSWORD", "RAY_AUTH_TOKEN", "MEMSWEEP_API_TOKEN"}
    assert required <= example


def test_the_api_container_is_a_ray_node_without_cpus_before_it_serves():
    """Ray attaches a driver to a raylet of its own host: the api joins as a node first (no trial
    runs there), then serves (the compose tier, tests/compose, runs it)."""
    command = SERVICES["api"]["command"]
    join, serve = command.split("&&")
    assert "ray start --address=ray-head:6379" in join and "--num-cpus=0" in join and "--block" not in join
    assert serve.strip().rstrip('"').startswith("exec memsweep serve")


def test_the_api_is_healthy_once_ready_and_links_mlflow_where_browsers_reach_it():
    test = SERVICES["api"]["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL" and "/ready" in test[1]
    assert "$$MEMSWEEP_API_TOKEN" in test[1]  # the container's variable, not a value in the file
    env = SERVICES["api"]["environment"]
    assert env["MEMSWEEP_MLFLOW_UI_URL"] == "http://${MLFLOW_PUBLIC_HOST:-localhost}:${MLFLOW_PORT:-5000}"
    # MLflow answers 403 to a Host it does not list: the host's loopback on the published port too
    allowed = SERVICES["mlflow"]["command"].split("--allowed-hosts", 1)[1].split()[0].strip('"').split(",")
    for host in ("${MLFLOW_PUBLIC_HOST:-localhost}", "localhost", "127.0.0.1"):
        assert f"{host}:${{MLFLOW_PORT:-5000}}" in allowed, allowed
    assert "mlflow:5000" in allowed  # the api's tracking URI


def test_published_ray_ports_are_the_ones_the_head_listens_on():
    """Only the port workers join on: the dashboard is not started (`ray[tune]` lacks its packages, and
    Ray's job API behind it runs any code it is sent), so nothing answers where none is published."""
    command = SERVICES["ray-head"]["command"]
    published = {p.rsplit(":", 1)[1] for p in SERVICES["ray-head"]["ports"]}
    assert published == {"6379"}
    assert (
        "--port=6379" in command
        and "--include-dashboard=false" in command
        and "dashboard-port" not in command
    )


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_port_is_published_on_loopback_unless_the_user_says_otherwise(name):
    """MLflow has no authentication and the API's token is the only lock: by default nothing listens
    beyond the host's loopback; MEMSWEEP_BIND_ADDRESS publishes the ports further (a worker host)."""
    for mapping in SERVICES[name].get("ports", []):
        assert re.fullmatch(r"\$\{MEMSWEEP_BIND_ADDRESS:-127\.0\.0\.1\}:\$\{\w+:-\d+\}:\d+", mapping), mapping


class ComposeLoader(yaml.SafeLoader):
    """YAML as compose reads it: `!reset` and `!override` are compose's own tags."""


ComposeLoader.add_constructor("!reset", lambda loader, node: ("!reset", loader.construct_sequence(node)))


def test_the_cpu_overlay_removes_the_gpu_reservation():
    """`GPUS_PER_WORKER=0` still asked for the nvidia driver (compose drops a zero count): the overlay
    resets the reservation, so a host without GPUs starts CPU workers."""
    overlay = yaml.load((DOCKER / "compose.cpu.yaml").read_text(), Loader=ComposeLoader)
    assert set(overlay["services"]) == {"ray-worker"}
    devices = overlay["services"]["ray-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == ("!reset", [])


# ----- the image and its build context (issue 24's defects 1, 2 and 6, read from the files; the real
# build and stack are the compose tier's to run) -------------------------------------------------------
DOCKERFILE = (DOCKER / "Dockerfile").read_text()
RUN_LINES = [
    " ".join(block.split())
    for block in DOCKERFILE.replace("\\\n", " ").splitlines()
    if block.startswith("RUN ")
]


def test_the_image_checks_the_installed_package_from_outside_the_source_tree():
    """The dependency layer's stand-in packages and setuptools' build/ folder are gone before the real
    install (a reused build/ installed 0-byte __init__.py files), and the check imports from `/`, where
    it finds the installed package, not ./trainers."""
    deps = next(r for r in RUN_LINES if 'pip install ".[service]"' in r)
    assert "rm -rf build" in deps and all(p in deps for p in ("trainers", "search_spaces", "service"))
    check = next(r for r in RUN_LINES if "pip install --no-deps ." in r)
    after_cd = check.split("cd / &&", 1)[1]
    assert (
        "import trainers, service.study.engine" in after_cd
        and "from search_spaces import SearchSpace" in after_cd
    )
    assert "/site-packages/" in after_cd


def test_every_mount_point_of_the_image_exists_and_belongs_to_the_runtime_user():
    """A named volume mounted where the image has no folder is created root-owned, and MLflow (uid
    1000) could not write its artifacts; mounted on the image's folder, it takes its owner."""
    targets = {
        volume.split(":")[1]
        for name, spec in SERVICES.items()
        if spec.get("image") == OUR_IMAGE
        for volume in spec.get("volumes", [])
        if not volume.startswith(".")
    }
    assert targets == {"/data", "/data/mlartifacts", "/data/datasets"}
    user = DOCKERFILE.index("\nUSER memsweep")
    made = next(r for r in RUN_LINES if "useradd" in r)
    assert DOCKERFILE.index("useradd") < user and "--uid 1000" in made
    assert (
        all(t in made.split("mkdir -p", 1)[1] for t in targets - {"/data"})
        and "chown -R memsweep /data" in made
    )


def test_the_image_declares_no_anonymous_volume():
    """`VOLUME /data` left an anonymous volume behind at each recreate; every mount is a named volume."""
    assert not re.search(r"^VOLUME\b", DOCKERFILE, re.MULTILINE)


def test_the_build_context_holds_only_what_the_image_needs():
    patterns = [ln.strip() for ln in (DOCKER.parent / ".dockerignore").read_text().splitlines()]
    patterns = [p for p in patterns if p and not p.startswith("#")]
    assert patterns[0] == "*"  # everything out (a local .venv is several GB) …
    kept = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    # … but these, and the plugins the image may install (MEMSWEEP_PLUGINS)
    assert kept == {
        "pyproject.toml",
        "README.md",
        "trainers",
        "search_spaces",
        "service",
        "examples",
        "docker/plugins",
    }


def test_the_image_installs_the_plugins_it_is_built_with_and_checks_them():
    """docs/plugins.md: `MEMSWEEP_PLUGINS` reaches the image's build (compose passes it from the
    environment or docker/.env), which installs them after memsweep and runs their contract check."""
    api = COMPOSE["services"]["api"]["build"]
    assert api["args"]["MEMSWEEP_PLUGINS"] == "${MEMSWEEP_PLUGINS:-}"
    assert 'ARG MEMSWEEP_PLUGINS=""' in DOCKERFILE
    install = DOCKERFILE[DOCKERFILE.index("ARG MEMSWEEP_PLUGINS") : DOCKERFILE.index("useradd")]
    assert "pip install $MEMSWEEP_PLUGINS" in install and "memsweep plugins check" in install
    assert "MEMSWEEP_PLUGINS=" in (DOCKER / ".env.example").read_text()


def test_the_secrets_file_is_ignored_by_git():
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "docker/.env"], cwd=DOCKER.parent, capture_output=True, check=False
    )
    assert ignored.returncode == 0, "docker/.env (the compose secrets) must be in .gitignore"


@pytest.mark.parametrize("name", ["ray-head", "ray-worker", "api"])
def test_every_ray_node_has_shared_memory_for_its_object_store(name):
    assert "ray start" in SERVICES[name]["command"]
    assert SERVICES[name]["shm_size"] == "2gb"
