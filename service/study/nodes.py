"""The Ray a study runs on, and its nodes: started embedded (this machine) or joined (a cluster), what
a node can place, and how much memory a unit of a study may use there (which sizes its bundles).

- `embedded` says which, from the settings: the one place that decides;
- `ensure_ray` starts the embedded Ray, or joins the cluster (`MEMSWEEP_RAY_ADDRESS` / `RAY_ADDRESS`),
  on a thread that lives as long as the process (`on_ray_thread`); `shutdown_ray` shuts it down and
  removes its record; `reap_embedded_ray` clears what a crashed driver's embedded Ray left running;
- `unplaceable` says why no node can take a unit's resources; `embedded_cpus` / `usable_cpus`, the CPUs
  an embedded Ray offers (this process's affinity, at most its cgroup's quota);
- `unit_memory` measures a unit's share of a node's memory (`NodeMemory` keeps it a while);
- `node_plugins` asks every node which plugins it has installed.

Only this module and the Ray Tune adapter (`service.study.ray_tune`, the engine's executor) use Ray's
API; the rest of the service asks the executor (`tests/test_imports.py` holds it so).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import queue
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from service.core import processes
from service.core.settings import SECRET_VARIABLES, Settings
from trainers.environ import environ_lock

log = logging.getLogger(__name__)

T = TypeVar("T")


def embedded(settings: Settings) -> bool:
    """Whether studies run on an embedded Ray (this machine), not a cluster."""
    return not (settings.ray_address or os.environ.get("RAY_ADDRESS"))


def ensure_ray(settings: Settings) -> None:
    """Start the embedded Ray, or join the configured cluster, once per process.

    Ray asks the kernel to SIGKILL its GCS and raylet when the *thread* that started them ends
    (`PR_SET_PDEATHSIG`), and its driver exits a minute after losing them: a Ray first needed in a
    short-lived thread (a request's, a study's, a calibration's) would die with it and take the process
    along. So it is started on a thread that lives as long as the process: the main thread, when that
    asks, else one kept for it (`on_ray_thread`); one start at a time (`_starting`), which the ones
    waiting then find up."""
    if threading.current_thread() is threading.main_thread():
        _ensure_ray(settings)
    else:
        on_ray_thread(lambda: _ensure_ray(settings))


_starting = threading.Lock()


def _ensure_ray(settings: Settings) -> None:
    with _starting:
        _start_ray(settings)


class _Unsaid(logging.Filter):
    """Drops a logger's records that begin with `said` (what memsweep says itself, or need not say)."""

    def __init__(self, said: str) -> None:
        super().__init__()
        self.said = said

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.said)


def _unsay(logger: str, said: str) -> None:
    target = logging.getLogger(logger)
    if not any(isinstance(f, _Unsaid) and f.said == said for f in target.filters):
        target.addFilter(_Unsaid(said))


def prepare_ray_process(settings: Settings) -> None:
    """What this process's Ray must be started with, set before anything imports Ray (it reads both
    when first imported): every entry point that may start Ray calls it (`memsweep`'s main, the app,
    an Engine before it imports Tune, `_start_ray`), so none depends on another having run first.

    - Ray's C++ failure-signal handler (absl) arms a 3-second alarm on SIGTERM that then kills the
      process: a server stopped gracefully (docker stop, Ctrl-C) died mid-shutdown and left its
      studies "running". Off here; the workers keep it (crash traces).
    - Token authentication for the embedded Ray, with a token made for this process: its GCS, raylet
      and workers listen on every interface (Ray 2.60 binds its gRPC servers to 0.0.0.0 and has no
      setting for it; a node address of 127.0.0.1 is replaced by the host's), so without a token
      anyone who reaches this machine could join it and run code. A cluster (MEMSWEEP_RAY_ADDRESS,
      RAY_ADDRESS) keeps its own settings, and an explicit RAY_AUTH_MODE wins. What is made here stays
      with this process and its Ray (`processes.keep_from_children`)."""
    if "ray" in sys.modules:  # too late: Ray read both at import (`_start_ray` warns where it matters)
        return
    with environ_lock:
        os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
        if not embedded(settings):
            return
        made = [name for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN") if name not in os.environ]
        os.environ.setdefault("RAY_AUTH_MODE", "token")
        if os.environ["RAY_AUTH_MODE"] == "token":
            os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
        # made for this process's Ray: no server it starts inherits them (a local MLflow had the token, and
        # a `memsweep serve` started to join a cluster would have asked it for a token it has not)
        processes.keep_from_children(*made)


def _start_ray(settings: Settings) -> None:
    # Tune's console tables and its per-trial CSV/JSON/TensorBoard loggers: the ledger and MLflow
    # record everything, and the loggers cost time on every short trial.
    with environ_lock:
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
        os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
        os.environ.setdefault("TUNE_MAX_PENDING_TRIALS_PG", "4")
        # A unit whose worker or node died is memsweep's to handle (its members run again, or end with the
        # reason): Tune logged the whole traceback as an ERROR, and "Trials did not complete" at the run's
        # end, for a fault that lost nothing; `BookCallback.on_trial_error` says it in one line instead
        os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")
    # with those loggers off, Tune's end-of-run analysis warns once per trial that it found no result files
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    # nor does anyone read Tune's experiment state (the ledger resumes a study): not its path at each end
    logging.getLogger("ray.tune.tune").setLevel(logging.WARNING)
    # Ray started off the main thread (`on_ray_thread`, on purpose) says that it set no SIGTERM handler:
    # memsweep's processes handle their signals themselves
    _unsay("ray._private.worker", "SIGTERM handler is not set")
    _unsay("ray.tune.tune", "Trials did not complete")  # (said once, `TUNE_PRINT_ALL_TRIAL_ERRORS` above)
    prepare_ray_process(settings)
    if embedded(settings) and "RAY_AUTH_MODE" not in os.environ:  # Ray came in before memsweep could
        log.warning(
            "the embedded Ray starts with Ray's own token (~/.ray/auth_token, which every Ray this "
            "user starts shares), not one made for this process: Ray was imported before memsweep "
            "could set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN; build the Engine, or start this process "
            "through `memsweep` or `service.api.app.create_app`, before importing Ray"
        )
    import ray

    if ray.is_initialized():
        return
    # the workers keep Ray's failure-signal handler (crash traces), which `memsweep`'s own processes
    # turn off (service.cli.commands.main: it would kill a server 3 s into a graceful shutdown)
    workers = {"env_vars": {"RAY_DISABLE_FAILURE_SIGNAL_HANDLER": "0"}}
    if not embedded(settings):
        address = settings.ray_address or os.environ["RAY_ADDRESS"]
        why = unreachable_cluster(address)
        if why is not None:  # Ray would retry for many minutes, saying only that it could not connect
            raise ConnectionError(f"cannot join the Ray cluster at {address}: {why}")
        try:
            ray.init(address=address, log_to_driver=False, runtime_env=workers)
        except Exception as exc:  # Ray says only that it failed: a wrong token reads the same
            said = str(exc) if isinstance(exc, ConnectionError) else f"{type(exc).__name__}: {exc}"
            raise ConnectionError(f"{said}. {join_hint(address)}") from exc
    else:
        reap_embedded_ray(settings.home)
        # every process of this Ray inherits the mark (gcs, raylet, agents, workers): what a crash of
        # this driver leaves behind is found by it, not by names (Ray's agents rename themselves)
        # (only Ray's: a server this process starts, meanwhile or later, never carries it:
        # `processes.child_environment`); and none inherits the server's secrets: a worker runs a
        # trial's code, a plugin's among it (the settings have read them already)
        mark = f"{os.getpid()}-{secrets.token_hex(8)}"
        with (
            processes.marked_environment(EMBEDDED_RAY_MARK, mark),
            processes.hidden_environment(*SECRET_VARIABLES),
        ):
            # address="local": always a new embedded cluster, never one that `ray start` left running;
            # Ray's own INFO lines ("Started a local Ray instance.") are not the user's: warnings only
            ray.init(
                address="local", num_cpus=embedded_cpus(settings), include_dashboard=False,
                log_to_driver=False, runtime_env=workers, logging_level=logging.WARNING,
            )  # fmt: skip
        record = embedded_ray_record(settings.home, os.getpid())
        record.parent.mkdir(parents=True, exist_ok=True)
        driver = {"pid": os.getpid(), "started": processes.started(os.getpid()), "mark": mark}
        record.write_text(json.dumps(driver))


def shutdown_ray(settings: Settings) -> None:
    """Shut down this process's Ray (an embedded one stops; a cluster is left), and remove the record
    of the embedded Ray this process started on the settings' home: a graceful stop leaves nothing for
    `reap_embedded_ray` (it had left `embedded-ray/<pid>.json` behind until the next start reaped it)."""
    import ray

    ray.shutdown()
    embedded_ray_record(settings.home, os.getpid()).unlink(missing_ok=True)


#: seconds a cluster's head has to accept a connection before joining it is given up
JOIN_TIMEOUT = 10.0


def unreachable_cluster(address: str, timeout: float = JOIN_TIMEOUT) -> str | None:
    """Why no Ray cluster can be joined at `address` (the head's GCS, host:port), before Ray tries:
    joining an address where nothing listens, Ray retried for over ten minutes, logging only its own
    connection attempts, while the server said "starting" and held its studies; None when something
    accepts a connection there (Ray then says whether it is a cluster that takes this process).
    "auto" (Ray finds a cluster started on this machine) is Ray's to resolve."""
    if address == "auto":
        return None
    if address.startswith("ray://"):
        return (
            "a ray:// address is Ray Client's, which memsweep does not use (its drivers join the cluster "
            "itself): give the head's address, host:port, as `ray start --head --port 6379` prints it"
        )
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")  # an IPv6 address, [::1]:6379
    if not sep or not host or not port.isdigit():
        return f"{address!r} is not host:port (the head's address, e.g. head-node:6379)"
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        return (
            f"nothing accepts a connection there within {timeout:g} s ({exc.strerror or type(exc).__name__}); "
            f"check that the cluster's head runs there (`ray status --address {address}`) and that this "
            "machine reaches it (MEMSWEEP_RAY_ADDRESS, or RAY_ADDRESS, names it)"
        )
    return None


def join_hint(address: str) -> str:
    """What to check when joining the Ray cluster at `address` failed."""
    token = (
        "this process has its token (RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH; RAY_AUTH_MODE=token is set)"
        if os.environ.get("RAY_AUTH_MODE") == "token"
        else "this process has RAY_AUTH_MODE=token and the cluster's token (RAY_AUTH_TOKEN or "
        "RAY_AUTH_TOKEN_PATH): without them Ray refuses it and says only that it could not connect"
    )
    return (
        f"Check that the cluster's head runs at {address} (`ray status --address {address}`), reachable "
        f"from here, and, if the cluster was started with token authentication, that {token}"
    )


#: a home's embedded Rays, one record each (a server and a `memsweep plan` or `run` beside it start one
#: each): its driver's pid, and the mark its processes carry in their environment
EMBEDDED_RAYS = "embedded-ray"
EMBEDDED_RAY = "embedded-ray.json"  # the one record of earlier versions, reaped as the others
EMBEDDED_RAY_MARK = "MEMSWEEP_EMBEDDED_RAY"


def embedded_ray_record(home: Path, pid: int) -> Path:
    """Where the embedded Ray that driver `pid` started on `home` is recorded."""
    return home / EMBEDDED_RAYS / f"{pid}.json"


RAY_OWNER = "ray-owner"
_calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] | None = None
_calls_lock = threading.Lock()


def on_ray_thread(fn: Callable[[], T]) -> T:
    """`fn()` on the thread that starts Ray for the threads that do not live as long as the process: a
    daemon that waits for calls until the process ends (`ensure_ray`); its result, or its exception."""
    global _calls
    if threading.current_thread().name == RAY_OWNER:  # already on it: waiting on itself would hang
        return fn()
    with _calls_lock:
        if _calls is None:
            _calls = queue.SimpleQueue()
            threading.Thread(target=_serve_calls, args=(_calls,), name=RAY_OWNER, daemon=True).start()
    done: Future[T] = Future()
    _calls.put((fn, done))
    return done.result()


def _serve_calls(calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]]) -> None:
    while True:
        fn, done = calls.get()
        if done.set_running_or_notify_cancel():
            try:
                done.set_result(fn())
            except BaseException as exc:  # handed to the caller, who raises it
                done.set_exception(exc)


def reap_embedded_ray(home: Path) -> list[int]:
    """Kill what each embedded Ray of `home` left running when its driver died without shutting it
    down (a SIGKILLed server leaves Ray's DashboardAgent and RuntimeEnvAgent behind, and they ignore
    SIGTERM); their pids. The Ray of a driver that still runs is left alone (a `memsweep plan` or
    `run` beside a server on the same home), and so is its record: each driver writes its own."""
    records = [home / EMBEDDED_RAY, *sorted((home / EMBEDDED_RAYS).glob("*.json"))]
    reaped: list[int] = []
    for path in records:
        try:
            record = json.loads(path.read_text())
            owner, mark, since = int(record["pid"]), str(record["mark"]), record.get("started")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if owner != os.getpid() and processes.alive(owner, since):  # its driver, not a later pid's holder
            continue
        killed = _kill_marked(mark)
        if killed:
            log.warning(
                "killed %d processes of an embedded Ray whose driver (pid %d) died", len(killed), owner
            )
        reaped += killed
        path.unlink(missing_ok=True)
    return reaped


def _kill_marked(mark: str) -> list[int]:
    """SIGKILL every process (but this one) whose environment carries the embedded Ray's `mark`."""
    needle = f"{EMBEDDED_RAY_MARK}={mark}".encode() + b"\0"
    killed = []
    for proc in Path("/proc").glob("[0-9]*"):
        pid = int(proc.name)
        with contextlib.suppress(OSError):
            if pid != os.getpid() and needle in (proc / "environ").read_bytes():
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def unplaceable(resources: Mapping[str, float], embedded_in: Settings | None = None) -> str | None:
    """Why no node of the (running) Ray cluster can take a Ray trial asking these resources, naming
    what the nodes have; None when one can. A request no node can satisfy would wait forever.
    `embedded_in`: the settings of the embedded Ray this is, said as this machine's (`unplaceable_here`),
    not as a cluster to grow."""
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
    wanted = {"CPU": float(resources.get("cpu", 0.0)), "GPU": float(resources.get("gpu", 0.0))}
    if any(all(node.get(k, 0.0) >= v for k, v in wanted.items()) for node in nodes):
        return None
    if embedded_in is not None:
        cpus, gpus = (sum(node.get(k, 0.0) for node in nodes) for k in ("CPU", "GPU"))
        return this_machine_cannot(embedded_in, wanted, cpus, gpus)
    have = ", ".join(
        sorted({f"{node.get('CPU', 0.0):g} CPUs and {node.get('GPU', 0.0):g} GPUs" for node in nodes})
    )
    return (
        f"no node of the Ray cluster can run a trial asking {wanted['CPU']:g} CPUs and {wanted['GPU']:g} GPUs "
        f"(its {len(nodes)} nodes have: {have or 'nothing'}); ask for less in `resources`, or add a node that "
        "has them (`ray start --address … --num-gpus …`)"
    )


def embedded_resources(settings: Settings) -> tuple[float, float]:
    """(CPUs, GPUs) an embedded Ray offers: `embedded_cpus`, and the GPUs torch sees (Ray finds the
    same ones)."""
    import torch

    return float(embedded_cpus(settings)), float(torch.cuda.device_count())


def embedded_cpus(settings: Settings) -> int:
    """The CPUs the embedded Ray is started with: MEMSWEEP_RAY_NUM_CPUS, else those this process may
    use (`usable_cpus`)."""
    return settings.ray_num_cpus if settings.ray_num_cpus is not None else usable_cpus()


#: where the kernel's cgroup filesystems are mounted
CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable_cpus(cgroup_root: Path = CGROUP_ROOT) -> int:
    """The CPUs this process may use: those its affinity allows (a container's cpuset among them), at
    most its cgroup's CPU quota (`cgroup_cpus`) cut to whole CPUs, at least one. Ray's own count
    (2.60) reads the quota and a cgroup v1 cpuset but not the affinity: under `taskset`, or a v2 cpuset
    without a quota, it counted every CPU of the host."""
    cpus = len(os.sched_getaffinity(0))
    quota = cgroup_cpus(cgroup_root)
    return cpus if quota is None else max(1, min(cpus, math.floor(quota)))


def cgroup_cpus(root: Path = CGROUP_ROOT) -> float | None:
    """The CPUs this process's cgroup quota allows (`cpu.max` under cgroup v2; `cpu.cfs_quota_us` over
    `cpu.cfs_period_us` in `root`/cpu under v1): the tightest of its cgroup's and its parents' up to
    `root` (a container's own cgroup is there); None when none sets one."""
    try:
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        own = []
    quotas = []
    for line in own:
        _, controllers, path = line.split(":", 2)
        if controllers and "cpu" not in controllers.split(","):
            continue
        base = root if not controllers else root / "cpu"  # "0::/…": v2, one hierarchy
        here = base / path.lstrip("/")
        for directory in (here, *(p for p in here.parents if p.is_relative_to(base))):
            quota = _cgroup_quota(directory, v2=not controllers)
            if quota is not None:
                quotas.append(quota)
    return min(quotas, default=None)


def _cgroup_quota(directory: Path, v2: bool) -> float | None:
    try:
        if v2:
            quota, period = (directory / "cpu.max").read_text().split()
        else:
            quota, period = ((directory / f"cpu.cfs_{n}_us").read_text().strip() for n in ("quota", "period"))
        return None if quota in ("max", "-1") else float(quota) / float(period)
    except (OSError, ValueError):  # no such file here, or not a quota
        return None


def unplaceable_here(settings: Settings, resources: Mapping[str, float]) -> str | None:
    """`unplaceable` for an embedded Ray, before it is up: why this machine can never run a trial
    asking these resources, naming what it has; None when it can."""
    cpus, gpus = embedded_resources(settings)
    wanted = {"CPU": float(resources.get("cpu", 0.0)), "GPU": float(resources.get("gpu", 0.0))}
    if wanted["CPU"] <= cpus and wanted["GPU"] <= gpus:
        return None
    return this_machine_cannot(settings, wanted, cpus, gpus)


def this_machine_cannot(settings: Settings, wanted: Mapping[str, float], cpus: float, gpus: float) -> str:
    """Why the embedded Ray, of `cpus` and `gpus`, cannot run a trial asking `wanted` (CPU, GPU)."""
    return (
        f"this machine's embedded Ray cannot run a trial asking {wanted['CPU']:g} CPUs and {wanted['GPU']:g} "
        f"GPUs (it has {cpus:g} CPUs{' (MEMSWEEP_RAY_NUM_CPUS)' if settings.ray_num_cpus else ''} and "
        f"{gpus:g} GPUs); ask for less in `resources`, or join a Ray cluster that has them (MEMSWEEP_RAY_ADDRESS)"
    )


def device_on_this_node(gpus_per_unit: float, cpus_per_unit: float) -> tuple[str, int]:
    """(device kind, bytes a unit may use) where this task runs: a unit's share of the GPU it is
    given (of what a trainer may allocate there: $MEMSWEEP_GPU_MEMORY_FRACTION of the card, when set),
    or of the node's free memory among the units its CPUs take at once. A unit that asks no GPU
    trains on the CPU: Ray hides the node's GPUs from it."""
    from service.study.packing import unit_share
    from trainers.runtime import gpu_memory_fraction

    if gpus_per_unit > 0:
        import torch

        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info()
            fraction = gpu_memory_fraction()
            if fraction is not None:
                free = min(free, int(fraction * total))
            return "cuda", unit_share(free, 1.0 / gpus_per_unit)
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return "cpu", unit_share(available, node_cpus() / max(cpus_per_unit, 1.0))


def node_cpus() -> float:
    """The CPUs Ray schedules on this node (what sets how many units run here at once: an embedded
    Ray's MEMSWEEP_RAY_NUM_CPUS, a container's quota), or, outside Ray, those this process may use."""
    import ray

    if ray.is_initialized():
        here = ray.get_runtime_context().get_node_id()
        for n in ray.nodes():  # type: ignore[no-untyped-call]
            if n.get("NodeID") == here and n.get("Resources", {}).get("CPU"):
                return float(n["Resources"]["CPU"])
    return float(usable_cpus())


def unit_memory(resources: Mapping[str, float], timeout: float = 60.0) -> tuple[str, int] | None:
    """(device kind, bytes) a unit of the study may use, measured on a node that would run it (a
    task with the study's resources; a cluster's nodes are not the driver's machine); None when no
    node answered within `timeout` (the packer then falls back on its assumptions). A CPU study on
    a Ray that is the driver's own node alone (the embedded one) is measured here: a probe task would
    start a worker process, seconds of a short study."""
    import ray

    cpus, gpus = float(resources.get("cpu", 1.0)), float(resources.get("gpu", 0.0))
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
    if gpus == 0 and nodes == [ray.get_runtime_context().get_node_id()]:
        return device_on_this_node(gpus, cpus)
    probe = ray.remote(device_on_this_node).options(num_cpus=cpus, num_gpus=gpus)
    ref = probe.remote(gpus, cpus)
    try:
        kind, share = ray.get(ref, timeout=timeout)
    except Exception as exc:  # busy or unreachable: the fallback is safe, only less exact
        log.warning("could not measure a node's memory (%s); bundle sizes use the defaults", exc)
        ray.cancel(ref, force=True)
        return None
    return str(kind), int(share)


def node_plugins(timeout: float = 60.0) -> dict[str, dict[str, str]]:
    """Node (its IP and id's head) → {"kind:name": identity} of the plugins installed there
    (`service.study.plugins.installed_here`), for every alive node of the running Ray cluster that can
    run a trial (it has CPUs). A node that died as it was asked is left out, with a warning (Ray still
    counted it alive for some seconds, and its task could not be placed: every plugin listing and every
    study using a plugin failed with a 500 or Ray's TaskUnschedulableError meanwhile). A node that is
    alive and does not answer (an older image, no worker within `timeout`) is listed as unanswered
    (`plugins.UNANSWERED`), which refuses a study using a plugin: it may hold another version."""
    import ray
    from ray.exceptions import NodeDiedError, TaskUnschedulableError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from service.study.plugins import UNANSWERED, installed_here

    inventory = ray.remote(num_cpus=0, max_retries=0)(installed_here)
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]  # type: ignore[no-untyped-call]
    refs = {
        f"{n['NodeManagerAddress']} ({n['NodeID'][:8]})": (
            n["NodeID"],
            inventory.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            ).remote(),
        )
        for n in nodes
    }
    ray.wait([ref for _, ref in refs.values()], num_returns=len(refs), timeout=timeout)
    found: dict[str, dict[str, str]] = {}
    alive: set[str] | None = None
    for node, (node_id, ref) in refs.items():
        try:
            found[node] = ray.get(ref, timeout=0)
        except Exception as exc:
            ray.cancel(ref, force=True)
            if alive is None:
                alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}  # type: ignore[no-untyped-call]
            if isinstance(exc, (NodeDiedError, TaskUnschedulableError)) or node_id not in alive:
                log.warning("node %s is gone (%s): its plugins are not asked", node, type(exc).__name__)
            else:
                found[node] = {UNANSWERED: type(exc).__name__}
    return found


def node_name() -> str:
    """This Ray node as a person reads it: host name / IP address (the head of its Ray node id, as
    `GET /plugins` names nodes: two nodes of one host, containers sharing its network, told apart)."""
    import ray

    ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    return f"{socket.gethostname()}/{ip} ({ray.get_runtime_context().get_node_id()[:8]})"


#: seconds a node's measured memory is trusted for bundle sizes
MEMORY_TTL = 600.0


class NodeMemory:
    """A node's memory for a unit of given resources (`unit_memory`), measured at most every
    MEMORY_TTL seconds: the run and the plan of a study pack with the same figure."""

    def __init__(
        self, measure: Callable[[Mapping[str, float]], tuple[str, int] | None] | None = None
    ) -> None:
        self._measure = measure or unit_memory
        self._cache: dict[tuple[float, float], tuple[float, tuple[str, int] | None]] = {}

    def __call__(self, resources: Mapping[str, float]) -> tuple[str, int] | None:
        key = (float(resources["cpu"]), float(resources["gpu"]))
        cached = self._cache.get(key)
        if cached is None or time.monotonic() - cached[0] > MEMORY_TTL:
            cached = (time.monotonic(), self._measure(resources))
            self._cache[key] = cached
        return cached[1]
