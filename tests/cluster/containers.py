"""A compose container as a process tree on this machine, and PostgreSQL as the postgres image runs it.

Each container is its own PID namespace (`unshare --pid --fork --mount-proc`), as in Docker: its
processes see only each other (Ray finds a node's raylet with `ps`, so a driver finds only its own
container's), and when its first process dies the kernel kills everything left inside, daemons
included — no orphan, whatever the service forked. The namespace's parent is bound to this test
process (`setpriv --pdeathsig KILL`, `unshare --kill-child`): if pytest itself dies, so do they.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tests.cluster.compose import Compose, Health, Host

INSTALL_HINT = (
    "install Debian's postgresql package: `make postgres` (as root), or `apt-get install postgresql`"
)


def namespace() -> list[str]:
    """The prefix that starts a command as a container: its own PID (and mount) namespace."""
    ns = ["setpriv", "--pdeathsig", "KILL", "unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
    if os.geteuid() != 0:  # an unprivileged user needs a user namespace for the others
        ns.append("--map-current-user")
    return [*ns, "--"]


def tool_path() -> str:
    """PATH of every process: this interpreter's environment first (ray, mlflow, memsweep), then
    PostgreSQL's programs, then the system's."""
    dirs = [str(Path(sys.executable).parent)]
    with contextlib.suppress(RuntimeError):
        dirs.append(str(postgres_bindir()))
    return os.pathsep.join(
        [*dirs, "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
    )


class Container:
    """One container of `host`: `argv` in its own PID namespace, logged to `<root>/logs/<name>.log`,
    healthy when compose's healthcheck command succeeds."""

    stop_signal = signal.SIGTERM

    def __init__(
        self,
        host: Host,
        argv: Sequence[str],
        env: dict[str, str],
        health: Health | None,
        log: Path,
        prefix: Sequence[str] = (),
    ):
        self.host, self.name = host, host.name
        self.argv, self.env, self.health, self.log = list(argv), env, health, log
        self.prefix = list(prefix)  # between the namespace and the command: e.g. a user switch
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid_namespace: str | None = None

    # ----- life -------------------------------------------------------------------------------------
    def launch(self) -> None:
        """Start the container's command, without waiting for it to be healthy."""
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        cwd = self.host.root / "work"
        for d in (cwd, Path(self.env["HOME"]), Path(self.env["TMPDIR"])):
            d.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            log.write(f"\n==== {time.strftime('%H:%M:%S')} start: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [*namespace(), *self.prefix, *self.argv], env=self.env, cwd=cwd,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        self.pid_namespace = None
        deadline = time.monotonic() + 10
        while self.pid_namespace is None and self.running and time.monotonic() < deadline:
            with contextlib.suppress(OSError, TypeError):  # until unshare has forked the first process
                self.pid_namespace = os.readlink(f"/proc/{self.main_pid}/ns/pid")
            time.sleep(0.01)

    def start(self) -> Container:
        """Start it and wait until its healthcheck passes (compose's `condition: service_healthy`)."""
        self.launch()
        self.wait_healthy()
        return self

    def processes(self) -> list[int]:
        """Every process of this container (of its PID namespace, as this machine numbers them);
        none once it is stopped or killed."""
        if self.pid_namespace is None:
            return []
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, IndexError):
                    zombie = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
                    if not zombie and os.readlink(entry / "ns" / "pid") == self.pid_namespace:
                        pids.append(int(entry.name))
        return pids

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def main_pid(self) -> int | None:
        """The container's first process (PID 1 inside it), as this machine numbers it."""
        if not self.running:
            return None
        assert self.proc is not None
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int(Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()[0])
        return None

    def healthy(self) -> bool:
        if self.health is None:
            return self.running
        try:
            check = subprocess.run(
                self.health.argv, env=self.health_env(), capture_output=True, timeout=self.health.timeout
            )
        except subprocess.TimeoutExpired:
            return False
        return check.returncode == 0

    def health_env(self) -> dict[str, str]:
        return self.env

    def wait_healthy(self, timeout: float | None = None) -> None:
        """Poll the healthcheck (every 2 s at most, not compose's interval) until it passes, within
        compose's own patience (start period + retries × (interval + timeout))."""
        patience = timeout or (self.health.deadline if self.health else 30)
        deadline = time.monotonic() + patience
        pause = min(2.0, self.health.interval) if self.health else 0.5
        while True:
            if not self.running:
                raise RuntimeError(f"{self.name} exited ({self.exit_code()}):\n{self.tail()}")
            if self.healthy():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} is not healthy after {patience:g} s:\n{self.tail()}")
            time.sleep(pause)

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal(self, sig: int) -> None:
        """Send `sig` to the container's first process (what `docker kill --signal` does)."""
        pid = self.main_pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def stop(self, grace: float = 30.0) -> None:
        """`docker stop`: the stop signal to the first process, `grace` seconds, then SIGKILL to all.
        A first process without a handler ignores it (it is PID 1 of its namespace): the rest of the
        container is sent SIGTERM first, so a process that only waits for its children ends too."""
        if not self.running:
            self.kill()
            return
        assert self.proc is not None
        self.signal(self.stop_signal)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace)
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        self.kill()

    def kill(self, timeout: float = 30.0) -> None:
        """SIGKILL to the whole container: its process group, and whatever left the group (Ray puts
        each of its worker processes in a group of its own), which the kernel kills with the
        namespace's first process; returns once none is left."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=timeout)
        deadline = time.monotonic() + timeout
        while left := self.processes():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: processes {left} outlived their container")
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def restart(self) -> Container:
        self.stop()
        return self.start()

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


# ----- PostgreSQL ------------------------------------------------------------------------------------


def postgres_bindir() -> Path:
    """Where PostgreSQL's server programs are: Debian's /usr/lib/postgresql/<version>/bin (newest),
    else the directory of an `initdb` on PATH."""
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), reverse=True
    )
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for d in candidates:
        if (d / "initdb").exists() and (d / "postgres").exists():
            return d
    raise RuntimeError(f"PostgreSQL's server programs (initdb, postgres) are not installed: {INSTALL_HINT}")


class Postgres(Container):
    """The `postgres` service as the official image runs it: on an empty data directory `initdb`
    with POSTGRES_USER as superuser and POSTGRES_PASSWORD, password (scram) logins from any host,
    the POSTGRES_DB database and the scripts mounted in /docker-entrypoint-initdb.d, in name order;
    then the server. PostgreSQL refuses to run as root: as root it runs as the `postgres` system user
    (Debian's package creates it) in a directory of its own; as anyone else, as that user."""

    stop_signal = signal.SIGINT  # the image's STOPSIGNAL: a fast shutdown

    def __init__(self, compose: Compose, host: Host, env: dict[str, str], log: Path):
        self.bindir = postgres_bindir()
        self.settings = compose.environment(host)
        self.init_scripts = [
            path
            for target, path in sorted(host.mounts.items())
            if target.startswith("/docker-entrypoint-initdb.d/")
        ]
        self.user = pwd.getpwuid(os.geteuid()).pw_name
        prefix: list[str] = []
        if os.geteuid() == 0:
            try:
                self.user = pwd.getpwnam("postgres").pw_name
            except KeyError:
                raise RuntimeError(
                    f"no `postgres` system user to run PostgreSQL as: {INSTALL_HINT}"
                ) from None
            prefix = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"]
        self.port = host.ports[5432]
        self.data = host.mounts["/var/lib/postgresql/data"]
        self.sockets = host.root / "run"
        argv = [
            str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port), "-h", host.ip,
            "-k", str(self.sockets), "-c", "fsync=off",  # a throwaway cluster: no fsync
        ]  # fmt: skip
        super().__init__(host, argv, env, compose.health(host), log, prefix)

    def health_env(self) -> dict[str, str]:
        return {**self.env, **self.client_env(self.settings["POSTGRES_DB"])}

    def client_env(self, database: str) -> dict[str, str]:
        """libpq's environment for a client of this server (the image's `localhost:5432`)."""
        return {
            "PGHOST": self.host.ip, "PGPORT": str(self.port), "PGUSER": self.settings["POSTGRES_USER"],
            "PGPASSWORD": self.settings["POSTGRES_PASSWORD"], "PGDATABASE": database,
        }  # fmt: skip

    def _as_owner(self, *argv: str) -> None:
        subprocess.run([*self.prefix, *argv], check=True, capture_output=True, env=self.env, cwd="/")

    def _initdb(self) -> None:
        for d in (self.data, self.sockets, self.host.root / "work"):
            d.mkdir(parents=True, exist_ok=True)
        pwfile = self.host.root / "pwfile"
        pwfile.write_text(self.settings["POSTGRES_PASSWORD"] + "\n")
        owner = pwd.getpwnam(self.user)
        for path in (self.host.root, self.data, self.sockets, pwfile):
            os.chown(path, owner.pw_uid, owner.pw_gid)
        self.host.root.chmod(0o755)  # the owner of the data directory must reach it
        try:
            self._as_owner(
                str(self.bindir / "initdb"), "-D", str(self.data), "-U", self.settings["POSTGRES_USER"],
                f"--pwfile={pwfile}", "--auth-local=trust", "--auth-host=scram-sha-256",
                "-E", "UTF8", "--locale=C", "--no-sync",
            )  # fmt: skip
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(f"initdb failed:\n{exc.stdout.decode()}{exc.stderr.decode()}") from None
        finally:
            pwfile.unlink()
        with open(self.data / "pg_hba.conf", "a") as hba:
            hba.write("host all all all scram-sha-256\n")  # as the image: password logins from anywhere

    def psql(self, database: str, *args: str) -> str:
        """Run psql as POSTGRES_USER on `database` over TCP with the password; its output."""
        done = subprocess.run(
            [str(self.bindir / "psql"), "-v", "ON_ERROR_STOP=1", "--no-psqlrc", "-X", "-qAt", *args],
            env={**self.env, **self.client_env(database)}, capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"psql {' '.join(args)} on {database}: {done.stderr}")
        return done.stdout

    def start(self) -> Postgres:
        fresh = not (self.data / "PG_VERSION").exists()
        if fresh:
            self._initdb()
        self.launch()
        self.wait_healthy()
        if fresh:  # the image's entrypoint: POSTGRES_DB, then /docker-entrypoint-initdb.d in name order
            database = self.settings["POSTGRES_DB"]
            if database != "postgres":
                self.psql("postgres", "-c", f'CREATE DATABASE "{database}"')
            for script in self.init_scripts:
                if script.suffix != ".sql":
                    raise RuntimeError(f"{script}: only .sql init scripts are supported here")
                self.psql(database, "-f", str(script))
        return self
