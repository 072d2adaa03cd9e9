"""A real Ray cluster for a test: a head started with `ray start`, and more nodes joined to it, each with
an environment of its own (what it has installed: `PYTHONPATH`), stopped with exactly its processes."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from service.cli.servers import free_port


@contextlib.contextmanager
def ray_head(
    tmp_path: Path, *flags: str, environ: Mapping[str, str] | None = None
) -> Iterator[tuple[dict[str, str], int]]:
    """A Ray cluster's head started with `ray start` (and `flags`: --num-gpus=1 declares a GPU; `environ`:
    its environment, default this process's), token authentication on as in compose; (the environment
    that reaches it, its port)."""
    ray_bin = Path(sys.executable).with_name("ray")
    port = free_port()
    env = {
        **(os.environ if environ is None else environ),
        "HOME": str(tmp_path),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
    }
    # --block keeps the head's processes in this process group, so the test can stop exactly this
    # cluster (`ray stop` would stop every Ray on the machine, the test session's own included).
    head = subprocess.Popen([str(ray_bin), "start", "--head", "--block", f"--port={port}", *flags,
                             "--disable-usage-stats", "--include-dashboard=false"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert head.poll() is None, head.stdout.read()[-3000:] if head.stdout else "ray start exited"
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(1)
        yield env, port
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=60)


@contextlib.contextmanager
def ray_node(env: Mapping[str, str], port: int, *flags: str) -> Iterator[None]:
    """Another node joined to the head at `port` (with `env`: the head's token, and what this node has)."""
    ray_bin = Path(sys.executable).with_name("ray")
    node = subprocess.Popen([str(ray_bin), "start", "--block", f"--address=127.0.0.1:{port}", *flags,
                             "--disable-usage-stats"], env=dict(env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # joined once the cluster lists a second node
            assert node.poll() is None, node.stdout.read()[-3000:] if node.stdout else "ray start exited"
            status = subprocess.run([str(ray_bin), "status", f"--address=127.0.0.1:{port}"], env=dict(env),
                                    capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
            if status.stdout.count(" node_") >= 2:
                break
            time.sleep(1)
        yield
    finally:
        os.killpg(node.pid, signal.SIGTERM)
        node.wait(timeout=60)
