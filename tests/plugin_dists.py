"""Installed plugin distributions made on disk for the tests: a `*.dist-info` with its entry points beside
the plugin's package, in a folder a child process puts on its path (what pip's install leaves, without
pip: the metadata is all `importlib.metadata` reads)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: a small Elman cell as a plugin author would write it; {extra} marks where the tests break it
TOY_CELL = """
from dataclasses import dataclass

import torch
from torch import nn

from trainers.cells.base import Cell


@dataclass(frozen=True)
class ToyConfig:
    gain: float = 0.5
    nonlinearity: str = "tanh"


class ToyCell(Cell):
    name = "{name}"
    Config = ToyConfig
    grid = {{"gain": (0.5, 0.9)}}

    def __init__(self, config, input_size, hidden_size, gen):
        super().__init__(config, input_size, hidden_size, gen)
        w = torch.randn(hidden_size, hidden_size, generator=gen) * config.gain / hidden_size**0.5
        self.weight_hh = nn.Parameter(w)
        self.weight_ih = nn.Parameter(torch.randn(hidden_size, input_size, generator=gen) * 0.5)
        {extra_init}

    def forward(self, x):
        h = x.new_zeros(x.shape[1], self.hidden_size)
        states = []
        for t in range(x.shape[0]):
            h = torch.tanh(h @ self.weight_hh.t() + x[t] @ self.weight_ih.t())
            states.append(h)
        out = torch.stack(states)
        {extra_forward}
        return out
"""


def toy_cell(name: str = "toy", extra_init: str = "", extra_forward: str = "") -> str:
    return TOY_CELL.format(name=name, extra_init=extra_init or "pass", extra_forward=extra_forward or "pass")


def write_dist(
    root: Path, dist: str, version: str, entry_points: dict[str, dict[str, str]], files: dict[str, str]
) -> Path:
    """`root` holding distribution `dist` `version` (its entry points: group → name → "module:Class") and
    its `files` (relative path → source)."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = []
    for group, names in entry_points.items():
        lines.append(f"[{group}]")
        lines += [f"{n} = {v}" for n, v in names.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return root


#: a fused form for the toy cell: each member's recurrence with the solo ops on its slice ({drift}: a
#: change that breaks bit equality)
FUSED_TOY = """
from trainers.fused.cells import FusedCell


def _states(cells, p, xs, last, ws):
    out = []
    for w, v, x in zip(p["weight_hh"].unbind(0), p["weight_ih"].unbind(0), xs):
        h = x.new_zeros(x.shape[1], w.shape[0])
        states = []
        for t in range(x.shape[0]):
            h = torch.tanh(h @ w.t() + x[t] @ v.t())
            states.append(h)
        s = torch.stack(states){drift}
        out.append(s[-1] if last else s)
    return out


ToyCell.fused = FusedCell((), _states)
"""


def toy_dist(
    root: Path, version: str = "1.0", name: str = "toy", fused: str | None = None, **breaks: str
) -> Path:
    """A distribution `memsweep-<name>` (package `memsweep_<name>`) with one plugin cell `name` (`breaks`:
    extra_init / extra_forward; `fused`: with the fused form, drifting by this expression)."""
    source = toy_cell(name, **breaks)
    if fused is not None:
        source += FUSED_TOY.format(drift=fused)
    module = "memsweep_" + name.replace("-", "_")
    return write_dist(
        root,
        f"memsweep-{name}",
        version,
        {"memsweep.cells": {name: f"{module}:ToyCell"}},
        {f"{module}/__init__.py": source},
    )


EXAMPLES = REPO / "examples"


def install(target: Path, *packages: Path, version: str | None = None) -> Path:
    """`packages` (source trees: the examples) installed into `target` as pip installs them for a user,
    built from copies (the repository's trees stay clean); `version`: with this version instead."""
    import shutil

    copies = []
    for package in packages:
        copy = target.parent / f"{target.name}-src" / package.name
        shutil.copytree(package, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        if version is not None:
            pyproject = copy / "pyproject.toml"
            text = pyproject.read_text()
            start = text.index('\nversion = "') + len('\nversion = "')
            pyproject.write_text(text[:start] + version + text[text.index('"', start) :])
        copies.append(str(copy))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target",
         str(target), *copies],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return target


def env_with(*paths: Path) -> dict[str, str]:
    """The environment of a child process that sees these folders' distributions (and the repository)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MEMSWEEP_LOAD_PLUGINS")}
    env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in paths), str(REPO)])
    return env


def run_python(code: str, *paths: Path, timeout: float = 300) -> object:
    """Run `code` in a child process that sees `paths`; the JSON it prints last."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env_with(*paths),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def memsweep(
    *args: str, paths: tuple[Path, ...] = (), environ: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`memsweep ARGS` in a child process that sees `paths` (and `environ`'s variables besides)."""
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        env={**env_with(*paths), **(environ or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
