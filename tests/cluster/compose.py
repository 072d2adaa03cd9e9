"""docker/compose.yaml (and the image's docker/Dockerfile) read as the process tier runs them.

Each service's `command`, `environment`, `healthcheck`, `depends_on` and volumes come from the
compose file, interpolated as compose interpolates (`${VAR}`, `${VAR:-default}`, `${VAR:?error}`,
`$$`), then moved from containers to processes on this machine:

- every container is a host of its own: a loopback address `127.0.15.N` (a scaled service gets one
  per replica). `NAME:PORT` for a service NAME (`postgres:5432`, `http://mlflow:5000`,
  `ray-head:6379`) becomes that address and a free port picked for the container port;
- in a service's own strings, `localhost:PORT`, `127.0.0.1:PORT` and the bind address `0.0.0.0` mean
  the container itself, and a `--…port` flag naming one of its container ports gets the free port;
- paths under a container's volumes become directories of the tier: one per named volume (shared
  by the replicas, as compose shares it), one per container for the image's anonymous `VOLUME`;
- the image's environment (the Dockerfile's `ENV`) comes first, then the service's, as in a container.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from service.servers import free_port

DOCKER = Path(__file__).resolve().parents[2] / "docker"
COMPOSE_FILE = DOCKER / "compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"
LOOPBACK = "127.0.15"  # 127.0.15.N: one loopback address per container (127.0.0.1 Ray would replace)
SELF_NAMES = ("localhost", "127.0.0.1", "0.0.0.0")

VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_]\w*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}|(?P<named>[A-Za-z_]\w*))"
)
HOST_PORT = re.compile(r"(?<![\w.-])(?P<host>[A-Za-z][\w-]*|\d+\.\d+\.\d+\.\d+):(?P<port>\d+)(?![\w.-])")
PORT_FLAG = re.compile(r"(--[\w-]*port(?:=|\s+))(\d+)\b")
ANY_ADDRESS = re.compile(r"(?<![\w.])0\.0\.0\.0(?![\w.])")
DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


class ComposeError(ValueError):
    """What compose itself would refuse (a required variable unset, an unknown service)."""


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """`value` with compose's variable syntax resolved from `env`."""

    def resolve(m: re.Match[str]) -> str:
        if m["escaped"]:
            return "$"
        name, op, arg = m["braced"] or m["named"], m["op"], m["arg"] or ""
        val = env.get(name)
        present = bool(val) if op and op.startswith(":") else val is not None
        if op in (":-", "-"):
            return val if present and val is not None else arg
        if op in (":?", "?"):
            if not present:
                raise ComposeError(f"required variable {name} is missing a value: {arg}")
            return val or ""
        if op in (":+", "+"):
            return arg if present else ""
        return val or ""

    return VARIABLE.sub(resolve, value)


def _walk(node: Any, f: Callable[[str], str]) -> Any:
    if isinstance(node, str):
        return f(node)
    if isinstance(node, dict):
        return {k: _walk(v, f) for k, v in node.items()}
    if isinstance(node, list):
        return [_walk(v, f) for v in node]
    return node


def seconds(duration: str | int | float | None, default: float) -> float:
    """A compose duration ('1m30s', '5s', '500ms') in seconds."""
    if duration is None:
        return default
    if isinstance(duration, int | float):
        return float(duration)
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * scale[unit] for n, unit in DURATION.findall(duration))


def dockerfile_image(text: str) -> tuple[dict[str, str], list[str]]:
    """The image's environment (`ENV`) and anonymous volumes (`VOLUME`) declared by a Dockerfile."""
    env: dict[str, str] = {}
    volumes: list[str] = []
    for line in re.sub(r"\\\n", " ", text).splitlines():
        words = line.split(None, 1)
        if len(words) < 2:
            continue
        instruction, rest = words[0].upper(), words[1]
        if instruction == "ENV":
            parts = shlex.split(rest)
            if "=" in parts[0]:
                env.update(part.split("=", 1) for part in parts)
            else:  # the legacy `ENV KEY value` form
                env[parts[0]] = rest.split(None, 1)[1]
        elif instruction == "VOLUME":
            volumes += yaml.safe_load(rest) if rest.lstrip().startswith("[") else rest.split()
    return env, volumes


@dataclass
class Health:
    """A compose healthcheck: `argv` run `retries` times, `interval` apart, after `start_period`."""

    argv: list[str]
    interval: float
    timeout: float
    retries: int
    start_period: float

    @property
    def deadline(self) -> float:
        """How long compose waits before it calls the service unhealthy."""
        return self.start_period + self.retries * (self.interval + self.timeout)


@dataclass
class Host:
    """One container: its service, its loopback address, its ports (container → free) and volumes."""

    name: str
    service: str
    ip: str
    root: Path
    ports: dict[int, int] = field(default_factory=dict)
    mounts: dict[str, Path] = field(default_factory=dict)


class Compose:
    """The compose file interpolated with `variables` and laid out as hosts under `root`."""

    def __init__(self, root: Path, variables: Mapping[str, str], replicas: Mapping[str, int] | None = None):
        self.root = root
        self.raw = yaml.safe_load(COMPOSE_FILE.read_text())
        self.variables = dict(variables)
        self.interpolate()
        self.image_env, self.image_volumes = dockerfile_image(DOCKERFILE.read_text())
        self.hosts: dict[str, Host] = {}
        referenced = self._referenced_ports()
        for service in self.services:
            count = (replicas or {}).get(service, 1)
            for k in range(count):
                name = service if count == 1 else f"{service}-{k + 1}"
                host = Host(name, service, f"{LOOPBACK}.{len(self.hosts) + 2}", root / name)
                host.ports = {p: free_port("0.0.0.0") for p in sorted(referenced.get(service, set()))}
                host.mounts = self._mounts(service, host)
                self.hosts[name] = host
        self.interpolate(self._published_ports())

    def interpolate(self, variables: Mapping[str, str] | None = None) -> None:
        """(Re)read the compose file with these variables added to the ones given before."""
        self.variables.update(variables or {})
        self.spec: dict[str, Any] = _walk(self.raw, lambda s: interpolate(s, self.variables))
        self.services: dict[str, dict[str, Any]] = self.spec["services"]

    def _published_ports(self) -> dict[str, str]:
        """A port published as `"[BIND:]${VAR:-default}:PORT"` is, on one machine, the container's
        port itself: VAR (unless given) is the free port that stands for PORT."""
        published: dict[str, str] = {}
        for service, spec in self.raw["services"].items():
            for mapping in spec.get("ports", []):
                # [${BIND:-127.0.0.1}:]${VAR:-default}:PORT
                m = re.fullmatch(r"(?:\$\{\w+[^}]*\}:|[\d.]+:)?\$\{(\w+)[^}]*\}:(\d+)", str(mapping))
                if m and m[1] not in self.variables and len(self.replicas(service)) == 1:
                    published[m[1]] = str(self.host(service).ports[int(m[2])])
        return published

    # ----- the layout ------------------------------------------------------------------------------
    def _referenced_ports(self) -> dict[str, set[int]]:
        """Container ports of each service: published ones, and every `service:port` named anywhere."""
        ports: dict[str, set[int]] = {s: set() for s in self.services}
        for service, spec in self.services.items():
            for mapping in spec.get("ports", []):
                ports[service].add(int(str(mapping).rsplit(":", 1)[-1].split("/")[0]))
            for text in _strings({k: v for k, v in spec.items() if k != "image"}):
                for m in HOST_PORT.finditer(text):
                    name = m["host"]
                    if name in ports:
                        ports[name].add(int(m["port"]))
                    elif name in SELF_NAMES:
                        ports[service].add(int(m["port"]))
        return ports

    def ours(self, service: str) -> bool:
        """Whether the service runs the image docker/Dockerfile builds (else a stock image: postgres)."""
        build = self.services[service].get("build") or {}
        return Path(build.get("dockerfile", "")).name == DOCKERFILE.name

    def _mounts(self, service: str, host: Host) -> dict[str, Path]:
        anonymous = self.image_volumes if self.ours(service) else []
        mounts = {t: host.root / "volumes" / t.strip("/").replace("/", "_") for t in anonymous}
        for volume in self.services[service].get("volumes", []):
            source, target = str(volume).split(":")[:2]
            if source.startswith((".", "/")):
                mounts[target] = (COMPOSE_FILE.parent / source).resolve()
            else:  # a named volume, shared by every container that mounts it
                mounts[target] = self.root / "volumes" / source
        return mounts

    def replicas(self, service: str) -> list[Host]:
        return [h for h in self.hosts.values() if h.service == service]

    def host(self, service: str) -> Host:
        hosts = self.replicas(service)
        if len(hosts) != 1:
            raise ComposeError(f"{service} has {len(hosts)} containers")
        return hosts[0]

    def start_order(self) -> list[str]:
        """The services in an order that honours every `depends_on` (as compose starts them)."""
        order: list[str] = []

        def visit(service: str, path: tuple[str, ...] = ()) -> None:
            if service in path:
                raise ComposeError(f"depends_on cycle: {' → '.join((*path, service))}")
            if service not in order:
                for dep in self.services[service].get("depends_on", {}):
                    visit(dep, (*path, service))
                order.append(service)

        for service in self.services:
            visit(service)
        return order

    # ----- a container's strings as this machine's ---------------------------------------------------
    def localize(self, text: str, host: Host) -> str:
        """`text` as seen from `host`, with container names, ports and paths made this machine's."""

        def host_port(m: re.Match[str]) -> str:
            name, port = m["host"], int(m["port"])
            target = host if name in SELF_NAMES else self._by_service(name)
            if target is None or port not in target.ports:
                return m[0]
            return f"{target.ip}:{target.ports[port]}"

        text = HOST_PORT.sub(host_port, text)
        text = PORT_FLAG.sub(lambda m: m[1] + str(host.ports.get(int(m[2]), m[2])), text)
        text = ANY_ADDRESS.sub(host.ip, text)
        for target in sorted(host.mounts, key=len, reverse=True):
            pattern = r"(?<![\w.:/-])" + re.escape(target) + r"(?![\w.-])"
            text = re.sub(pattern, lambda _m, t=target: str(host.mounts[t]), text)
        return text

    def _by_service(self, name: str) -> Host | None:
        hosts = self.replicas(name)
        return hosts[0] if len(hosts) == 1 else None

    def command(self, host: Host) -> list[str]:
        command = self.services[host.service].get("command")
        if command is None:
            raise ComposeError(f"{host.service} has no command")
        text = command if isinstance(command, str) else shlex.join(command)
        return shlex.split(self.localize(text, host))

    def environment(self, host: Host) -> dict[str, str]:
        """The image's environment, then the service's, both localized."""
        env = self.services[host.service].get("environment", {})
        if isinstance(env, list):
            env = dict(item.split("=", 1) for item in env)
        image_env = self.image_env if self.ours(host.service) else {}
        merged = {**image_env, **{k: "" if v is None else str(v) for k, v in env.items()}}
        return {k: self.localize(v, host) for k, v in merged.items()}

    def health(self, host: Host) -> Health:
        check = self.services[host.service]["healthcheck"]
        test = check["test"]
        if isinstance(test, str):
            argv = ["sh", "-c", test]
        elif test[0] == "CMD-SHELL":
            argv = ["sh", "-c", test[1]]
        elif test[0] == "CMD":
            argv = list(test[1:])
        else:
            raise ComposeError(f"{host.service}: healthcheck test {test!r}")
        return Health(
            argv=shlex.split(self.localize(shlex.join(argv), host)),
            interval=seconds(check.get("interval"), 30),
            timeout=seconds(check.get("timeout"), 30),
            retries=int(check.get("retries", 3)),
            start_period=seconds(check.get("start_period"), 0),
        )


def _strings(node: Any) -> list[str]:
    out: list[str] = []
    _walk(node, lambda s: out.append(s) or s)  # type: ignore[func-returns-value]
    return out
