"""Cells and tasks from other distributions, by Python entry point (issue 38; docs/plugins.md).

An installed distribution declares

    [project.entry-points."memsweep.cells"]
    indrnn = "memsweep_indrnn:IndRNNCell"
    [project.entry-points."memsweep.tasks"]
    temporal-order = "memsweep_temporal_order:TemporalOrderTask"

and its classes join the registries of `trainers.cells` and `trainers.tasks` when a name is first looked
up there (not at import: a plugin's module may import memsweep before its own classes exist), behind the
same contracts (`trainers.cells.base`, `trainers.tasks.base`; checked by
`trainers.contract`). A plugin that cannot join — it fails to import, its entry point's name is not its
class's `name`, it is not a `Cell` (`Task`), or it shadows a built-in name — is kept as `broken` with
the reason, and any use of its name is refused with it; the built-ins keep working.

A plugin's identity is its distribution's name and version and a digest of its code (every file of its
top-level package but bytecode, hidden files and an editor's leftovers: `code_files`): `identity` gives
it, the config hash of every trial that uses the plugin includes it (`trainers.config.config_hash`), so
the ledger never reuses a run of another version or of edited code.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import tomllib
import traceback
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from trainers.registry import load_all_plugins

if TYPE_CHECKING:
    from trainers.registry import Registry

#: registry kind → entry-point group
GROUPS = {"cell": "memsweep.cells", "task": "memsweep.tasks"}
#: set to 0 to load no plugin: the built-ins alone (the repository's own test suite runs so, whatever is
#: installed beside it; a plugin's tests and `memsweep plugins check` run with plugins)
LOAD_ENV = "MEMSWEEP_LOAD_PLUGINS"


@dataclass(frozen=True)
class Plugin:
    """One entry point of an installed distribution, loaded or not."""

    kind: str  # "cell" or "task"
    name: str  # the entry point's name: the registry name it takes
    value: str  # "module:Class"
    distribution: str
    version: str
    digest: str = ""  # sha256 of its package's `code_files`, 16 hex digits; "" when unreadable
    problem: str | None = None  # why it did not join its registry; None: it did

    @property
    def identity(self) -> str:
        """What enters the config hash of a trial that uses it: distribution, version and code."""
        return f"{self.distribution}=={self.version}+{self.digest}"

    def to_dict(self) -> dict[str, Any]:
        """Its fields, its identity, `edited`: why the code on disk is no longer what this process
        loaded (a server's listing said "ready" for a plugin whose studies its door then refused), and
        `version_behind`: an editable install's source names a version not yet installed."""
        return {
            **asdict(self),
            "identity": self.identity,
            "edited": self.edited(),
            "version_behind": version_behind(self),
        }

    def edited(self) -> str | None:
        """Why this process's copy is not the one installed now (its code or version changed on disk since
        this process loaded it), or None (the same, or it did not load)."""
        if self.problem is not None:
            return None
        now = on_disk(self)
        if now == self.identity:
            return None
        return (
            f"the {self.kind} plugin {self.name!r} changed on disk since this process loaded it "
            f"({self.identity}, now {now})"
        )


#: (kind, name) → every plugin seen, joined or broken (the first of two with one name joins)
_PLUGINS: dict[tuple[str, str], Plugin] = {}


def load(registry: Registry[Any], kind: str, base: type) -> None:
    """Register every installed plugin of `kind` (a subclass of `base`) in `registry`: called once by each
    pluggable registry (`trainers.cells`'s, `trainers.tasks`'s) at its first look-up, after its built-ins
    (`trainers.registry.load_plugins_with`). Never raises: a plugin that cannot join is recorded with its
    reason (`broken`) and refused where its name is used."""
    if os.environ.get(LOAD_ENV, "1") == "0":
        return
    for ep in sorted(importlib.metadata.entry_points(group=GROUPS[kind]), key=lambda e: (e.name, e.value)):
        dist = ep.dist
        name = dist.metadata["Name"] if dist is not None else "?"
        version = dist.version if dist is not None else "?"
        plugin = Plugin(kind, ep.name, ep.value, name, version, _digest(ep.module))
        key = (kind, ep.name)
        if key in _PLUGINS and _PLUGINS[key].problem is None:
            plugin = _broken(plugin, f"the {kind} name {ep.name!r} is taken by {_PLUGINS[key].identity}")
            _PLUGINS[(kind, f"{ep.name} ({name})")] = plugin
            registry.refuse(ep.name, plugin_message(plugin))
            continue
        if ep.name in registry:
            plugin = _broken(
                plugin,
                f"{ep.name!r} is a built-in {kind}: a plugin may not shadow it; give the entry point and the "
                "class's `name` another name",
            )
            _PLUGINS[key] = plugin
            continue  # the built-in stays; `refusals` names the plugin for studies that use the name
        try:
            cls = ep.load()
        except Exception as exc:  # any error of foreign code while importing is the plugin's problem
            plugin = _broken(plugin, f"importing {ep.value} failed: {_last_line(exc)}")
        else:
            plugin = _check_class(plugin, cls, base)
        _PLUGINS[key] = plugin
        if plugin.problem is None:  # (a cell's `fused` form: `trainers.fused.cells.FUSED_CELLS` reads it)
            registry.register(ep.name)(cls)
        else:
            registry.refuse(ep.name, plugin_message(plugin))


def _check_class(plugin: Plugin, cls: Any, base: type) -> Plugin:
    """The class-level contract a registry needs before anything is built (the rest: `trainers.contract`)."""
    if not (isinstance(cls, type) and issubclass(cls, base)):
        return _broken(plugin, f"{plugin.value} is not a subclass of {base.__module__}.{base.__qualname__}")
    declared = getattr(cls, "name", None)
    if declared != plugin.name:
        return _broken(
            plugin,
            f"its entry point is named {plugin.name!r} but {cls.__qualname__}.name is {declared!r}: make them one",
        )
    return plugin


def _broken(plugin: Plugin, problem: str) -> Plugin:
    return Plugin(
        plugin.kind, plugin.name, plugin.value, plugin.distribution, plugin.version, plugin.digest, problem
    )


def _last_line(exc: BaseException) -> str:
    return traceback.format_exception_only(exc)[-1].strip()


def plugin_message(plugin: Plugin) -> str:
    return (
        f"the {plugin.kind} plugin {plugin.name!r} ({plugin.value}) of {plugin.distribution} {plugin.version} "
        f"cannot be used: {plugin.problem}"
    )


#: files of a plugin's package that are neither code nor data of it: an editor's or a merge's leftovers
#: (`cp __init__.py __init__.py.orig` moved a plugin's identity, so every trial of it would train again)
LEFTOVERS = ("*.orig", "*.rej", "*.bak", "*.swp", "*.swo", "*.tmp", "*~", "#*#")


@dataclass(frozen=True)
class CodeFiles:
    """The files of an entry point's top-level package (or its one module): those its digest hashes, and
    the leftovers it leaves out (`memsweep plugins --files NAME` lists both), relative to `root`."""

    root: Path
    hashed: list[Path]
    left_out: list[Path]


def code_files(module: str) -> CodeFiles | None:
    """The files that make the digest of the package of `module`, found without importing it; None when it
    cannot be found. Every file of the package but bytecode, hidden ones (`.ipynb_checkpoints`, an editor's
    swap file) and `LEFTOVERS`: data a plugin ships is part of what it computes (a run that read other data
    must not be reused), and a file the plugin reads cannot be told from one it does not, so a plugin must
    not write into its package (a cache there would change its identity, and a running server would refuse
    its studies). A namespace package (no `__init__.py`: no file to find it by, perhaps several folders,
    some of other distributions) has no folder of its own: its files are those the distribution that
    declares the entry point installed in it (`_installed_files`), or for an editable install the
    package's folder in its source (its RECORD lists none)."""
    try:
        spec = importlib.util.find_spec(module.split(".")[0])
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        return _installed_files(module)
    origin = Path(spec.origin)
    if not spec.submodule_search_locations:  # one module
        return CodeFiles(origin.parent, [Path(origin.name)], [])
    root = origin.parent
    files = _sorted_out(root, (p.relative_to(root) for p in root.rglob("*")))
    return files if files.hashed else _installed_files(module) or files


def _installed_files(module: str) -> CodeFiles | None:
    """The files in the top-level package of `module` that the one distribution declaring an entry point
    there installed (its RECORD), sorted out as a folder's are, or, as an editable install's RECORD lists
    none, those of the package's folder in its source (`SOURCE/TOP` or `SOURCE/src/TOP`); None when there
    are none."""
    top = module.split(".")[0]
    owners = {
        ep.dist.metadata["Name"]: ep.dist
        for group in GROUPS.values()
        for ep in importlib.metadata.entry_points(group=group)
        if ep.module == module and ep.dist is not None
    }
    if len(owners) != 1:
        return None
    (dist,) = owners.values()
    listed = [Path(*f.parts[1:]) for f in dist.files or () if len(f.parts) > 1 and f.parts[0] == top]
    files = _sorted_out(Path(str(dist.locate_file(top))), listed)
    if files.hashed:
        return files
    source = _editable_source(dist)  # an editable install's RECORD lists none: its package is in its source
    for root in () if source is None else (source / top, source / "src" / top):
        if root.is_dir():
            files = _sorted_out(root, (p.relative_to(root) for p in root.rglob("*")))
            return files if files.hashed else None
    return None


def _sorted_out(root: Path, candidates: Iterable[Path]) -> CodeFiles:
    """The `candidates` (relative to `root`) that are files, sorted into those a digest hashes and the
    `LEFTOVERS`; bytecode (`__pycache__`) and hidden files and folders dropped."""
    found = sorted(
        rel
        for rel in candidates
        if "__pycache__" not in rel.parts
        and not any(part.startswith(".") for part in rel.parts)
        and (root / rel).is_file()
    )
    left_out = [p for p in found if any(fnmatch.fnmatch(p.name, pattern) for pattern in LEFTOVERS)]
    return CodeFiles(root, [p for p in found if p not in left_out], left_out)


def _digest(module: str) -> str:
    """sha256 over `code_files(module)`, by relative path and content, 16 hex digits; "" when not found."""
    files = code_files(module)
    if files is None:
        return ""
    h = hashlib.sha256()
    for rel in files.hashed:
        h.update(rel.as_posix().encode() + b"\0" + (files.root / rel).read_bytes() + b"\0")
    return h.hexdigest()[:16]


def installed() -> list[Plugin]:
    """Every plugin seen on this machine, joined or broken, by kind then name."""
    _load_all()
    return sorted(_PLUGINS.values(), key=lambda p: (p.kind, p.name))


def _load_all() -> None:
    """Every pluggable registry's plugins loaded (the cells' and the tasks': their first look-up would).
    The registries are imported here, as `import trainers` does not import them (its names load on use)."""
    import trainers.cells
    import trainers.tasks  # noqa: F401  (importing each makes its registry, `trainers.registry._PLUGGABLE`)

    load_all_plugins()


def identity(kind: str, name: str) -> str | None:
    """The identity of the plugin that provides `kind` `name`, or None for a built-in."""
    _load_all()
    plugin = _PLUGINS.get((kind, name))
    return plugin.identity if plugin is not None and plugin.problem is None else None


def on_disk(plugin: Plugin) -> str:
    """The plugin's identity as installed now: its distribution's version and the digest of its files
    as they are on disk, which a process starting now would load (`Plugin.identity` is what this one
    loaded)."""
    try:
        version = importlib.metadata.version(plugin.distribution)
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    return f"{plugin.distribution}=={version}+{_digest(plugin.value.split(':')[0])}"


def version_behind(plugin: Plugin) -> str | None:
    """Why the installed version of an editable install is not its source's, or None: its pyproject.toml
    (where PEP 610's direct_url.json says the source is) names another version than the metadata pip wrote
    at `pip install -e`, which alone memsweep reads, so the new version enters no trial's hash until it is
    installed again."""
    try:
        dist = importlib.metadata.distribution(plugin.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    source = _editable_source(dist)
    if source is None:
        return None
    try:
        project = tomllib.loads((source / "pyproject.toml").read_text()).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return None
    declared = project.get("version")
    if not isinstance(declared, str) or _same_version(declared, dist.version):
        return None
    pip = f"{sys.executable} -m pip"  # this interpreter's pip: a bare `pip` may be another Python's
    return f"version {declared} in {source / 'pyproject.toml'}, {dist.version} installed: run {pip} install -e {source} again"


def _editable_source(dist: importlib.metadata.Distribution) -> Path | None:
    """The source folder of an editable install (`pip install -e`, where PEP 610's direct_url.json says),
    or None: not editable, or not a local folder."""
    try:
        url = json.loads(dist.read_text("direct_url.json") or "{}")
    except json.JSONDecodeError:
        return None
    if not url.get("dir_info", {}).get("editable") or not str(url.get("url", "")).startswith("file:"):
        return None
    return Path(unquote(urlparse(url["url"]).path))


def _same_version(declared: str, installed: str) -> bool:
    """Whether two spellings name one version (PEP 440: `1.0.0-beta1` is the `1.0.0b1` pip installs)."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(declared) == Version(installed)
    except InvalidVersion:
        return declared == installed


def edited(kind: str, name: str) -> str | None:
    """`Plugin.edited` of this process's plugin `kind` `name` (None when there is none). A server that
    planned trials under the identity it loaded would have its workers, which import the code on disk,
    train other code under those trials' hashes."""
    _load_all()
    plugin = _PLUGINS.get((kind, name))
    return None if plugin is None else plugin.edited()


def identities(cell: str, task: str) -> dict[str, str]:
    """{"cell": identity, "task": identity} for whichever of a trial's cell and task is a plugin."""
    found = {"cell": identity("cell", cell), "task": identity("task", task)}
    return {k: v for k, v in found.items() if v is not None}


def refusals(kind: str, name: str) -> list[str]:
    """Why a plugin installed here makes `kind` `name` unsafe to use: a plugin that shadows it."""
    _load_all()
    return [
        plugin_message(p)
        for p in _PLUGINS.values()
        if p.kind == kind and p.name == name and p.problem is not None
    ]
