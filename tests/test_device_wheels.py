"""tools/device_wheels.py without the network: its pins, its dependency walk and its wheel rewriting."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tools import device_wheels as dw

ROOT = Path(__file__).resolve().parents[1]


def make_wheel(
    folder: Path, name: str, version: str, files: dict[str, bytes], executable: tuple[str, ...] = ()
) -> Path:
    """A small wheel of pure-Python files, with a RECORD that lists and hashes each one."""
    info = f"{name}-{version}.dist-info"
    files = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow([path, f"sha256={digest}", len(data)])
    writer.writerow([f"{info}/RECORD", "", ""])
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in [*files.items(), (f"{info}/RECORD", record.getvalue().encode())]:
            entry = zipfile.ZipInfo(path, (2026, 1, 1, 0, 0, 0))
            entry.external_attr = (0o755 if path in executable else 0o644) << 16
            zf.writestr(entry, data, zipfile.ZIP_DEFLATED)
    return wheel


def record_rows(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as zf:
        _, rows = dw.read_record(zf)
    return {row[0]: row[1] for row in rows}


def test_the_pins_are_pyprojects():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "service"
    ]
    declared = {}
    for line in extra:
        req = Requirement(line)
        for spec in req.specifier:
            if spec.operator == "==":
                declared[req.name] = spec.version
    assert {name: declared.get(name) for name in ("ray", "mlflow", "optuna")} == dw.PINS
    assert {n: v for n, v in dw.pyproject_pins(ROOT / "pyproject.toml").items() if n in dw.PINS} == dw.PINS
    roots = {r.name for r in dw.service_roots(ROOT / "pyproject.toml")}
    assert {"ray", "mlflow", "optuna", "alembic"} <= roots
    assert "psycopg2-binary" not in roots


def test_trimming_removes_the_named_paths_and_records_exactly_what_is_left(tmp_path):
    big = bytes(range(256)) * 64  # 16 kB: recompressed with LZMA below
    src = make_wheel(
        tmp_path,
        "pkg",
        "1.0",
        {
            "pkg/__init__.py": b"X = 1\n",
            "pkg/server": big,
            "pkg/jars/worker.jar": b"java" * 100,
            "pkg/jars/more/other.jar": b"more",
            "pkg/ui/index.html": b"<html/>",
            "pkg/ui2.py": b"# not under pkg/ui/\n",
        },
        executable=("pkg/server",),
    )
    before = record_rows(src)
    out = tmp_path / "out" / src.name
    removed = dw.trim_wheel(src, out, ["pkg/jars/", "pkg/ui/index.html"], lzma_from=4096)

    assert removed == 400 + 4 + 7
    with zipfile.ZipFile(out) as zf:
        names = {i.filename for i in zf.infolist() if not i.is_dir()}
        assert names == {
            "pkg/__init__.py",
            "pkg/server",
            "pkg/ui2.py",
            "pkg-1.0.dist-info/METADATA",
            "pkg-1.0.dist-info/WHEEL",
            "pkg-1.0.dist-info/RECORD",
        }
        assert zf.getinfo("pkg/server").compress_type == zipfile.ZIP_LZMA
        assert zf.getinfo("pkg/__init__.py").compress_type == zipfile.ZIP_DEFLATED
        assert zf.read("pkg/server") == big
        assert zf.getinfo("pkg/server").external_attr >> 16 == 0o755  # the executable bit survives
        assert zf.testzip() is None
    after = record_rows(out)
    assert set(after) == names  # RECORD lists exactly the wheel's files …
    assert all(after[p] == before[p] for p in after)  # … with the hashes they had
    assert dw.removes("pkg/jars/more/other.jar", ["pkg/jars/"])
    assert not dw.removes("pkg/ui2.py", ["pkg/ui"])  # a prefix is a folder only with its '/'


def test_pip_installs_a_trimmed_wheel(tmp_path):
    src = make_wheel(tmp_path, "pkg", "1.0", {"pkg/__init__.py": b"X = 1\n", "pkg/big.txt": b"x" * 5000})
    out = tmp_path / "out" / src.name
    dw.trim_wheel(src, out, ["pkg/big.txt"], lzma_from=10)  # every member LZMA
    target = tmp_path / "site"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    subprocess.run([*cmd, "--target", str(target), str(out)], check=True, capture_output=True)
    assert (target / "pkg" / "__init__.py").read_bytes() == b"X = 1\n"
    assert not (target / "pkg" / "big.txt").exists()


def test_the_dist_info_is_never_trimmed(tmp_path):
    src = make_wheel(tmp_path, "pkg", "1.0", {"pkg/__init__.py": b""})
    with pytest.raises(ValueError, match="metadata"):
        dw.trim_wheel(src, tmp_path / "out.whl", ["pkg-1.0.dist-info/"])


def test_same_files_only_when_byte_for_byte(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    full = make_wheel(tmp_path / "a", "full", "1.0", {"m/x.py": b"x", "m/y.py": b"y", "m/ui.js": b"ui"})
    skinny = make_wheel(tmp_path / "b", "skinny", "1.0", {"m/x.py": b"x", "m/y.py": b"y"})
    assert dw.same_files(skinny, full) == ["m/x.py", "m/y.py"]
    other = make_wheel(tmp_path, "skinny", "1.0", {"m/x.py": b"changed"})
    with pytest.raises(SystemExit):
        dw.same_files(other, full)


def test_split_keeps_wheels_of_one_package_together(tmp_path):
    wheels = {
        make_wheel(tmp_path, "full", "1", {"m/a.py": b""}): 30,
        make_wheel(tmp_path, "skinny", "1", {"m/a.py": b""}): 5,
        make_wheel(tmp_path, "big", "1", {"big/a.py": b""}): 40,
        make_wheel(tmp_path, "small", "1", {"small/a.py": b""}): 10,
    }
    parts = dw.split(wheels, limit=50)
    assert parts is not None
    assert sorted(w.name for part in parts for w in part) == sorted(w.name for w in wheels)
    assert all(sum(wheels[w] for w in part) <= 50 for part in parts)
    together = [{w.name.split("-")[0] for w in part} >= {"full", "skinny"} for part in parts]
    assert any(together)  # both install m/: `pip --target --upgrade` would replace one with the other
    assert dw.split(wheels, limit=39) is None  # "big" alone is over


def test_the_walk_follows_extras_and_markers_and_stops_at_the_image():
    meta = {
        "app": ("1.0", ["lib[fast]>=2", "win-only; sys_platform == 'win32'", "old; python_version < '3.12'"]),
        "lib": ("2.1", ["speedup; extra == 'fast'", "docs; extra == 'docs'", "numpy>=1.20"]),
        "speedup": ("0.3", []),
    }
    got = dw.closure(
        [Requirement("app")],
        version=lambda n: meta[n][0],
        requires=lambda n: meta[n][1],
        provided={"numpy"},
    )
    assert got.carry == {"app": "1.0", "lib": "2.1", "speedup": "0.3"}
    assert got.from_image == {"numpy": [(">=1.20", "lib 2.1")]}
    with pytest.raises(SystemExit, match="asks"):
        dw.closure([Requirement("app>=2")], version=lambda n: meta[n][0], requires=lambda n: meta[n][1])
