"""Processes on loopback: a memsweep server as a child process (`LocalServer`), and free ports.

Used by `memsweep demo`, the tests that start the real server under uvicorn, and the benchmarks.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from service.cli.console import Failed
from service.core import processes


class LocalServer:
    """`python -m service.cli.commands serve` as a child in its own process group (its embedded Ray included)."""

    def __init__(self, port: int, log: Path, env: dict[str, str] | None = None, host: str = "127.0.0.1"):
        self.port, self.log = port, log
        self.url = f"http://{host}:{port}"
        self.env = processes.child_environment() if env is None else dict(env)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120.0) -> LocalServer:
        """Start it and wait until /health answers; a server that exits early raises with its log."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-P", "-m", "service.cli.commands", "serve", "--port", str(self.port)],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited (code {self.proc.returncode}):\n{self.tail()}")
            if answers(self.url):
                return self
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"the server did not answer /health within {timeout:g} s:\n{self.tail()}")

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL to the whole group: a crash, as far as the ledger can tell."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, timeout: float = 90.0) -> None:
        """SIGTERM (a graceful stop: running studies stay resumable, Ray shuts down), then clean up."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout)
        with contextlib.suppress(ProcessLookupError):  # whatever is left in the group
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


def answers(url: str) -> bool:
    """Whether a memsweep server answers /health at `url`."""
    try:
        r = httpx.get(f"{url}/health", timeout=2)
        return r.status_code == 200 and r.json().get("status") == "ok"
    except (httpx.HTTPError, ValueError):
        return False


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port), for `memsweep serve` to hand uvicorn. Bound before the app starts:
    uvicorn binds after the app's start-up, so a second server on a taken port migrated the ledger and
    started Ray before saying "address already in use" (20 s here) and shutting them down again."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a restart reuses the port
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        taken = " (another memsweep server?)" if e.errno == errno.EADDRINUSE else ""
        # exit 1: this machine's state (a port another process holds, an address it lacks), no bad flag
        raise Failed(
            f"error: cannot listen on {host}:{port}: {e.strerror or e}{taken}; give another --port "
            "(or MEMSWEEP_PORT), or --host (MEMSWEEP_HOST) an address of this machine"
        ) from None
    return sock


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
