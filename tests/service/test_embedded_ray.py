"""The embedded Ray of `memsweep serve` (issue 25 items 6 and 7): its servers listen on every interface
(Ray 2.60 has no setting for it), so a token made by the server locks them; and when the server
dies without shutting Ray down, the next start kills what was left of it."""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from service.cli.servers import LocalServer, free_port
from service.client import MemsweepClient
from service.core.settings import Settings
from service.store.ledger import Ledger
from tests.service.conftest import TINY

#: a study whose trials (a few seconds each) are still running when the server is killed
RUNNING = {
    "name": "running-at-the-crash",
    "preset": "orhan2020-copy500",
    "models": ["chain"],
    "dims": {"lr": [1e-3, 3e-4], "scale": [1.0]},
    "seeds": [1],
    "base": {"seq_len": 30, "steps": 3000, "eval_every": 1000},
    "fused": False,
}


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def descendants(root: int) -> list[int]:
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        pid = p = int(proc.name)
        while p > 1:
            p = parent(p)
            if p == root:
                out.append(pid)
                break
    return out


def marked(mark: str) -> list[int]:
    """The processes whose environment holds TEST_MARK=mark: the server and everything it started."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if f"TEST_MARK={mark}".encode() + b"\0" in (proc / "environ").read_bytes():
                found.append(int(proc.name))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_for(check, what: str, timeout: float = 120):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)
    return found


def locked(entry: str = "main", **env: str) -> str:
    """What an entry point sets in a fresh process (before Ray is imported): `memsweep`'s main (a
    command that starts no Ray), or the app made without the CLI (`uvicorn.run(create_app())`)."""
    start = {
        "main": "from service.cli.commands import main; main(['presets'])",
        "app": "from service.api.app import create_app; create_app()",
        "engine": "from pathlib import Path; from service.core.settings import Settings; "
        "from service.study.engine import Engine; Engine(Settings(home=Path(os.environ['MEMSWEEP_HOME']))).executor",
    }[entry]
    code = (
        f"import os, sys; {start}; "
        "print(os.environ.get('RAY_AUTH_MODE'), len(os.environ.get('RAY_AUTH_TOKEN', '')), 'ray' in sys.modules, "
        "os.environ.get('RAY_DISABLE_FAILURE_SIGNAL_HANDLER'), file=sys.stderr)"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MEMSWEEP_RAY"))}
    done = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("entry", ["main", "app"])
def test_every_entry_locks_only_an_embedded_ray_and_only_before_ray_is_imported(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, entry: str
):
    """Only `memsweep`'s main set the token and the signal setting: a server made as the app's
    docstring says (`uvicorn.run(create_app())`) ran its embedded Ray open to the network."""
    from service.core.settings import Settings
    from service.study.nodes import prepare_ray_process

    home = {"MEMSWEEP_HOME": str(tmp_path)}
    assert locked(entry, **home) == "token 64 False 1"  # a token of its own, 32 random bytes
    assert locked(entry, RAY_AUTH_TOKEN="given", **home) == "token 5 False 1"
    assert (
        locked(entry, MEMSWEEP_RAY_ADDRESS="head:6379", **home) == "None 0 False 1"
    )  # a cluster keeps its own
    assert locked(entry, RAY_AUTH_MODE="disabled", **home) == "disabled 0 False 1"  # an explicit choice wins
    # in a process that already imported Ray (main called in-process), the mode is left alone: Ray
    # read it at import, and a GCS started in token mode would refuse this process's own driver
    import ray  # noqa: F401

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    prepare_ray_process(Settings(home=tmp_path))
    assert "RAY_AUTH_MODE" not in os.environ and "RAY_AUTH_TOKEN" not in os.environ


def test_an_engine_built_by_a_script_locks_its_ray_before_tune_imports_it(tmp_path: Path):
    """A script that builds an Engine itself (reproductions/, benchmarks/) imported Ray with Tune before
    `_start_ray` could set the token: its embedded Ray took Ray's own token from ~/.ray/auth_token,
    shared by every Ray of the user, and memsweep warned (falsely, under Ray 2.60) that it had none."""
    assert locked("engine", MEMSWEEP_HOME=str(tmp_path)) == "token 64 True 1"


def test_the_token_made_for_the_embedded_ray_stays_with_its_process_and_ray(tmp_path: Path):
    """The token a process made for its embedded Ray reached every server it started (its local MLflow
    server's environment held it): a server it starts now inherits neither it nor the mode made with
    it; what the user set is theirs to pass on."""
    code = (
        "import os, sys; from service.cli.commands import main; main(['presets']); "
        "from service.core.processes import child_environment; child = child_environment(); "
        "print(sorted(k for k in ('RAY_AUTH_MODE', 'RAY_AUTH_TOKEN') if k in child), "
        "len(os.environ.get('RAY_AUTH_TOKEN', '')), file=sys.stderr)"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MEMSWEEP_RAY"))}

    def inherited(**env: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", code], env={**clean, "MEMSWEEP_HOME": str(tmp_path), **env},
            capture_output=True, text=True,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stderr.strip().splitlines()[-1]

    assert inherited() == "[] 64"  # made here: this process (and its Ray) has it, its servers do not
    assert inherited(RAY_AUTH_TOKEN="given") == "['RAY_AUTH_TOKEN'] 5"
    assert inherited(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="given") == "['RAY_AUTH_MODE', 'RAY_AUTH_TOKEN'] 5"


#: a driver whose Ray is first needed in a thread that then ends (a request's, a study's): the kernel
#: kills Ray's processes when the thread that started them ends (PR_SET_PDEATHSIG), which took the whole
#: process down a minute later (a pytest worker crashed so in CI)
SHORT_LIVED_STARTER = """
import json, os, sys, threading, time
from pathlib import Path
import ray
from service.core.settings import Settings
from service.study.nodes import ensure_ray

starter = threading.Thread(target=ensure_ray, args=(Settings(home=Path(sys.argv[1]), ray_num_cpus=1),))
starter.start()
starter.join()
time.sleep(2)
children = {}
for stat in Path("/proc").glob("[0-9]*/stat"):
    try:
        name, rest = stat.read_text().split("(", 1)[1].rsplit(")", 1)
    except OSError:
        continue
    state, ppid = rest.split()[:2]
    if int(ppid) == os.getpid():
        children[name] = state
print(json.dumps(children), flush=True)
print("answer", ray.get(ray.remote(lambda: 7).remote(), timeout=60), flush=True)
ray.shutdown()
"""


@pytest.mark.slow
def test_a_ray_started_from_a_thread_that_ends_lives_on(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-c", SHORT_LIVED_STARTER, str(tmp_path)],
        capture_output=True, text=True, timeout=240, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert lines, done.stderr[-3000:]
    children = json.loads(lines[0])
    assert {"gcs_server", "raylet"} <= children.keys(), children
    assert all(state != "Z" for state in children.values()), (
        f"Ray's processes died with the thread: {children}"
    )
    assert done.returncode == 0 and lines[1:] == ["answer 7"], (done.returncode, lines, done.stderr[-3000:])


#: a runner that starts its embedded Ray and shuts down cleanly: the record of that Ray, before and after
CLEAN_STOP = """
import os, sys
from pathlib import Path
from service.core.settings import Settings
from service.runner import StudyRunner
from service.study.engine import Engine
from service.study.nodes import embedded_ray_record

home = Path(sys.argv[1])
runner = StudyRunner(Engine(Settings(home=home, ray_num_cpus=1)), workers=1)
record = embedded_ray_record(home, os.getpid())
runner.start_ray()
print("started", record.exists(), flush=True)
runner.shutdown(timeout=30)
print("stopped", record.exists(), sorted(p.name for p in record.parent.iterdir()), flush=True)
"""


def embedded_script(code: str, home: Path) -> subprocess.CompletedProcess[str]:
    """`code` in a process of its own with `home` as its argument, on an embedded Ray (no address, no
    cluster token inherited from this process's environment)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    env.pop("MEMSWEEP_RAY_ADDRESS", None)
    return subprocess.run(
        [sys.executable, "-c", code, str(home)],
        capture_output=True, text=True, timeout=240, cwd=Path(__file__).parents[2], env=env,
    )  # fmt: skip


@pytest.mark.slow
def test_a_clean_shutdown_removes_the_record_of_its_embedded_ray(tmp_path: Path):
    """The record of an embedded Ray (`embedded-ray/<pid>.json`) was removed only by a later start's
    reap: a server stopped gracefully (or `memsweep plan`, `run`) left it behind."""
    done = embedded_script(CLEAN_STOP, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-2:] == ["started True", "stopped False []"], done.stderr[-3000:]


def test_an_embedded_ray_reports_no_node_plugins_however_it_is_asked(tmp_path: Path, monkeypatch):
    """Every node of an embedded Ray is this machine, whose plugins are the server's: the runner (the
    door, `GET /plugins`) asked its one node anyway, where the engine's executor said None; both ask
    the executor now."""
    from service.core.settings import Settings
    from service.runner import StudyRunner
    from service.study.engine import Engine

    engine = Engine(Settings(home=tmp_path))
    monkeypatch.setattr(engine.executor, "start", lambda: None)  # no Ray is needed to answer
    runner = StudyRunner(engine, workers=1)
    runner.start_ray()
    assert runner.node_plugins() is None
    assert engine.executor.node_plugins() is None


#: a server's runner with its embedded Ray up, asked for a GPU this machine lacks (as the door asks)
GPU_ASKED = """
import sys
from pathlib import Path
from service.core.settings import Settings
from service.runner import StudyRunner
from service.study.engine import Engine

runner = StudyRunner(Engine(Settings(home=Path(sys.argv[1]), ray_num_cpus=1)), workers=1)
runner.start_ray()
print("why", runner.unplaceable({"cpu": 1.0, "gpu": 99.0}), flush=True)
runner.shutdown(timeout=30)
"""


@pytest.mark.slow
def test_a_gpu_the_servers_embedded_ray_lacks_is_refused_as_this_machines(tmp_path: Path):
    """`memsweep serve`'s Ray is embedded too, but once up it was asked as a cluster: "no node of the Ray
    cluster … add a node that has them (ray start --address …)", where `memsweep plan` said "this
    machine's embedded Ray cannot run …, or join a Ray cluster"."""
    done = embedded_script(GPU_ASKED, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (why,) = [line for line in done.stdout.splitlines() if line.startswith("why ")]
    assert why.startswith(
        "why this machine's embedded Ray cannot run a trial asking 1 CPUs and 99 GPUs (it has 1 CPUs "
        "(MEMSWEEP_RAY_NUM_CPUS) and "
    ), why
    assert why.endswith("or join a Ray cluster that has them (MEMSWEEP_RAY_ADDRESS)"), why


def test_a_ray_that_is_up_is_said_as_this_machine_when_it_is_the_embedded_one(tmp_path: Path, monkeypatch):
    """`unplaceable` asks the Ray that is up; the wording follows whether it is the embedded one (the
    adapter's settings name no address) or a cluster it joined."""
    import ray

    from service.study import nodes
    from service.study.ray_tune import RayTune

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": {"CPU": 2.0}}])
    assert RayTune(Settings(home=tmp_path, ray_address=None)).unplaceable({"cpu": 1.0, "gpu": 0.0}) is None
    assert RayTune(Settings(home=tmp_path, ray_address=None)).unplaceable({"cpu": 1.0, "gpu": 1.0}) == (
        "this machine's embedded Ray cannot run a trial asking 1 CPUs and 1 GPUs (it has 2 CPUs and 0 GPUs); "
        "ask for less in `resources`, or join a Ray cluster that has them (MEMSWEEP_RAY_ADDRESS)"
    )
    joined = RayTune(Settings(home=tmp_path, ray_address="head:6379")).unplaceable({"cpu": 1.0, "gpu": 1.0})
    assert joined is not None and joined.startswith("no node of the Ray cluster")
    assert nodes.unplaceable({"cpu": 1.0, "gpu": 1.0}).startswith("no node of the Ray cluster")


def test_the_processes_a_dead_driver_left_are_reaped_and_a_live_ones_are_not(tmp_path: Path):
    """`reap_embedded_ray` on stand-ins for Ray's agents: processes that carry the mark in their
    environment and ignore SIGTERM. (The crash test below cannot tell the reaper from agents that
    exit on their own a while after their raylet: both happen.)"""
    from service.core import processes
    from service.study.nodes import EMBEDDED_RAY, EMBEDDED_RAY_MARK, embedded_ray_record, reap_embedded_ray

    def agent(mark: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, EMBEDDED_RAY_MARK: mark}
        return subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 300 & wait"], env=env)

    def record(pid: int, mark: str, started: str | None = None) -> Path:
        path = embedded_ray_record(tmp_path, pid)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"pid": pid, "mark": mark} | ({"started": started} if started else {})))
        return path

    dead_owners = [subprocess.Popen(["true"]) for _ in range(2)]
    for p in dead_owners:
        p.wait()
    left = [agent("old-1"), agent("old-1"), agent("old-0"), agent("old-3")]
    other = agent("old-2")  # a Ray whose driver still runs
    try:
        dead = record(dead_owners[0].pid, "old-1")
        # a driver that died, its pid since given to a process that started later (the parent's, here)
        started = int(processes.started(os.getppid()) or 0)
        reused = embedded_ray_record(tmp_path / "elsewhere", os.getppid())
        reused.parent.mkdir(parents=True)
        reused.write_text(json.dumps({"pid": os.getppid(), "started": str(started - 1), "mark": "old-3"}))
        (tmp_path / EMBEDDED_RAY).write_text(
            json.dumps({"pid": dead_owners[1].pid, "mark": "old-0"})
        )  # earlier
        alive_record = record(os.getppid(), "old-2", processes.started(os.getppid()))  # a `memsweep plan`
        reaped = reap_embedded_ray(tmp_path) + reap_embedded_ray(tmp_path / "elsewhere")
        assert set(reaped) >= {p.pid for p in left}
        assert all(p.wait(timeout=10) == -signal.SIGKILL for p in left)
        assert not dead.exists() and not (tmp_path / EMBEDDED_RAY).exists() and not reused.exists()
        # the driver of a record still runs: its Ray and its record are left alone
        assert other.poll() is None and alive_record.exists()
        assert reap_embedded_ray(tmp_path) == [] and other.poll() is None
    finally:
        for p in (*left, other):
            p.kill()
            p.wait()


@pytest.mark.slow
def test_the_embedded_ray_refuses_strangers_and_is_reaped_after_a_crash(tmp_path: Path, mlflow_uri: str):
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))},
        "MEMSWEEP_HOME": str(tmp_path / "home"),
        "MEMSWEEP_MLFLOW_TRACKING_URI": mlflow_uri,
        "MEMSWEEP_RAY_NUM_CPUS": "1",
        "TEST_MARK": f"embedded-ray-{os.getpid()}",
    }
    for name in ("MEMSWEEP_API_TOKEN", "MEMSWEEP_RAY_ADDRESS"):
        env.pop(name, None)
    server = LocalServer(free_port(), tmp_path / "server.log", env).start()
    try:
        wait_for(lambda: httpx.get(f"{server.url}/ready", timeout=30).status_code == 200, "Ray and MLflow")
        assert server.proc is not None
        gcs = wait_for(
            lambda: next((p for p in descendants(server.proc.pid) if "gcs_server" in cmdline(p)), 0),
            "the embedded Ray's GCS",
        )
        # the GCS listens on more than one port: its gRPC port is the one Ray writes into the session
        log_dir = re.search(r"--log_dir=(\S+)", cmdline(gcs))
        assert log_dir, cmdline(gcs)
        (port_file,) = Path(log_dir[1]).parent.glob("gcs_server_port_*")
        port = port_file.read_text().strip()
        listening = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
        assert any(f":{port} " in line and f"pid={gcs}," in line for line in listening.splitlines()), (
            listening
        )

        # a stranger on this machine (or, as it listens on every interface, beyond it), without the token
        stranger = {k: v for k, v in env.items() if not k.startswith("RAY_")}
        joined = subprocess.run(
            [sys.executable, "-c", f"import ray; ray.init(address='127.0.0.1:{port}', log_to_driver=False)"],
            env=stranger, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert joined.returncode != 0 and "token" in (joined.stdout + joined.stderr).lower(), joined.stderr[
            -2000:
        ]

        # a crash of the server alone (as the OOM killer would), mid-study: some of Ray's processes
        # outlive it
        # (Ray 2.60: its DashboardAgent and RuntimeEnvAgent, which rename themselves and ignore SIGTERM) …
        with MemsweepClient(server.url) as client:
            study = client.submit(RUNNING)
            wait_for(lambda: client.get(study["id"])["counts"]["running"] > 0, "a trial running")
        ray_processes = [p for p in marked(env["TEST_MARK"]) if p != server.proc.pid]
        assert len(ray_processes) >= 3, ray_processes  # the GCS, the raylet, its agents

        # a local `memsweep plan` on the same home beside it (issue 35): it calibrates on a Ray of its
        # own and leaves the server's record of its Ray alone, so the crash below is still cleaned up
        from service.study.nodes import embedded_ray_record

        server_record = embedded_ray_record(Path(env["MEMSWEEP_HOME"]), server.proc.pid)
        assert json.loads(server_record.read_text())["pid"] == server.proc.pid
        spec = tmp_path / "plan.json"
        spec.write_text(
            json.dumps({**RUNNING, "name": "planned-beside", "base": {"seq_len": 40, "steps": 10}})
        )
        planned = subprocess.run(
            [sys.executable, "-m", "service.cli.commands", "plan", str(spec), "--json"],
            env={**env, "TEST_MARK": "a-local-plan"}, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert planned.returncode == 0, planned.stderr[-3000:]
        assert json.loads(planned.stdout.strip().splitlines()[-1])["calibration_seconds"] > 0  # it had a Ray
        assert json.loads(server_record.read_text())["pid"] == server.proc.pid

        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=30)
        time.sleep(3)
        left = [p for p in ray_processes if alive(p)]
        print(
            f"{len(left)} of the embedded Ray's processes outlived the server: {[cmdline(p) for p in left]}"
        )
        # … until the next start on the same home kills them
        server.start()
        wait_for(lambda: not any(alive(p) for p in ray_processes), "the old Ray's processes gone", timeout=90)

        # a graceful stop (SIGTERM to the server alone) takes its whole Ray down with it
        wait_for(lambda: httpx.get(f"{server.url}/ready", timeout=30).status_code == 200, "Ray again")
        assert server.proc is not None
        everything = [p for p in marked(env["TEST_MARK"]) if p != server.proc.pid]
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(timeout=120)
        wait_for(lambda: not any(alive(p) for p in everything), "Ray's processes gone after a stop", 60)
    finally:
        server.stop()


@pytest.mark.slow
def test_a_local_plan_starts_ray_only_when_it_measures(tmp_path: Path, mlflow_uri: str):
    """Issue 35: `memsweep plan` without a server brings up an embedded Ray for the shapes it must
    calibrate, and none for a plan the cache answers or a spec its checks refuse (it took 16 s and
    wrote over a running server's record of its Ray)."""
    home = tmp_path / "home"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))},
        "MEMSWEEP_HOME": str(home),
        "MEMSWEEP_MLFLOW_TRACKING_URI": mlflow_uri,
        "MEMSWEEP_RAY_NUM_CPUS": "1",
    }
    env.pop("MEMSWEEP_RAY_ADDRESS", None)
    spec = tmp_path / "plan.json"
    spec.write_text(json.dumps({**RUNNING, "name": "planned", "base": {"seq_len": 40, "steps": 10}}))

    def plan(target: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "service.cli.commands", "plan", target, "--json"],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    def records() -> int | None:  # each start writes its Ray's record there, and a clean exit removes it
        folder = home / "embedded-ray"
        return folder.stat().st_mtime_ns if folder.exists() else None

    first = plan(str(spec))
    assert first.returncode == 0, first.stderr[-3000:]
    assert json.loads(first.stdout.strip().splitlines()[-1])["calibration_seconds"] > 0
    started = records()
    assert started is not None, "the first plan measured on a Ray of its own"
    assert list((home / "embedded-ray").iterdir()) == [], "its record outlived the plan's clean exit"
    cached = plan(str(spec))
    assert cached.returncode == 0, cached.stderr[-3000:]
    answer = json.loads(cached.stdout.strip().splitlines()[-1])
    assert answer["cached"] and answer["calibration_seconds"] == 0 and answer["estimate"] is not None
    unknown = plan("orhan2020-nonesuch")
    assert unknown.returncode != 0 and "orhan2020-nonesuch" in unknown.stderr
    assert records() == started, "a plan from the cache, or a refused one, started a Ray"


def test_calls_on_the_ray_thread_return_their_results_and_errors_from_any_thread():
    import threading

    from service.study.nodes import RAY_OWNER, on_ray_thread

    names: list[str] = []
    callers = [
        threading.Thread(target=lambda: names.append(on_ray_thread(lambda: threading.current_thread().name)))
        for _ in range(3)
    ]
    for t in callers:
        t.start()
    for t in callers:
        t.join(10)
    assert names == [RAY_OWNER] * 3  # one thread, outliving its callers
    assert on_ray_thread(lambda: on_ray_thread(lambda: 7)) == 7  # from itself: run there, not queued
    with pytest.raises(ZeroDivisionError):
        on_ray_thread(lambda: 1 / 0)


def test_an_address_where_no_cluster_answers_is_refused_at_once_saying_why(tmp_path: Path):
    """Joining an address where nothing listens, Ray retried for over ten minutes, logging only its own
    attempts: `memsweep serve` said "starting" and held the studies posted to it, `memsweep run` sat
    silent, and neither stopped at SIGTERM. Now the head is asked first, and a ray:// (Ray Client)
    address or one that is not host:port is refused saying what to give; nothing is recorded."""
    from service.study.nodes import unreachable_cluster

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    free = closed.getsockname()[1]
    closed.close()
    try:
        assert unreachable_cluster(f"127.0.0.1:{listening.getsockname()[1]}") is None
        assert "nothing accepts a connection there" in str(
            unreachable_cluster(f"127.0.0.1:{free}", timeout=5)
        )
        assert "Ray Client's" in str(unreachable_cluster("ray://head:10001"))
        assert "is not host:port" in str(unreachable_cluster("head-node"))
        assert unreachable_cluster("auto") is None  # Ray's to find
    finally:
        listening.close()
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"space": {"dims": {"lr": [1e-3]}}, "base": TINY}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    env.update(MEMSWEEP_HOME=str(tmp_path / "home"), MEMSWEEP_RAY_ADDRESS=f"127.0.0.1:{free}")
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-P", "-m", "service.cli", "run", str(spec)],
        env=env, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert done.returncode == 1 and time.monotonic() - began < 120, done.stderr[-3000:]
    assert done.stderr.startswith(f"error: ConnectionError: cannot join the Ray cluster at 127.0.0.1:{free}")
    assert "Traceback" not in done.stderr
    assert Ledger(f"sqlite:///{tmp_path / 'home' / 'ledger.db'}").list_studies() == []


@pytest.mark.parametrize("mode", [None, "token"])
def test_a_cluster_that_refuses_this_process_says_what_to_check(
    monkeypatch: pytest.MonkeyPatch, mode: str | None
):
    """Ray answers a missing or wrong token as it answers a wrong address ("Failed to connect to Ray
    cluster at …"; the cause only in its driver log): the error names both."""
    import ray

    import service.study.nodes as nodes
    from service.core.settings import Settings
    from service.study.nodes import ensure_ray

    def refused(**kw: object) -> None:
        raise ConnectionError(f"Failed to connect to Ray cluster at {kw['address']}")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refused)
    monkeypatch.setattr(nodes, "unreachable_cluster", lambda address: None)  # a head answers there
    if mode is None:
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    else:
        monkeypatch.setenv("RAY_AUTH_MODE", mode)
    with pytest.raises(ConnectionError) as refusal:
        ensure_ray(Settings(ray_address="head:6379"))
    said = str(refusal.value)
    assert said.startswith("Failed to connect to Ray cluster at head:6379. ")
    assert "ray status --address head:6379" in said and "RAY_AUTH_TOKEN" in said
    assert ("has RAY_AUTH_MODE=token and the cluster's token" in said) == (mode is None)


def test_a_units_memory_is_shared_among_the_units_ray_runs_at_once_not_the_hosts_cpus(tmp_path: Path):
    """A unit's share of a node's memory divided it among `os.cpu_count() / cpus` units: on a host with
    64 CPUs whose Ray schedules 2 (MEMSWEEP_RAY_NUM_CPUS, a container's quota), each unit was planned
    with a 32nd of the memory, and bundles were cut small for nothing."""
    code = (
        "import json, os, ray; from service.study.nodes import node_cpus; "
        "outside = node_cpus(); ray.init(address='local', num_cpus=1, include_dashboard=False, log_to_driver=False); "
        "print(json.dumps([outside, len(os.sched_getaffinity(0)), node_cpus()])); ray.shutdown()"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MEMSWEEP_RAY"))}
    done = subprocess.run(
        [sys.executable, "-c", code], env={**clean, "RAY_AUTH_MODE": "disabled"}, cwd=tmp_path,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    outside, usable, in_ray = json.loads(done.stdout.strip().splitlines()[-1])
    assert outside == usable and in_ray == 1.0


# The CPUs an embedded Ray offers, counted without Ray's private helpers: this process's affinity, at most
# its cgroup's quota (read from a fake cgroup directory here), MEMSWEEP_RAY_NUM_CPUS first.


def own_cgroups() -> list[str]:
    return Path("/proc/self/cgroup").read_text().splitlines()


def test_a_cgroup_v2_quota_caps_the_cpus(tmp_path: Path):
    from service.study.nodes import cgroup_cpus, usable_cpus

    if not any(line.startswith("0::") for line in own_cgroups()):
        pytest.skip("this process has no cgroup v2 hierarchy")
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpus(tmp_path) is None
    assert usable_cpus(tmp_path) == len(os.sched_getaffinity(0))
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # `docker run --cpus 1.5`
    assert cgroup_cpus(tmp_path) == 1.5
    assert usable_cpus(tmp_path) == 1  # whole CPUs, as Ray counts a quota
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    assert usable_cpus(tmp_path) == 1  # at least one


def test_a_cgroup_v1_quota_caps_the_cpus(tmp_path: Path):
    from service.study.nodes import cgroup_cpus, usable_cpus

    if not any("cpu" in line.split(":")[1].split(",") for line in own_cgroups()):
        pytest.skip("this process has no cgroup v1 cpu hierarchy")
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpus(tmp_path) is None
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    assert cgroup_cpus(tmp_path) == 1.0 and usable_cpus(tmp_path) == 1
    assert cgroup_cpus(tmp_path / "elsewhere") is None  # no cgroup filesystem: no quota


def test_memsweep_ray_num_cpus_wins_and_the_count_is_rays_on_this_machine():
    from ray._private.utils import get_num_cpus  # the reference only

    from service.study.nodes import cgroup_cpus, embedded_cpus, embedded_resources, usable_cpus

    assert (
        embedded_cpus(Settings(ray_num_cpus=7)) == 7
        and embedded_resources(Settings(ray_num_cpus=7))[0] == 7.0
    )
    # Ray's count reads neither the affinity nor a quota below the cgroup root: only here do they agree
    if len(os.sched_getaffinity(0)) == os.cpu_count() and cgroup_cpus() is None:
        assert usable_cpus() == get_num_cpus()
    assert embedded_cpus(Settings(ray_num_cpus=None)) == usable_cpus()


def test_the_ray_adapter_uses_no_private_part_of_ray():
    from service.study import nodes, ray_tune

    for module in (nodes, ray_tune):
        source = inspect.getsource(module)
        assert "from ray._private" not in source and "._rungs" not in source, module.__name__


# The server's secrets stay with the server: its embedded Ray's processes (a worker runs a trial's code, a
# plugin's among it) inherit neither the API's token nor the ledger's URL, and still get what a trial
# needs.


#: a driver that starts its embedded Ray as the server does, with the secrets in its environment: what
#: a task on a worker sees, what every process under the driver holds, and what the driver keeps
SECRETS_SEEN = """
import json, os, sys
from pathlib import Path
from service.core.settings import Settings
from service.study.nodes import ensure_ray

settings = Settings(home=Path(sys.argv[1]), ray_num_cpus=1)
ensure_ray(settings)
import ray
from service.core.processes import descends_from

def seen():
    names = ("MEMSWEEP_API_TOKEN", "memsweep_database_url", "MEMSWEEP_DATA_DIR", "RAY_DISABLE_FAILURE_SIGNAL_HANDLER")
    return {name: os.environ.get(name) for name in names}

environs = []
for proc in Path("/proc").glob("[0-9]*"):
    try:
        if descends_from(int(proc.name), os.getpid()):
            environs.append((proc / "environ").read_bytes().decode(errors="replace"))
    except OSError:
        pass
print(json.dumps({
    "worker": ray.get(ray.remote(seen).remote(), timeout=120),
    "processes": len(environs),
    "leaked": sum("a-secret-token" in e or "a-password" in e for e in environs),
    "driver": [os.environ.get("MEMSWEEP_API_TOKEN"), settings.api_token.get_secret_value()],
}), flush=True)
ray.shutdown()
"""


@pytest.mark.slow
def test_no_process_of_the_embedded_ray_inherits_the_servers_secrets(tmp_path: Path):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MEMSWEEP_"))}
    env = {
        **clean,
        "MEMSWEEP_API_TOKEN": "a-secret-token",
        "memsweep_database_url": f"postgresql://memsweep:a-password@db/ledger?{tmp_path}",  # any case reads
        "MEMSWEEP_DATA_DIR": str(tmp_path / "datasets"),
    }
    done = subprocess.run(
        [sys.executable, "-c", SECRETS_SEEN, str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2], env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["worker"] == {
        "MEMSWEEP_API_TOKEN": None,
        "memsweep_database_url": None,
        "MEMSWEEP_DATA_DIR": str(tmp_path / "datasets"),  # what a trial needs still reaches it
        "RAY_DISABLE_FAILURE_SIGNAL_HANDLER": "0",
    }
    assert seen["processes"] >= 3 and seen["leaked"] == 0, seen  # gcs, raylet, agents, workers
    assert seen["driver"] == ["a-secret-token", "a-secret-token"]  # the server keeps its own
