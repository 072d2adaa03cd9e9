"""Processes as the service tells them apart (`service.core.processes`): a zombie has ended, a reused
pid is not the process it was, and a variable set for the embedded Ray's processes only never reaches a
server another thread starts meanwhile."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

from service.core import processes
from service.tracking.server import stop_pid


def wait_for_zombie(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.05)


def test_a_zombie_and_a_reused_pid_are_not_alive():
    me = processes.started(os.getpid())
    assert me is not None and processes.alive(os.getpid(), me) and processes.alive(os.getpid())
    assert not processes.alive(os.getpid(), str(int(me) + 1))  # the pid, given to a later process
    child = subprocess.Popen(["true"])
    try:
        wait_for_zombie(child.pid)
        os.kill(child.pid, 0)  # what `alive` must not go by alone: a zombie still answers it
        assert not processes.alive(child.pid)
    finally:
        assert child.wait(timeout=10) == 0  # left to its owner to reap: `alive` took nothing from it
    assert not processes.alive(child.pid) and processes.started(child.pid) is None


def test_stopping_a_server_this_process_started_and_let_go_does_not_wait_on_its_zombie():
    """A home's MLflow server found hung is stopped by its pid (the `Popen` that started it is long
    gone): it exits on SIGTERM, and a zombie counted as alive made the stop wait out both its timeouts,
    the home's lock held."""
    server = subprocess.Popen(["sleep", "300"], start_new_session=True)
    began = time.monotonic()
    stop_pid(server.pid, timeout=20)
    assert time.monotonic() - began < 10
    assert server.wait(timeout=10) < 0  # ended by the signal


def test_a_servers_environment_never_holds_the_mark_of_a_ray_starting_meanwhile():
    inside, release = threading.Event(), threading.Event()

    def start_ray() -> None:
        with processes.marked_environment("MEMSWEEP_TEST_MARK", "a-ray"):
            inside.set()
            release.wait(10)
            assert os.environ["MEMSWEEP_TEST_MARK"] == "a-ray"  # what Ray's processes inherit

    ray = threading.Thread(target=start_ray)
    ray.start()
    assert inside.wait(10)
    copied: list[dict[str, str]] = []
    server = threading.Thread(target=lambda: copied.append(processes.child_environment(EXTRA="1")))
    server.start()
    server.join(0.5)
    assert server.is_alive() and not copied  # it waits for the start to end
    release.set()
    ray.join(10)
    server.join(10)
    (env,) = copied
    assert "MEMSWEEP_TEST_MARK" not in env and "MEMSWEEP_TEST_MARK" not in os.environ
    assert env["EXTRA"] == "1" and env["PATH"] == os.environ["PATH"]
