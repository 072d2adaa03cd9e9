"""The fused form docs/plugins.md gives ('A fused form') for its leaky cell ('A cell in 40 lines'): installed
as a plugin, it joins bundles and each member is its solo run bit for bit (`trainers.contract`); the same
form with `(1 - g) * h` rounded otherwise fails as the doc says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.plugin_dists import run_python, write_dist

pytestmark = pytest.mark.slow

CHECK = """
import json
from trainers.cells import CELLS
from trainers.contract import check_cell
from trainers.fused.cells import FUSED_CELLS
print(json.dumps({"fused": FUSED_CELLS["leaky"].states.__name__, "problems": [str(p) for p in check_cell(CELLS.get("leaky"))]}))
"""


def _doc_block(doc: str, heading: str) -> str:
    found = re.search(rf"## {heading}[^\n]*\n.*?```python\n(.*?)```", doc, re.S)
    assert found is not None, heading
    return found.group(1)


def test_the_fused_form_of_docs_plugins_trains_each_member_as_its_solo_run(tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "plugins.md").read_text()
    cell, fused = _doc_block(doc, "A cell in 40 lines"), _doc_block(doc, "A fused form")
    drifted = fused.replace("h = (1 - g) * h + g *", "h = h - g * h + g *")  # the bundle's alone
    assert drifted != fused
    for name, code in (("doc", cell + "\n" + fused), ("drifted", cell + "\n" + drifted)):
        write_dist(tmp_path / name, "memsweep-leaky", "0.1", {"memsweep.cells": {"leaky": "memsweep_leaky:LeakyCell"}},
                   {"memsweep_leaky/__init__.py": code})  # fmt: skip
    assert run_python(CHECK, tmp_path / "doc") == {"fused": "leaky_states", "problems": []}
    found = run_python(CHECK, tmp_path / "drifted")
    assert isinstance(found, dict) and found["problems"], found
    assert all(p.startswith("fused: member") and "bit for bit" in p for p in found["problems"]), found
