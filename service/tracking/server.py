"""The local MLflow tracking server memsweep starts when no tracking URI is configured: `mlflow
server` on loopback (a SQLite backend store in WAL mode, artifacts on disk), detached from the
process that started it, so it outlives a study and keeps the UI up; and the health probe every
caller asks before it waits on MLflow.

Each home has its own server, on its own store (`HOME/mlflow`): it is found again by the process it
recorded (`mlflow-server.pid`, `mlflow-server.uri`), never by its port alone, so a server another home
left on the configured port is not taken for this home's (its runs would have gone to that home's
store); this home's then starts on the next free port, and says so."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from service.core import processes

log = logging.getLogger(__name__)


def server_healthy(uri: str, timeout: float = 2.0) -> bool:
    try:
        return httpx.get(f"{uri.rstrip('/')}/health", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def start_mlflow_server(
    home: Path, port: int, host: str = "127.0.0.1", wait: float = 120.0
) -> tuple[str, subprocess.Popen[bytes]]:
    """Start `mlflow server` on loopback, detached from this process's session; wait for /health."""
    home.mkdir(parents=True, exist_ok=True)
    uri = f"http://{host}:{port}"
    store = home / "mlflow.db"
    if not store.exists():  # a write-ahead log: 10–15 % less time per write here, and reads never wait
        with contextlib.closing(sqlite3.connect(store)) as db:
            db.execute("PRAGMA journal_mode=WAL")
    cmd = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", f"sqlite:///{store}",
        "--artifacts-destination", str(home / "mlartifacts"),
        "--host", host, "--port", str(port),
        # One uvicorn worker: with two, every request here waited ~40 ms more (/health 44 ms against
        # 3 ms) and four writer threads got fewer runs per second through (16.9 against 20.6)
        "--workers", "1",
    ]  # fmt: skip
    # The GenAI job runners (several huey consumer processes) are of no use to memsweep and cost CPU.
    # None of memsweep's settings either, and some are secrets (the API token, a ledger URL with its
    # password): the server outlives the process that starts it, for browsing.
    env = {
        name: value
        for name, value in processes.child_environment(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false").items()
        if not name.startswith("MEMSWEEP_")
    }
    with open(home / "mlflow-server.log", "ab") as logfile:  # the child's; this process's copy closes
        proc = subprocess.Popen(
            cmd, stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True, cwd=home, env=env
        )
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        exited = proc.poll() is not None  # before the probe: an answer then is another server's
        if not exited and server_healthy(uri):
            (home / "mlflow-server.pid").write_text(str(proc.pid))
            (home / "mlflow-server.uri").write_text(uri)
            return uri, proc
        if exited:
            raise (
                PortTakenError(uri)
                if server_healthy(uri)
                else RuntimeError(
                    f"mlflow server exited with {proc.returncode}; see {home / 'mlflow-server.log'}"
                )
            )
        time.sleep(0.5)
    stop_mlflow_server(proc)
    raise RuntimeError(
        f"mlflow server did not answer /health within {wait:.0f} s; see {home / 'mlflow-server.log'}"
    )


def stop_mlflow_server(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Stop a server from `start_mlflow_server` and its uvicorn workers (its whole process group),
    reaping it (a child of this process)."""
    stop_pid(proc.pid, timeout, running=lambda: proc.poll() is None)


class PortTakenError(RuntimeError):
    """Another server answered on the port a new server was started on (it could not bind it)."""


def ensure_mlflow_server(
    tracking_uri: str | None, home: Path, port: int, keep_port: int | None = None
) -> str:
    """The configured tracking URI, or this home's local server on loopback: the one it started, while
    that still runs (given time to answer; one that never does is stopped), else a new one on
    `keep_port` (a restart keeps the port running studies write to) or `port`, or the next free port
    when something else holds it. One process of a home at a time decides (a lock file)."""
    if tracking_uri:
        return tracking_uri
    folder = home / "mlflow"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "mlflow-server.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a server and a CLI of one home starting at once: one server
        own = recorded_server(folder)
        if own is not None:
            pid, uri = own
            if answers(uri, patience=OWN_SERVER_PATIENCE):
                return uri
            log.warning("this home's MLflow server (pid %d, %s) does not answer: stopping it", pid, uri)
            stop_pid(pid)
            keep_port = keep_port or port_of(uri)
        wanted = keep_port or port
        for _ in range(3):
            chosen = next_free_port(wanted)
            if chosen != wanted:
                log.warning(
                    "MLflow: port %d is taken (another home's MLflow server, or another program); this "
                    "home's server (store %s) starts on port %d. Set MEMSWEEP_MLFLOW_PORT to choose its port",
                    wanted,
                    folder,
                    chosen,
                )
            try:
                return start_mlflow_server(folder, chosen)[0]
            except PortTakenError:  # another home's server took it between the probe and the start
                wanted = chosen + 1
        raise RuntimeError(f"MLflow: no port near {port} stayed free to start this home's server on")


#: seconds a home's own running server is given to answer before it is taken for hung
OWN_SERVER_PATIENCE = 30.0


def answers(uri: str, patience: float) -> bool:
    """Whether the server at `uri` answers /health within `patience` seconds."""
    deadline = time.monotonic() + patience
    while not server_healthy(uri):
        if time.monotonic() > deadline:
            return False
        time.sleep(1.0)
    return True


def home_uri(home: Path, port: int) -> str:
    """The URI this home's local server was last started on, else the one it would start on."""
    try:
        return (home / "mlflow" / "mlflow-server.uri").read_text().strip() or f"http://127.0.0.1:{port}"
    except OSError:
        return f"http://127.0.0.1:{port}"


def port_of(uri: str) -> int | None:
    port = urlsplit(uri).port
    return int(port) if port else None


def recorded_server(folder: Path) -> tuple[int, str] | None:
    """(pid, URI) of the server `start_mlflow_server` started on this store (`folder`), while its
    process still runs, whether or not it answers now; None otherwise. Its process is told by its
    command line where /proc has one (it names this store: a pid reused by another program is not it);
    its URI is the recorded one, or its command line's port (a record of a memsweep before the URI file)."""
    try:
        pid = int((folder / "mlflow-server.pid").read_text())
    except (OSError, ValueError):
        return None
    try:
        uri: str | None = (folder / "mlflow-server.uri").read_text().strip()
    except OSError:
        uri = None
    try:
        cmdline = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
    except OSError:
        cmdline = None
    if cmdline is not None:
        if f"sqlite:///{folder / 'mlflow.db'}" not in cmdline:
            return None
        if "--port" in cmdline[:-1]:
            uri = f"http://127.0.0.1:{cmdline[cmdline.index('--port') + 1]}"
    elif not processes.alive(pid):
        return None
    return (pid, uri) if uri else None


def stop_pid(pid: int, timeout: float = 30.0, running: Callable[[], bool] | None = None) -> None:
    """Stop a server by its pid (its process group: `start_mlflow_server` made it a session's leader):
    SIGTERM, then SIGKILL after `timeout` seconds. `running`: whether it still runs (for a child of this
    process, its `poll`, which also reaps it); by default `processes.alive`, a zombie counting as ended."""
    alive = running or (lambda: processes.alive(pid))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + timeout
        while alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        if not alive():
            return


def next_free_port(port: int, host: str = "127.0.0.1", tries: int = 100) -> int:
    """`port`, or the first port above it that nothing listens on."""
    for candidate in range(port, min(port + tries, 65536)):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is free
            try:
                s.bind((host, candidate))
            except OSError:
                continue
            return candidate
    raise RuntimeError(f"no free port for MLflow in {port}–{port + tries - 1}: set MEMSWEEP_MLFLOW_PORT")
