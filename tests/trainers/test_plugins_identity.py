"""A plugin's code digest (docs/plugins.md, 'Identity') for a namespace package: one without an
`__init__.py`, which the import system finds without a file (and perhaps over several folders), is
known by the files its distribution installed there (its RECORD); a regular package is still known by
its folder, as before. Each case runs in a child process that sees its own made-up distributions."""

from __future__ import annotations

import json
from pathlib import Path

from tests.plugin_dists import memsweep, run_python, toy_cell, write_dist

DIGESTS = """
import json
from trainers.plugins import code_files, installed

out = {}
for p in installed():
    files = code_files(p.value.split(":")[0])
    out[p.name] = {"digest": p.digest, "problem": p.problem,
                   "hashed": None if files is None else [f.as_posix() for f in files.hashed],
                   "left_out": None if files is None else [f.as_posix() for f in files.left_out]}
print(json.dumps(out))
"""


def _record(root: Path, dist: str, version: str, files: list[str]) -> None:
    """The RECORD pip writes beside a distribution's metadata: every file it installed (hashes left out)."""
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    rows = [*files, *(f"{info.name}/{name}" for name in ("METADATA", "entry_points.txt", "RECORD"))]
    (info / "RECORD").write_text("".join(f"{row},,\n" for row in rows))


def _namespace_site(root: Path) -> Path:
    """Two distributions sharing the namespace package `memsweep_ns`: `memsweep-ns-toy` with a plugin
    cell in `memsweep_ns/toy/`, and `memsweep-ns-other` with a module of its own beside it."""
    toy_files = {"memsweep_ns/toy/__init__.py": toy_cell("nstoy"), "memsweep_ns/toy/table.json": "[1, 2]"}
    write_dist(
        root, "memsweep-ns-toy", "1.0", {"memsweep.cells": {"nstoy": "memsweep_ns.toy:ToyCell"}}, toy_files
    )
    leftovers = ["memsweep_ns/toy/__init__.py.orig", "memsweep_ns/toy/__pycache__/__init__.cpython-311.pyc"]
    for rel in leftovers:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x = 1\n")
    _record(root, "memsweep-ns-toy", "1.0", [*toy_files, *leftovers, "../../bin/memsweep-ns-toy"])
    write_dist(root, "memsweep-ns-other", "2.0", {}, {"memsweep_ns/other.py": "VALUE = 1\n"})
    _record(root, "memsweep-ns-other", "2.0", ["memsweep_ns/other.py"])
    return root


def test_a_namespace_package_plugin_is_known_by_its_distributions_files_and_an_edit_moves_it(
    tmp_path: Path,
) -> None:
    site = _namespace_site(tmp_path / "site")
    assert not (site / "memsweep_ns" / "__init__.py").exists()
    before = run_python(DIGESTS, site)["nstoy"]
    assert before["problem"] is None and len(before["digest"]) == 16
    # its own files in the shared folder, by the rules of a regular package's (bytecode, leftovers)
    assert before["hashed"] == ["toy/__init__.py", "toy/table.json"]
    assert before["left_out"] == ["toy/__init__.py.orig"]

    (site / "memsweep_ns" / "other.py").write_text("VALUE = 2\n")  # another distribution's file
    (site / "memsweep_ns" / "toy" / "__init__.py.orig").write_text("x = 2\n")  # a leftover
    assert run_python(DIGESTS, site)["nstoy"]["digest"] == before["digest"]

    (site / "memsweep_ns" / "toy" / "table.json").write_text("[1, 3]")  # its data: what it computes
    edited = run_python(DIGESTS, site)["nstoy"]["digest"]
    assert len(edited) == 16 and edited != before["digest"]

    shown = memsweep("plugins", "--files", "nstoy", paths=(site,))
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert f"cell 'nstoy' (memsweep-ns-toy==1.0+{edited}): its code digest hashes 2 files" in shown.stdout
    assert "  toy/__init__.py\n" in shown.stdout and "  toy/table.json\n" in shown.stdout
    (report,) = json.loads(memsweep("plugins", "--files", "nstoy", "--json", paths=(site,)).stdout)
    assert report["root"] == str(site / "memsweep_ns") and sorted(report["hashed"]) == [
        "toy/__init__.py",
        "toy/table.json",
    ]


def test_a_regular_packages_digest_is_its_folders_as_before_whatever_its_record_lists(tmp_path: Path) -> None:
    """Pinned: the digest of a regular package hashes its folder (a file pip did not install there too),
    never its RECORD, so the identity of every plugin installed so far stays what it was."""
    site = tmp_path / "site"
    files = {"memsweep_pinned/__init__.py": "VALUE = 1\n", "memsweep_pinned/table.json": "[1, 2]"}
    write_dist(site, "memsweep-pinned", "1.0", {"memsweep.cells": {"pinned": "memsweep_pinned:Cell"}}, files)
    (site / "memsweep_pinned" / "__init__.py.orig").write_text("VALUE = 0\n")
    _record(site, "memsweep-pinned", "1.0", ["memsweep_pinned/__init__.py"])  # table.json not listed
    pinned = run_python(DIGESTS, site)["pinned"]
    assert pinned["digest"] == "15f96e781c08e6d5"
    assert pinned["hashed"] == ["__init__.py", "table.json"] and pinned["left_out"] == ["__init__.py.orig"]


def test_an_editable_namespace_plugin_is_known_by_its_source_folder_and_an_edit_moves_it(
    tmp_path: Path,
) -> None:
    """`pip install -e` of a namespace-package plugin writes a RECORD that lists none of its files (only
    the editable finder's), so its digest was empty and an edit in its source moved no identity: its
    files are the package's folder in the source that PEP 610's direct_url.json names."""
    site, source = tmp_path / "site", tmp_path / "source"
    write_dist(
        site, "memsweep-ns-edit", "1.0", {"memsweep.cells": {"nsedit": "memsweep_ns.edit:ToyCell"}}, {}
    )
    info = site / "memsweep_ns_edit-1.0.dist-info"
    (info / "direct_url.json").write_text(
        json.dumps({"url": source.as_uri(), "dir_info": {"editable": True}})
    )
    _record(site, "memsweep-ns-edit", "1.0", ["__editable__.memsweep_ns_edit-1.0.pth"])
    package = source / "src" / "memsweep_ns" / "edit"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(toy_cell("nsedit"))
    (package / "__init__.py.orig").write_text("x = 1\n")

    before = run_python(DIGESTS, site, source / "src")["nsedit"]
    assert before["problem"] is None and len(before["digest"]) == 16
    assert before["hashed"] == ["edit/__init__.py"] and before["left_out"] == ["edit/__init__.py.orig"]
    (package / "__init__.py").write_text(toy_cell("nsedit", extra_forward="out = out * 1.0"))
    edited = run_python(DIGESTS, site, source / "src")["nsedit"]["digest"]
    assert len(edited) == 16 and edited != before["digest"]
