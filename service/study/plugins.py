"""The plugins a study uses, checked at the door (issue 38; docs/plugins.md).

- `used` names the plugin cells and tasks of a space, with their identities on this machine;
- `admit_plugins` is the door: it refuses a study whose plugins break their contract or differ between
  the nodes, before anything is recorded;
- `check_report` runs `trainers.contract` over the plugins `named` names: what `memsweep plugins check`
  prints, and what `check_contracts` reads from a child process (`python -m service.study.plugins NAME…`),
  once per identity: a plugin that breaks its contract is refused before any trial runs, and its code
  never runs inside the server;
- `listing` is what `memsweep plugins` and `GET /plugins` list: each plugin installed, with what breaks
  its contract (a cell that loads but fails its checks is not ready);
- `installed_here` is what a node has installed (the executor asks every node of a cluster:
  `Executor.node_plugins`), and `version_mismatch` says which node lacks a used plugin or has another
  version of it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from search_spaces import SearchSpace, Values
from service.core.errors import StudyError
from trainers import plugins
from trainers.registry import UnknownNameError, where_plugins_are

#: a node's entry when it did not say which plugins it has (its value: why): `nodes.node_plugins`
UNANSWERED = "unanswered"

#: each Ray node's plugins ("kind:name" → identity), or None when every node shares this process's
#: installation (`Executor.node_plugins`)
NodePlugins = Callable[[], Mapping[str, Mapping[str, str]] | None]

#: (kind, name) → the identity it was checked at and its problems ([] when it holds)
_CHECKED: dict[tuple[str, str], tuple[str, list[str]]] = {}
_LOCK = threading.Lock()


def _names(space: SearchSpace, field: str) -> set[str]:
    found = {str(space.base[field])} if field in space.base else set()
    for model in space.models:
        if field in model.fixed:
            found.add(str(model.fixed[field]))
        dim = model.dims.get(field)
        if isinstance(dim, Values):
            found.update(str(v) for v in dim.values)
    return found


def used(space: SearchSpace) -> dict[tuple[str, str], str]:
    """(kind, name) → identity of every plugin cell and task the space's trials may use."""
    out = {}
    for kind in ("cell", "task"):
        for name in _names(space, kind):
            ident = plugins.identity(kind, name)
            if ident is not None:
                out[(kind, name)] = ident
    return out


def admit_plugins(space: SearchSpace, nodes: NodePlugins | None = None, again: str = "submit again") -> None:
    """Raise StudyError when a plugin the space uses breaks its contract, or (with `nodes`: the Ray
    cluster's inventory) when a node lacks it or has another version. `again`: what the user does
    once it is fixed."""
    wanted = used(space)
    if not wanted:
        return
    edited = [why for kind, name in sorted(wanted) if (why := plugins.edited(kind, name)) is not None]
    if edited:
        raise StudyError(
            "; ".join(edited)
            + ": this process plans trials with the code it loaded, while its workers would train the code on "
            "disk, under the old code's hashes. Restart `memsweep serve` to plan with the new code (`memsweep "
            "run` loads it afresh each time), then " + again
        )
    broken = [
        f"{kind} {name!r} ({wanted[(kind, name)]}): " + "; ".join(problems)  # its identity once, then all
        for (kind, name), problems in sorted(check_contracts(wanted).items())
        if problems
    ]
    if broken:
        raise StudyError(
            "a plugin this study uses breaks its contract, so no trial runs: "
            + " · ".join(broken)
            + f". Fix the plugin (`memsweep plugins check` runs the same checks; docs/plugins.md) and {again}"
        )
    found = nodes() if nodes is not None else None
    why = version_mismatch(wanted, found) if found else None
    if why is not None:
        raise StudyError(why)


def check_contracts(
    wanted: Mapping[tuple[str, str], str], timeout: float = 600.0
) -> dict[tuple[str, str], list[str]]:
    """(kind, name) → the contract problems of each plugin in `wanted` ("shapes: …"; [] when it holds),
    checked in a child process once per identity."""
    with _LOCK:
        todo = [key for key, ident in wanted.items() if _CHECKED.get(key, ("", []))[0] != ident]
        found = _checked_children([f"{kind}:{name}" for kind, name in todo], timeout)
        out = {}
        for key in wanted:
            if key not in todo:
                out[key] = list(_CHECKED[key][1])
                continue
            problems = found.get(f"{key[0]}:{key[1]}", "it was not checked")
            if isinstance(problems, str):  # its check crashed or hung: said, not kept (the next call retries)
                out[key] = [problems]
            else:
                _CHECKED[key] = (wanted[key], problems)
                out[key] = list(problems)
        return out


def _checked_children(names: list[str], timeout: float) -> dict[str, list[str] | str]:
    """`_child_check` over `names`; when the child crashed or hung, each name again in a child of its
    own, so that one plugin that takes its process down (or never returns) does not stand for the others."""
    if not names:
        return {}
    found = _child_check(names, timeout)
    if not isinstance(found, str):
        return dict(found)
    if len(names) == 1:
        return {names[0]: found}
    return {name: problems for one in names for name, problems in _checked_children([one], timeout).items()}


def listing() -> list[dict[str, Any]]:
    """Every plugin installed here (`Plugin.to_dict`), with `contract`: what breaks its contract, as
    `memsweep plugins check` and the door find it ([] when it holds, or when it is not checked: refused,
    or changed on disk since this process loaded it). A cell that loads but fails its checks was listed
    `ready`, and every study of it was then refused at the door."""
    found = plugins.installed()
    loaded = {(p.kind, p.name): p.identity for p in found if p.problem is None and p.edited() is None}
    problems = check_contracts(loaded) if loaded else {}
    return [{**p.to_dict(), "contract": problems.get((p.kind, p.name), [])} for p in found]


def named(names: Sequence[str]) -> list[plugins.Plugin]:
    """The installed plugins `names` (NAME, cell:NAME or task:NAME) name, all by default; UnknownNameError
    naming the installed ones when a name matches none."""
    found = plugins.installed()
    chosen = []
    for name in names or [f"{p.kind}:{p.name}" for p in found]:
        kind, _, bare = name.rpartition(":")
        match = [p for p in found if p.name == bare and kind in ("", p.kind)]
        if not match:
            known = ", ".join(f"{p.kind}:{p.name}" for p in found) or "none is installed"
            raise UnknownNameError(f"no plugin {name!r}; installed: {known}. {where_plugins_are('A plugin')}")
        chosen += match
    return chosen


def check_report(chosen: Iterable[plugins.Plugin]) -> list[dict[str, Any]]:
    """`trainers.contract` over each plugin (`named`): its kind, name, identity, `problems` ("shapes: …";
    "load: …" for one that did not load; [] when it holds) and `version_behind`."""
    # torch and every cell: imported where a check runs, not by the server's door that only reads one
    from trainers.cells import CELLS
    from trainers.contract import CHECKS
    from trainers.tasks import TASKS

    report: list[dict[str, Any]] = []
    for p in chosen:
        if p.problem is not None:
            problems = [f"load: {p.problem}"]
        else:
            cls = (CELLS if p.kind == "cell" else TASKS).get(p.name)
            problems = [str(problem) for problem in CHECKS[p.kind](cls)]
        report.append(
            {
                "kind": p.kind,
                "name": p.name,
                "identity": p.identity,
                "problems": problems,
                "version_behind": plugins.version_behind(p),
            }
        )
    return report


def run_check(names: Iterable[str], timeout: float) -> dict[str, list[str]]:
    """`check_report` over `names` in a child process: "kind:name" → its problems (each name the child's
    failure, when it crashed or did not finish)."""
    names = list(names)
    found = _child_check(names, timeout)
    return {n: [found] for n in names} if isinstance(found, str) else found


def _child_check(names: list[str], timeout: float) -> dict[str, list[str]] | str:
    """`check_report` over `names` in a child process (`_main`): "kind:name" → its problems, or why the
    child gave no report (it crashed, or did not finish in `timeout` seconds)."""
    # -P: the working directory's own `service.py` or `trainers.py` does not stand for memsweep's
    cmd = [sys.executable, "-P", "-m", "service.study.plugins", *names]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"the contract check did not finish in {timeout:g} s"
    try:
        report = json.loads(done.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return f"the contract check crashed (exit {done.returncode}): {tail[0]}"
    return {f"{r['kind']}:{r['name']}": list(r["problems"]) for r in report}


def installed_here() -> dict[str, str]:
    """{"kind:name": identity} of the plugins installed on this node, as installed now, which a new
    worker loads (a pooled worker may hold what it loaded before): what `nodes.node_plugins` asks
    each node of a cluster. One that cannot be used here (its import fails on this node) says why:
    it read as missing, and the node's trials failed blaming a dead worker."""
    return {
        f"{p.kind}:{p.name}": plugins.on_disk(p) if p.problem is None else f"unusable ({p.problem})"
        for p in plugins.installed()
    }


def version_mismatch(
    wanted: Mapping[tuple[str, str], str], nodes: Mapping[str, Mapping[str, str]]
) -> str | None:
    """Which node lacks a used plugin or has another version of it, naming both; None when all agree."""
    problems = [
        f"node {node} did not say which plugins it has ({there[UNANSWERED]}): it may hold another version"
        for node, there in sorted(nodes.items())
        if UNANSWERED in there and wanted
    ]
    agreed = []
    for (kind, name), ident in sorted(wanted.items()):
        found = {
            node: there.get(f"{kind}:{name}")
            for node, there in sorted(nodes.items())
            if UNANSWERED not in there
        }
        problems += [
            f"node {node} has {theirs or 'no plugin'} for {kind} {name!r}, this server {ident}"
            for node, theirs in found.items()
            if theirs != ident
        ]
        theirs = set(found.values())
        if len(theirs) == 1 and None not in theirs and ident not in theirs and len(found) > 1:
            agreed.append(f"{kind} {name!r}")
    if not problems:
        return None
    # every node has one other version: most often the server's copy was installed again since it
    # started (it plans with what it loaded), not a node that lags
    server_lags = (
        f" If every node has the version you mean ({', '.join(agreed)}), this server loaded another: "
        "restart `memsweep serve` (it loads the plugins again), then submit again"
        if agreed
        else ""
    )
    return (
        "every node that may run a trial needs the same version of each plugin the study uses: "
        + "; ".join(problems)
        + ". Install the same distribution on every node (docs/plugins.md, 'On a cluster') and submit again."
        + server_lags
    )


def _main(names: Sequence[str]) -> int:
    """The child `_child_check` runs: the report of the plugins `names` name as one JSON line on stdout
    (a plugin's own prints may come before it); a name that matches none on stderr, exit 2."""
    try:
        report = check_report(named(names))
    except UnknownNameError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
