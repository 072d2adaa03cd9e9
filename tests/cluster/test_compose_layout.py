"""How the cluster tier reads docker/compose.yaml (no process started: fast)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cluster.compose import Compose, ComposeError, dockerfile_image, interpolate, seconds
from tests.cluster.topology import SECRETS, Topology

VARIABLES = {name: f"secret-{name.lower()}" for name in SECRETS}


def test_interpolation_follows_compose():
    env = {"SET": "v", "EMPTY": ""}
    assert interpolate("${SET} $SET ${SET:-d} ${UNSET:-d} ${EMPTY:-d} ${EMPTY-d}", env) == "v v v d d "
    assert interpolate("${SET:+alt}${UNSET:+alt} $$SET $${SET}", env) == "alt $SET ${SET}"
    assert interpolate("${SET:?gone}", env) == "v"
    with pytest.raises(ComposeError, match=r"UNSET.*set it"):
        interpolate("${UNSET:?set it}", env)
    with pytest.raises(ComposeError, match="EMPTY"):
        interpolate("${EMPTY:?}", env)


def test_durations_and_the_image():
    assert seconds("1m30s", 0) == 90 and seconds("500ms", 0) == 0.5 and seconds(None, 7) == 7
    env, volumes = dockerfile_image(
        'ENV A=1 \\\n    B="two words"\nENV C 3\nVOLUME ["/v1", "/v2"]\nVOLUME /v3\n'
    )
    assert env == {"A": "1", "B": "two words", "C": "3"} and volumes == ["/v1", "/v2", "/v3"]


@pytest.mark.parametrize("missing", SECRETS)
def test_compose_refuses_without_each_secret(tmp_path: Path, missing: str):
    with pytest.raises(ComposeError, match=missing):
        Compose(tmp_path, {k: v for k, v in VARIABLES.items() if k != missing})


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Topology:
    return Topology(tmp_path_factory.mktemp("layout"), workers=2)


def test_every_container_is_a_host_of_its_own(topology: Topology):
    hosts = topology.compose.hosts
    assert list(hosts) == ["postgres", "mlflow", "ray-head", "ray-worker-1", "ray-worker-2", "api"]
    assert len({h.ip for h in hosts.values()}) == len(hosts)
    assert all(h.ip.startswith("127.") and h.ip != "127.0.0.1" for h in hosts.values())
    ports = [p for h in hosts.values() for p in h.ports.values()]
    assert len(set(ports)) == len(ports) and not {5000, 5432, 6379, 8000, 8265} & set(ports)
    assert topology.compose.start_order().index("api") > topology.compose.start_order().index("ray-head")


def test_no_container_name_port_or_path_is_left(topology: Topology):
    """Every command, environment and healthcheck reaches the other containers at their loopback
    address and free port, binds its own address, and writes under the tier's directory."""
    container_refs = re.compile(r"\b(postgres|mlflow|ray-head|localhost):\d+|0\.0\.0\.0|(?<![\w/])/data\b")
    for container in topology.containers.values():
        texts = [
            *container.argv,
            *container.env.values(),
            *(container.health.argv if container.health else []),
        ]
        for text in texts:
            assert not container_refs.search(text), (container.name, text)
    pg, mlflow, head = (
        topology.compose.host("postgres"),
        topology.compose.host("mlflow"),
        topology.compose.host("ray-head"),
    )
    api = topology.api.env
    assert api["MEMSWEEP_DATABASE_URL"].endswith(f"@{pg.ip}:{pg.ports[5432]}/memsweep")
    assert (
        api["MEMSWEEP_MLFLOW_TRACKING_URI"]
        == topology.mlflow_uri
        == f"http://{mlflow.ip}:{mlflow.ports[5000]}"
    )
    assert api["MEMSWEEP_RAY_ADDRESS"] == topology.ray_address == f"{head.ip}:{head.ports[6379]}"
    assert api["MEMSWEEP_API_TOKEN"] == topology.api_token == topology.secrets["MEMSWEEP_API_TOKEN"]


def test_each_ray_node_gets_its_host_address_temp_dir_and_size(topology: Topology):
    for container in [topology.head, *topology.workers, topology.api]:
        command = " ".join(container.argv)
        assert f"ray start --node-ip-address={container.host.ip} --temp-dir={container.host.root}" in command
    assert all("--num-cpus=1" in w.argv for w in topology.workers)
    assert "--num-cpus=0" in topology.head.argv
    assert topology.ray_node_count_expected() == 4  # head, two workers, the api's node
