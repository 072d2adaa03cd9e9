"""The compose topology as processes: a real study over REST through PostgreSQL, MLflow and a Ray
cluster of a 0-CPU head and two 1-CPU workers (see tests/cluster/topology.py)."""

from __future__ import annotations

import httpx
import pytest

from service.client import MemsweepClient
from tests.cluster.topology import Topology
from tests.service.test_engine import child_runs

pytestmark = pytest.mark.slow

# Orhan & Pitkow's copy grid as `memsweep demo` runs it, cut further: T = 30, 300 steps, one seed
SPEC = {
    "name": "cluster-copy30",
    "preset": "orhan2020-copy500",
    "models": ["chain", "orthogonal"],
    "dims": {"lr": [1e-3, 3e-4], "scale": [1.0]},
    "seeds": [1],
    "base": {"seq_len": 30, "steps": 300, "eval_every": 100},
}


def test_a_study_runs_on_the_compose_topology(cluster: Topology):
    with MemsweepClient(cluster.api_url, token=cluster.api_token) as client:
        study = client.submit(SPEC)
        final = client.wait(study["id"], poll=1.0, timeout=600, progress=False)
        trials = list(client.iter_trials(study["id"]))
    assert final["state"] == "done", final
    assert final["counts"]["total"] == len(trials) == 4
    assert final["counts"]["finished"] == 4 and all(t["status"] == "done" for t in trials), trials

    # the ledger is PostgreSQL's: its rows, read with psql
    rows = cluster.postgres.psql(
        "memsweep",
        "-c",
        f"SELECT config_hash, status, runs, mlflow_run_id FROM trials WHERE study_id = '{study['id']}'",
    )
    ledger = {h: (status, runs, run_id) for h, status, runs, run_id in (r.split("|") for r in rows.split())}
    assert ledger.keys() == {t["config_hash"] for t in trials}
    assert all(status == "done" and runs == "1" and run_id for status, runs, run_id in ledger.values())

    # MLflow (its backend store on PostgreSQL): the study's parent run and one child run per trial
    exp_id, parent = final["mlflow"]["experiment_id"], final["mlflow"]["run_id"]
    children = child_runs(cluster.mlflow_uri, exp_id, parent)
    assert sorted(r.data.tags["memsweep.config_hash"] for r in children) == sorted(ledger)
    assert {r.info.run_id for r in children} == {run_id for _, _, run_id in ledger.values()}
    stored = cluster.postgres.psql(
        "mlflow", "-c", f"SELECT count(*) FROM tags WHERE key = 'mlflow.parentRunId' AND value = '{parent}'"
    )
    assert int(stored) == 4
    assert final["mlflow"]["run_url"].startswith(cluster.mlflow_uri)  # a link a browser can open
    assert httpx.get(final["mlflow"]["run_url"], timeout=30).status_code == 200

    # Ray: the head and the API's node have no CPUs, so every trial ran on a worker, and both were used
    state = cluster.ray_state()
    nodes = {n["NodeID"]: n for n in state["nodes"] if n["Alive"]}
    cpus = {n["NodeManagerAddress"]: n["Resources"].get("CPU", 0) for n in nodes.values()}
    ips = {c.name: c.host.ip for c in cluster.containers.values()}
    workers = {ips[w.name] for w in cluster.workers}
    assert cpus == {ips["ray-head"]: 0, ips["api"]: 0, **dict.fromkeys(workers, 1.0)}, cpus
    trial_actors = [a for a in state["actors"] if a["ActorClassName"].startswith("ImplicitFunc")]
    assert trial_actors, sorted({a["ActorClassName"] for a in state["actors"]})
    every_node = {n["NodeID"]: n for n in state["nodes"]}  # earlier tests' actors may name a killed node
    placed = {every_node[a["Address"]["NodeID"]]["NodeManagerAddress"] for a in trial_actors}
    assert placed == workers, (placed, workers)


def test_each_service_can_be_stopped_killed_and_restarted(cluster: Topology):
    """The handles the fault tests use: each ends all of its container, and the topology comes back."""
    pg = cluster.postgres
    count = "SELECT count(*) FROM trials"
    before = pg.psql("memsweep", "-c", count)
    pg.restart()  # a fast shutdown and a start on the same data
    assert pg.psql("memsweep", "-c", count) == before

    cluster.mlflow.stop()
    assert not cluster.mlflow.processes() and not cluster.mlflow.healthy()
    cluster.mlflow.start()

    worker = cluster.workers[0]
    worker.kill()  # SIGKILL to the node's whole process group: raylet, agents, workers
    assert not worker.processes()
    cluster.wait_ray_nodes(cluster.ray_node_count_expected() - 1)
    worker.start()
    cluster.wait_ray_nodes(cluster.ray_node_count_expected())

    cluster.api.kill()
    assert not cluster.api.processes() and not cluster.api.healthy()
    cluster.api.start()  # healthy: /ready, so the database, Ray and MLflow are reached again
    cluster.wait_ray_nodes(cluster.ray_node_count_expected())
    with MemsweepClient(cluster.api_url, token=cluster.api_token) as client:
        assert [s["state"] for s in client.studies() if s["name"] == SPEC["name"]] == ["done"]
