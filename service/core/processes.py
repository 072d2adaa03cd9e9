"""Processes of this host, as the service tells them apart: by pid *and* start time (a pid is reused),
alive only while not a zombie; and the environment a child inherits.

- `started` / `alive`: what `/proc` says of a pid (`service.study.claim` names a study's owner by both;
  the embedded Ray's record and the local MLflow server's pid file are checked with them);
- `marked_environment` / `child_environment`: a variable set in this process's environment only for the
  processes one call starts (the embedded Ray's mark: `service.study.nodes`), and never inherited by a
  process another thread starts meanwhile (a local MLflow server would have carried the mark, and been
  killed with the Ray of a driver that died); `hidden_environment`: variables left out of the
  environment of the processes one call starts (the server's secrets, out of its embedded Ray's);
  `keep_from_children`: variables set for this process and its Ray alone (the token made for its
  embedded Ray), which no server it starts inherits;
- `ray_workers` / `descends_from`: the Ray workers training units under a process (the device script
  and the tests kill one mid-unit, as a lost node would).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from trainers.environ import environ_lock as _environ_lock  # one lock for os.environ, the trainers' too


def started(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, from /proc), or None: no such process, or
    no /proc (then only a lease tells)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; the command name may hold spaces and ")"


def alive(pid: int, since: str | None = None) -> bool:
    """Whether process `pid` runs (another user's counts), and, given `since` (its `started`), is still
    the process that started then, not a later one the pid was given to. A zombie (exited, not yet
    reaped by its parent: a server this process started and no longer waits on) has ended, although
    `kill(pid, 0)` still finds it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:  # no /proc: kill(pid, 0) is all there is to go on
        return since is None
    return fields[0] != "Z" and (since is None or fields[19] == since)


_kept: set[str] = set()  # `keep_from_children`'s


@contextlib.contextmanager
def marked_environment(name: str, value: str) -> Iterator[None]:
    """`name=value` in this process's environment for the processes started inside the block (by this
    thread); `child_environment`, in another thread meanwhile, waits for the block to end."""
    with _environ_lock:
        os.environ[name] = value
        try:
            yield
        finally:
            del os.environ[name]


@contextlib.contextmanager
def hidden_environment(*names: str) -> Iterator[None]:
    """These variables (in any case: the settings read them so) out of this process's environment for
    the processes started inside the block (by this thread), and back after it; `child_environment`,
    in another thread meanwhile, waits for the block to end."""
    wanted = {name.upper() for name in names}
    with _environ_lock:
        hidden = {k: os.environ.pop(k) for k in list(os.environ) if k.upper() in wanted}
        try:
            yield
        finally:
            os.environ.update(hidden)


def keep_from_children(*names: str) -> None:
    """Variables of this process's environment that `child_environment` leaves out: set for this
    process and the Ray it starts (which inherits `os.environ`), such as a token made for its embedded
    Ray; a server it starts (a local MLflow, `memsweep serve`) neither needs nor gets them."""
    with _environ_lock:
        _kept.update(names)


def child_environment(**extra: str) -> dict[str, str]:
    """This process's environment, as a long-lived child it starts (a server) should inherit: without
    a `marked_environment` variable or one kept from children (`keep_from_children`); `extra` added."""
    with _environ_lock:
        return {**{k: v for k, v in os.environ.items() if k not in _kept}, **extra}


def ray_workers(root: int) -> list[int]:
    """The pids of the Ray worker processes training a unit under process `root` (a server or a test, whose
    embedded Ray's raylet forks them: another Ray on the machine, a test's beside this one, is not
    ours to kill): Tune's function trainable's actor while it runs (`ray::ImplicitFunc.train`), not one
    still in `ray::ImplicitFunc.__init__` (placed and importing; killed there, its unit dies before it
    starts and no trial runs twice)."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            title = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if title.startswith("ray::ImplicitFunc.train") and descends_from(int(proc.name), root):
            pids.append(int(proc.name))
    return sorted(pids)


def descends_from(pid: int, root: int) -> bool:
    """Whether process `pid` has `root` among its ancestors."""
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rpartition(")")[2].split()[1])  # the parent, after the (command)
        if pid == root:
            return True
    return False
