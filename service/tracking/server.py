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
import logging
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx

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
    logfile = open(home / "mlflow-server.log", "ab")  # noqa: SIM115 — handed to the child process
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
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen(
        cmd, stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True, cwd=home, env=env
    )
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if server_healthy(uri):
            (home / "mlflow-server.pid").write_text(str(proc.pid))
            (home / "mlflow-server.uri").write_text(uri)
            return uri, proc
        if proc.poll() is not None:
            raise RuntimeError(
                f"mlflow server exited with {proc.returncode}; see {home / 'mlflow-server.log'}"
            )
        time.sleep(0.5)
    stop_mlflow_server(proc)
    raise RuntimeError(
        f"mlflow server did not answer /health within {wait:.0f} s; see {home / 'mlflow-server.log'}"
    )


def stop_mlflow_server(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Stop a server from `start_mlflow_server` and its uvicorn workers (its whole process group)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout)


def ensure_mlflow_server(tracking_uri: str | None, home: Path, port: int) -> str:
    """The configured tracking URI, or this home's local server on loopback: the one it started, when
    that still runs and answers, else a new one, on `port` unless something else holds it."""
    if tracking_uri:
        return tracking_uri
    folder = home / "mlflow"
    own = running_server(folder)
    if own is not None:
        return own
    wanted = port
    port = next_free_port(port)
    if port != wanted:
        log.warning(
            "MLflow: port %d is taken (another home's MLflow server, or another program); this home's "
            "server (store %s) starts on port %d. Set MEMSWEEP_MLFLOW_PORT to choose its port",
            wanted,
            folder,
            port,
        )
    uri, _ = start_mlflow_server(folder, port)
    return uri


def running_server(folder: Path) -> str | None:
    """The URI of the server `start_mlflow_server` started on this store (`folder`), when its process
    still runs it and it answers; None otherwise. Its process is told by its command line where
    /proc has one (a pid reused by another program is not it)."""
    try:
        pid = int((folder / "mlflow-server.pid").read_text())
        uri = (folder / "mlflow-server.uri").read_text().strip()
    except (OSError, ValueError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        cmdline = None
    if cmdline is not None and f"sqlite:///{folder / 'mlflow.db'}".encode() not in cmdline:
        return None
    if cmdline is None and not _alive(pid):
        return None
    return uri if server_healthy(uri) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
