"""The REST service end to end: `memsweep serve` (uvicorn) in a subprocess on loopback, with its embedded
Ray, a real MLflow server and a real SQLite ledger; the Python client and the CLI talk to it over HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from statistics import fmean
from typing import Any

import httpx
import pytest

from service.cli.servers import free_port
from service.client import MemsweepAPIError, MemsweepClient
from service.store.ledger import Ledger
from service.tracking.links import ui_link
from tests.runs import child_runs
from tests.service.conftest import TINY
from tests.service.servers import Server
from trainers import HALF_BASELINE

pytestmark = pytest.mark.slow

TOKEN = "e2e-token-5c1f0b7d"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, mlflow_uri: str) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("api-home"), mlflow_uri, token=TOKEN).start()
    yield s
    s.stop()


@pytest.fixture
def client(server: Server) -> Iterator[MemsweepClient]:
    with MemsweepClient(server.url, token=TOKEN) as c:
        yield c


def grid_spec(**kw: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "rest-tiny-grid",
        "space": {
            "models": {
                "chain": {"fixed": {"init": "chain"}, "dims": {"lr": [1e-3, 50.0]}},
                "orth": {"fixed": {"init": "orthogonal"}, "dims": {"lr": [1e-3, 50.0]}},
            }
        },
        "base": {**TINY, "clip_norm": None},  # lr 50 without clipping diverges: failed trials
        "seeds": [1, 2],
        "success_threshold": 1 / 3,  # loose (2 × baseline), so that some trials succeed
    }
    spec.update(kw)
    return spec


def slower_grid(name: str, lrs: list[float], seeds: list[int], concurrency: int) -> dict[str, Any]:
    """Trials of a few seconds each, one per Ray trial, so that a study can be interrupted between
    trials (interrupting fused bundles: tests/service/test_engine.py)."""
    return {
        "name": name,
        "space": {"dims": {"lr": lrs, "init": ["chain", "orthogonal"]}},
        "base": {**TINY, "steps": 1500, "eval_every": 500},
        "seeds": seeds,
        "concurrency": concurrency,
        "fused": False,
    }


def memsweep_cli(*args: str, url: str) -> Any:
    env = {**os.environ, "MEMSWEEP_API_TOKEN": TOKEN, "MEMSWEEP_HOME": "/nonexistent-not-used"}
    out = subprocess.run(
        [sys.executable, "-m", "service.cli.commands", *args, "--url", url, "--json"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_study_over_rest_agrees_with_mlflow(
    server: Server, client: MemsweepClient, mlflow_uri: str
) -> None:
    study = client.submit(grid_spec(), idempotency_key="e2e-tiny")
    assert client.submit(grid_spec(), idempotency_key="e2e-tiny")["id"] == study["id"]  # a retried submit
    final = client.wait(study["id"], poll=0.5, timeout=300, progress=False)
    assert final["state"] == "done", final
    assert final["counts"]["finished"] == final["counts"]["total"] == 8 and not final["active"]
    trials = client.trials(study["id"])
    assert len(trials) == 8 and all(t["runs"] == 1 for t in trials)
    assert {t["status"] for t in trials} == {"done", "failed"}

    exp_id, parent = final["mlflow"]["experiment_id"], final["mlflow"]["run_id"]
    assert final["mlflow"]["run_url"] == ui_link(mlflow_uri, exp_id, parent)  # in the model-training view
    runs = child_runs(mlflow_uri, exp_id, parent)
    assert sorted(r.data.tags["memsweep.config_hash"] for r in runs) == sorted(
        t["config_hash"] for t in trials
    )

    # /best, from MLflow's child runs: mean final loss over the finished seeds of each (model, lr)
    losses: dict[tuple[str, float], list[float]] = defaultdict(list)
    for r in runs:
        if r.data.tags["memsweep.status"] == "done":
            losses[(r.data.tags["memsweep.model"], float(r.data.params["lr"]))].append(
                r.data.metrics["final_val_loss"]
            )
    expected = sorted(((fmean(v), key, len(v)) for key, v in losses.items()), key=lambda x: x[0])
    best = client.best(study["id"], k=10)
    assert [(b["model"], b["params"]["lr"]) for b in best] == [key for _, key, _ in expected]
    for b, (mean, _, n) in zip(best, expected, strict=True):
        assert b["mean_final_val_loss"] == pytest.approx(mean) and len(b["seeds"]) == n

    # /success, from MLflow: successes, failures and trials per model and per learning rate
    table = client.success(study["id"])
    for model in ("chain", "orth"):
        mine = [r for r in runs if r.data.tags["memsweep.model"] == model]
        cell = table["by_model"][model]
        assert cell["trials"] == len(mine) == 4
        assert cell["succeeded"] == sum(r.data.metrics.get("success") == 1.0 for r in mine)
        assert cell["failed"] == sum(r.data.tags["memsweep.status"] == "failed" for r in mine) == 2
        lo, hi = cell["ci95"]
        assert 0 <= lo <= cell["rate"] <= hi <= 1
        for lr in ("0.001", "50"):
            at = [r for r in mine if f"{float(r.data.params['lr']):g}" == lr]
            assert table["by_value"][model]["lr"][lr]["succeeded"] == sum(
                r.data.metrics.get("success") == 1.0 for r in at
            )
    assert table["total"]["succeeded"] == final["counts"]["succeeded"] > 0
    frame = client.success_table(study["id"])
    assert frame["succeeded"].sum() == table["total"]["succeeded"]

    ready = client.ready()
    assert (
        ready["ready"] and ready["checks"]["ray"]["ok"] and ready["checks"]["mlflow"]["detail"] == mlflow_uri
    )

    # the CLI against the server
    assert memsweep_cli("status", study["id"], url=server.url)["counts"] == final["counts"]
    assert memsweep_cli("best", study["id"], "--k", "10", url=server.url) == best
    assert memsweep_cli("success", study["id"], url=server.url) == table
    spec_file = server.home / "tiny.json"
    spec_file.write_text(json.dumps(grid_spec()))
    resubmitted = memsweep_cli("submit", str(spec_file), "--idempotency-key", "e2e-tiny", url=server.url)
    assert resubmitted["id"] == study["id"]

    # the token: every route but /health and the OpenAPI pages refuses a request without it; the token
    # never reaches the log
    for path in ("/health", "/openapi.json", "/docs"):
        assert httpx.get(f"{server.url}{path}").status_code == 200
    for path in ("/studies", f"/studies/{study['id']}", "/presets", "/ready"):
        assert httpx.get(f"{server.url}{path}").status_code == 401
        assert (
            httpx.get(f"{server.url}{path}", headers={"Authorization": "Bearer wrong-5c1f"}).status_code
            == 401
        )
    log = server.log.read_text()
    assert "POST /studies" in log and TOKEN not in log and "wrong-5c1f" not in log


def test_two_studies_at_once_cancel_and_resume(server: Server, client: MemsweepClient) -> None:
    """Cancelled and resumed from the command line (`memsweep cancel` / `resume --url`), as the client does."""
    a = client.submit(slower_grid("rest-cancel", [1e-3, 3e-4, 1e-4, 3e-5], [1], concurrency=1))
    b = client.submit(
        slower_grid("rest-alongside", [1e-3, 3e-4], [3], concurrency=1)
    )  # seed 3: none reusable
    both_running, slowest, cancelled_at = False, 0.0, None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        started = time.monotonic()
        sa, sb = client.get(a["id"]), client.get(b["id"])
        slowest = max(slowest, (time.monotonic() - started) / 2)
        both_running = both_running or (sa["state"] == sb["state"] == "running")
        if sa["counts"]["done"] >= 2:
            cancelled_at = memsweep_cli("cancel", a["id"], url=server.url)
            break
        time.sleep(0.2)
    assert cancelled_at is not None, "the study never finished two trials"
    # `memsweep cancel` answers with the state the study stopped in (it printed "running", read before)
    assert cancelled_at["state"] == "cancelled" and not cancelled_at["active"], cancelled_at
    assert both_running, "the two studies never ran at the same time"
    assert slowest < 2.0, f"a GET took {slowest:.2f} s while studies ran"

    stopped = client.wait(a["id"], poll=0.5, timeout=120, progress=False)
    assert stopped["state"] == "cancelled"
    # each trial the cancel stopped says so (it said "its Ray trial ended before this member reported"),
    # and one stopped after an evaluation keeps its task's baseline: judged at a budget it reached
    cut = client.trials(a["id"], status="cancelled", history=True)
    assert all(t["reason"] == "the study was cancelled" for t in cut), [t["reason"] for t in cut]
    assert all(t["baseline_loss"] is not None for t in cut if t["history"]), cut
    before = {t["config_hash"]: t for t in client.trials(a["id"], status="done")}
    assert 2 <= len(before) < 8, "the cancel came too late to interrupt the study"
    assert stopped["counts"]["pending"] + stopped["counts"]["cancelled"] == 8 - stopped["counts"]["finished"]
    with pytest.raises(MemsweepAPIError, match="409") as refused:
        client.cancel(a["id"])
    assert "nothing to cancel" in str(refused.value)

    assert memsweep_cli("resume", a["id"], url=server.url)["active"]
    with pytest.raises(MemsweepAPIError, match="409"):
        client.resume(a["id"])  # running already
    done = client.wait(a["id"], poll=0.5, timeout=300, progress=False)
    assert done["state"] == "done" and done["counts"]["done"] == 8
    after = client.trials(a["id"])
    for t in after:
        if t["config_hash"] in before:  # finished before the cancel: never run again
            assert t["runs"] == 1 and t["final_val_loss"] == before[t["config_hash"]]["final_val_loss"]
        else:
            assert t["runs"] in (1, 2)
    assert sum(t["runs"] for t in after) <= 8 + 1  # concurrency 1: at most one trial was interrupted
    assert client.wait(b["id"], poll=0.5, timeout=300, progress=False)["state"] == "done"


def test_a_study_extended_from_the_command_line_trains_only_its_new_points(
    server: Server, client: MemsweepClient
) -> None:
    """`memsweep submit --study ID --seeds …` extends a server's study (the CLI could extend only a study of
    its own machine's ledger, with `run --study`); a flag the extension cannot take is refused by name."""
    study = client.submit(grid_spec(name="rest-extend-cli", seeds=[1]))
    assert client.wait(study["id"], poll=0.5, timeout=300, progress=False)["state"] == "done"
    before = {t["config_hash"]: t for t in client.trials(study["id"])}
    assert len(before) == 4

    extended = memsweep_cli("submit", "--study", study["id"], "--seeds", "1,2", "--wait", url=server.url)
    assert extended["state"] == "done" and extended["counts"]["total"] == 8, extended
    after = client.trials(study["id"])
    # the first seed's trials were not trained again (a trial the module's other studies had trained
    # already is reused: runs 0), and the new ones once at most
    for t in after:
        if (h := t["config_hash"]) in before:
            assert (t["runs"], t["final_val_loss"]) == (before[h]["runs"], before[h]["final_val_loss"])
        else:
            assert t["runs"] <= 1 and t["status"] in ("done", "failed")
    assert {t["params"]["seed"] for t in after if t["config_hash"] not in before} == {2}

    refused = subprocess.run(
        [sys.executable, "-m", "service.cli.commands", "submit", "--study", study["id"], "--concurrency", "2",
         "--url", server.url], env={**os.environ, "MEMSWEEP_API_TOKEN": TOKEN}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert refused.returncode != 0 and "--concurrency" in refused.stderr, refused.stderr
    assert "Create a new study" in refused.stderr and client.get(study["id"])["counts"]["total"] == 8


def wait_for_done(url: str, study_id: str, n: int) -> None:
    deadline = time.monotonic() + 300
    with MemsweepClient(url) as client:
        while client.get(study_id)["counts"]["done"] < n:
            assert time.monotonic() < deadline, f"the study never got {n} trials done"
            time.sleep(0.3)


def test_a_killed_server_resumes_its_study_on_restart(tmp_path: Path, mlflow_uri: str) -> None:
    server = Server(tmp_path / "home", mlflow_uri).start()
    ledger = Ledger(f"sqlite:///{tmp_path / 'home' / 'ledger.db'}")
    try:
        with MemsweepClient(server.url) as client:
            study = client.submit(slower_grid("rest-kill", [1e-3, 3e-4, 1e-4], [1, 2], concurrency=2))
        sid = study["id"]
        assert study["counts"]["total"] == 12
        wait_for_done(server.url, sid, 3)
        server.kill()  # SIGKILL: the server, its study threads and its embedded Ray, mid-study
        done_before = {t.config_hash: (t.final_val_loss, t.runs) for t in ledger.trials(sid, ["done"])}
        assert all(runs == 1 for _, runs in done_before.values())
        assert 3 <= len(done_before) < 12 and ledger.get_study(sid).state == "running"  # type: ignore[union-attr]

        server.start()  # the same home: it finds the unfinished study and resumes it
        wait_for_done(server.url, sid, len(done_before) + 2)
        server.stop()  # SIGTERM: a graceful stop leaves the study pending, to resume at the next start
        # the whole way down: Ray's failure-signal handler used to kill the server 3 s into its shutdown
        assert "Application shutdown complete" in server.tail(20_000), server.tail()
        stopped = ledger.get_study(sid)
        assert stopped is not None and stopped.state == "pending" and "shutdown" in (stopped.error or "")
        done_before.update({t.config_hash: (t.final_val_loss, t.runs) for t in ledger.trials(sid, ["done"])})
        assert len(done_before) < 12, "the graceful stop came after the study had finished"
        # the trials it stopped wait to run again: pending, saying why, not `cancelled` as by a user
        assert not ledger.trials(sid, ["cancelled"])
        assert all("runner stopped" in (t.reason or "") for t in ledger.trials(sid, ["pending"]) if t.runs)

        server.start()
        with MemsweepClient(server.url) as client:
            final = client.wait(sid, poll=0.5, timeout=300, progress=False)
        assert final["state"] == "done" and final["counts"]["done"] == 12
    finally:
        server.stop()
    trials = ledger.trials(sid)
    points = {(t.model, t.params["lr"], t.params["init"], t.params["seed"]) for t in trials}
    assert len(trials) == len(points) == 12  # every grid point once
    for t in trials:
        assert t.status == "done"
        if t.config_hash in done_before:  # finished before a stop: not run again
            assert (t.final_val_loss, t.runs) == done_before[t.config_hash]
        assert t.runs in (1, 2, 3)  # started again only when a stop interrupted it
    assert sum(t.runs for t in trials) <= 12 + 4  # concurrency 2: at most two interrupted per stop
    study_row = ledger.get_study(sid)
    assert study_row is not None and study_row.mlflow_run_id and study_row.error is None
    runs = child_runs(mlflow_uri, str(study_row.mlflow_experiment_id), study_row.mlflow_run_id)
    assert {r.data.tags["memsweep.config_hash"] for r in runs} == {t.config_hash for t in trials}
    assert server.log.read_text().count("resuming 1 unfinished studies") == 2


def test_memsweep_demo_runs_the_readme_study_over_rest(tmp_path: Path, mlflow_uri: str) -> None:
    """`memsweep demo` (the README's main job), shortened: it starts a server, submits the demo study
    over REST, prints the success table and the best configs, leaves the MLflow URL, stops its server."""
    from service.cli.demo import DEMO_SPEC
    from service.cli.servers import port_free

    port = free_port()
    env = {**os.environ, "MEMSWEEP_HOME": str(tmp_path), "MEMSWEEP_MLFLOW_TRACKING_URI": mlflow_uri}
    env.pop("MEMSWEEP_API_TOKEN", None)
    out = subprocess.run(
        [sys.executable, "-m", "service.cli.commands", "demo", "--port", str(port), "--set", "steps=40",
         "--set", "eval_every=20"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"starting `memsweep serve` at http://127.0.0.1:{port}" in out.stderr
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    (study,) = ledger.list_studies()
    trials = ledger.trials(study.id)
    assert study.state == "done" and study.name == DEMO_SPEC["name"]
    assert len(trials) == 8 and {t.status for t in trials} == {"done"}
    assert {t.model for t in trials} == {"chain", "orthogonal"}
    assert {t.config["steps"] for t in trials} == {40}  # the --set override reached every trial
    for model in ("chain", "orthogonal"):  # the success table's row: trials, finished, failed, succeeded
        won = sum(t.succeeded(HALF_BASELINE) for t in trials if t.model == model)
        assert any(
            line.split("│")[1:6]
            and [c.strip() for c in line.split("│")[1:6]] == [model, "4", "4", "0", str(won)]
            for line in out.stdout.splitlines()
        ), out.stdout
    assert "best configurations" in out.stdout
    assert f"/runs/{study.mlflow_run_id}" in out.stdout  # the MLflow URL of the parent run
    assert port_free("127.0.0.1", port), "the demo left its server running"


def test_a_study_submitted_while_mlflow_is_down_trains_and_gets_its_runs_once_mlflow_answers(
    tmp_path: Path,
) -> None:
    """Issue 35: a study submitted while its (configured) MLflow does not answer is not failed (it was,
    within 8 s, with MLflow's raw error): it trains, says why its runs are missing, and the server's
    repair makes them once MLflow answers, nothing asked."""
    from service.tracking.server import start_mlflow_server, stop_mlflow_server

    port = free_port()
    uri = f"http://127.0.0.1:{port}"  # nothing answers there yet
    server = Server(tmp_path / "home", uri, mlflow_repair_interval="2").start()
    mlflow = None
    try:
        with MemsweepClient(server.url) as client:
            sid = client.submit(slower_grid("mlflow-down-at-submit", [1e-3], [1, 2], concurrency=2))["id"]
            wait_for_done(server.url, sid, 1)
            running = client.get(sid)
            assert running["state"] == "running" and running["error"].startswith("MLflow:"), running
            assert "did not answer when the study started" in running["error"]
            final = client.wait(sid, poll=0.5, timeout=300, progress=False)
            assert final["state"] == "done" and final["counts"]["done"] == 4, final
            assert final["error"].startswith("MLflow:"), final
            uri, mlflow = start_mlflow_server(tmp_path / "mlflow", port)
            deadline = time.monotonic() + 120
            while (synced := client.get(sid))["error"] is not None:
                assert time.monotonic() < deadline, f"the runs were not made: {synced['error']}"
                time.sleep(1)
        runs = child_runs(uri, synced["mlflow"]["experiment_id"], synced["mlflow"]["run_id"])
        assert len(runs) == 4 and all(r.info.status == "FINISHED" for r in runs)
    finally:
        server.stop()
        if mlflow is not None:
            stop_mlflow_server(mlflow)


def test_the_local_mlflow_server_is_started_again_when_it_dies(tmp_path: Path) -> None:
    """Issue 35: the MLflow server `memsweep serve` runs on its home (no tracking URI configured) is
    started again when it dies: /ready says 503 meanwhile and 200 again after, and a study submitted
    after writes its runs there."""
    server = Server(tmp_path / "home", None, mlflow_repair_interval="2").start()
    try:
        with MemsweepClient(server.url) as client:
            deadline = time.monotonic() + 180
            while not client.ready()["ready"]:
                assert time.monotonic() < deadline, client.ready()
                time.sleep(1)
            pidfile = tmp_path / "home" / "mlflow" / "mlflow-server.pid"
            os.killpg(int(pidfile.read_text()), signal.SIGKILL)
            saw_down = False
            deadline = time.monotonic() + 180
            while True:
                ready = client.ready()
                saw_down |= not ready["checks"]["mlflow"]["ok"]
                if saw_down and ready["ready"]:
                    break
                assert time.monotonic() < deadline, ready
                time.sleep(0.5)
            sid = client.submit(slower_grid("after-mlflow-restart", [1e-3], [1], concurrency=2))["id"]
            final = client.wait(sid, poll=0.5, timeout=300, progress=False)
            assert final["state"] == "done" and final["error"] is None, final
            uri = f"http://127.0.0.1:{server.env['MEMSWEEP_MLFLOW_PORT']}"
            runs = child_runs(uri, final["mlflow"]["experiment_id"], final["mlflow"]["run_id"])
            assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs)
        assert "starting it again" in server.tail(200_000)
    finally:
        server.stop()
        pidfile = tmp_path / "home" / "mlflow" / "mlflow-server.pid"
        if pidfile.exists():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pidfile.read_text()), signal.SIGTERM)


def test_a_study_is_done_when_its_trials_are_while_mlflow_is_down(tmp_path: Path) -> None:
    """MLflow killed mid-study and left down: the study is done (and its server stops) within seconds
    of its last trial, not after MLflow's retries (minutes); once MLflow is back, a sync rebuilds its
    runs from the ledger. (Issue 25 item 3: the study stayed `running` for 6.5 minutes.)"""
    from service.tracking.server import start_mlflow_server, stop_mlflow_server

    port = free_port()
    uri, mlflow = start_mlflow_server(tmp_path / "mlflow", port)
    server = Server(tmp_path / "home", uri).start()
    try:
        with MemsweepClient(server.url) as client:
            study = client.submit(slower_grid("mlflow-gone", [1e-3, 3e-4], [1, 2], concurrency=2))
            sid = study["id"]
            wait_for_done(server.url, sid, 1)
            stop_mlflow_server(mlflow)  # and it stays down
            wait_for_done(server.url, sid, 8)
            trained = time.monotonic()
            final = client.wait(sid, poll=0.5, timeout=300, progress=False)
            ended = time.monotonic() - trained
            assert final["state"] == "done" and final["counts"]["done"] == 8
            assert ended < 60, f"the study ended {ended:.0f} s after its last trial"
            assert final["error"].startswith("MLflow:") and "did not answer" in final["error"], final
        stopping = time.monotonic()
        server.stop()
        assert time.monotonic() - stopping < 30 and "Application shutdown complete" in server.tail(20_000)

        uri, mlflow = start_mlflow_server(tmp_path / "mlflow", port)  # back, on the same store
        server.start()
        with MemsweepClient(server.url) as client:
            client.sync(sid)
            synced = client.get(sid)
        assert synced["error"] is None, synced
        exp_id, parent = synced["mlflow"]["experiment_id"], synced["mlflow"]["run_id"]
        runs = child_runs(uri, exp_id, parent)
        assert len(runs) == 8 and all(r.info.status == "FINISHED" for r in runs)
    finally:
        server.stop()
        stop_mlflow_server(mlflow)
