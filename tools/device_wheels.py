"""Make the wheels that let a lent GPU machine run `memsweep serve` from the source tree.

The device machines (the device tool's README and KINDS.md) have Python 3.12 with torch, numpy,
pandas, pyarrow, matplotlib, httpx, rich, … but no Ray, MLflow, Optuna, FastAPI, uvicorn, pydantic,
SQLAlchemy or Alembic, and no network: wheels travel inside each call's working tree, at most 64 MiB a
call with the tree. Run here, where pip reaches PyPI, this tool downloads CPython 3.12 manylinux x86_64
(or pure-Python) wheels of the dependency closure of the `service` extra (less psycopg2: the device
uses SQLite), every version pinned to what this checkout's .venv has installed (what CI runs), less
every distribution the device's image already holds (names compared per PEP 503; the image's own
version is then used, and what the wheels ask of it is written to from-image.txt), except
typing-extensions (pydantic asks a newer one than the image may have). Then it repacks what would not
fit:

* removed from ray: `ray/jars/` (the Java worker, 32 MB; a Python-only node never starts one),
  `ray/dashboard/client/build/` (the dashboard's web client: memsweep starts Ray with
  include_dashboard=False, and Ray's dashboard logs and carries on without it) and `ray/rllib/` (Tune
  imports it only inside `except ImportError`, to look up a trainable given by name);
* mlflow-skinny and mlflow-tracing keep only their .dist-info: the mlflow wheel holds every one of
  their files, byte for byte (checked against their RECORDs at each run);
* members over 1 MiB (Ray's gcs_server, raylet and _raylet.so, …) are recompressed with LZMA, a ZIP
  method that Python's zipfile, and so pip, reads: the same bytes installed, a third smaller;
* only when the set still exceeds --limit-mib (60 MiB, less if the working tree leaves less of a
  call's 64), or with --lean: MLflow's UI build (`mlflow/server/js/`,
  7.7 MB). Tracking and `mlflow server` work; its web UI then answers that it has no index.html.

Each rewritten wheel's RECORD lists exactly the files it holds. If the set still exceeds the limit it
is split into .whl/part1/ and .whl/part2/, for two device calls back to back (the machine keeps its
disk for 30 s after a call); the tool fails, naming the largest wheels, when even that cannot fit.

Run it with the .venv's Python (its installed versions are the pins):

    .venv/bin/python tools/device_wheels.py                 # → .whl/ (ignored): wheels, manifests
    .venv/bin/python tools/device_wheels.py --lean          # drop MLflow's UI build even if it fits

and on the device, in a `run` that carries [".whl"], from the repository root (see that script):

    . tools/device_install.sh && python3 -m service.cli serve

.whl/requirements.txt lists what the folder holds and what was trimmed from each wheel.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import importlib.metadata
import io
import json
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]

#: the pins of pyproject.toml's service extra that the device set is built for (the .venv must match)
PINS = {"ray": "2.60.0", "mlflow": "3.17.2", "optuna": "5.0.0"}

#: the service extra's requirements the device does without, and why
LEAVE_OUT = {
    "psycopg2-binary": "a Postgres driver: the device's ledger and MLflow store are SQLite",
    "fastapi-offline": "Swagger UI's and ReDoc's files for /docs and /redoc: no browser opens the device's server",
}
#: imported by the service itself, beside the extra (also an mlflow dependency)
ALSO = ("alembic",)

#: carried although the image has one: the image's may be too old, and these are small and pure Python
CARRY_ANYWAY = {"typing-extensions": "pydantic 2.14 asks >= 4.16 (45 kB)"}

#: the Python packages of the device image 'cuda' (the device tool's KINDS.md, as read on 2026-11-17)
_IMAGE = """
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
    build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
    cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops
    equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio
    h11 h5py hf-xet httpcore httpx humanize hypothesis idna imageio iniconfig interface-meta jax
    jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning
    lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib
    mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
    narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
    nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
    nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink
    nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax
    opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip
    pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
    pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
    pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu
    safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
    sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
    tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
    tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
    transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig
    werkzeug wheel wrapt xarray xxhash yarl zipp
    """
DEVICE_IMAGE = frozenset(canonicalize_name(n) for n in _IMAGE.split())

#: the device's interpreter, as PEP 508 markers see it (Python 3.12.3, Linux x86_64)
DEVICE_MARKERS = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "implementation_version": "3.12.3",
    "platform_python_implementation": "CPython",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "platform_release": "",
    "platform_version": "",
    "sys_platform": "linux",
    "os_name": "posix",
}
#: oldest first: pip prefers the first platform a wheel is built for, the most portable build
PLATFORMS = (
    "manylinux1_x86_64",
    "manylinux2010_x86_64",
    "manylinux2014_x86_64",
    *(f"manylinux_2_{n}_x86_64" for n in range(5, 40)),
)

#: what every device set leaves out: (distribution, path prefix, why)
TRIMS: tuple[tuple[str, str, str], ...] = (
    ("ray", "ray/jars/", "the Java worker; a Python-only node never starts one"),
    (
        "ray",
        "ray/dashboard/client/build/",
        "the dashboard's web client; memsweep's Ray runs with include_dashboard=False",
    ),
    ("ray", "ray/rllib/", "RLlib; Tune imports it only inside `except ImportError`"),
)
#: left out only when the set would not fit otherwise (or with --lean)
IF_NEEDED: tuple[tuple[str, str, str], ...] = (
    (
        "mlflow",
        "mlflow/server/js/",
        "MLflow's web UI build: the UI does not render on the device; tracking and `mlflow server` work",
    ),
)
#: distributions whose files another wheel of the set holds, byte for byte: (distribution, holder)
SAME_FILES_AS = {"mlflow-skinny": "mlflow", "mlflow-tracing": "mlflow"}
#: members at least this large are recompressed with LZMA
LZMA_FROM = 1 << 20
MiB = 1 << 20
#: what one device call carries at most, the working tree included
CALL_LIMIT = 64 * MiB
#: bump when the repacking changes, so that cached repacks are remade
REPACK_VERSION = 1


def pyproject_pins(pyproject: Path) -> dict[str, str]:
    """The `name==version` pins of pyproject.toml's service extra, names normalised."""
    extra = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["service"]
    pins: dict[str, str] = {}
    for line in extra:
        req = Requirement(line)
        exact = [s.version for s in req.specifier if s.operator == "=="]
        if exact:
            pins[canonicalize_name(req.name)] = exact[0]
    return pins


def service_roots(pyproject: Path) -> list[Requirement]:
    """The requirements the device set starts from: the service extra, less LEAVE_OUT, plus ALSO."""
    extra = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["service"]
    roots = [Requirement(line) for line in extra]
    roots = [r for r in roots if canonicalize_name(r.name) not in LEAVE_OUT]
    return roots + [Requirement(name) for name in ALSO]


@dataclass
class Closure:
    """What the device needs: `carry` (name → pinned version) and what it takes from the image."""

    carry: dict[str, str] = field(default_factory=dict)
    #: name → [(specifier, wanted by)], for the distributions the image provides
    from_image: dict[str, list[tuple[str, str]]] = field(default_factory=dict)


def closure(
    roots: Iterable[Requirement],
    version: Callable[[str], str],
    requires: Callable[[str], list[str]],
    provided: Collection[str] = DEVICE_IMAGE - set(CARRY_ANYWAY),
    markers: dict[str, str] = DEVICE_MARKERS,
) -> Closure:
    """Walk the requirements from `roots` as the device's interpreter would, with extras.

    `version(name)` and `requires(name)` read the installed metadata (the .venv's). A distribution the
    image provides is not carried and not walked into (the image's own copy has its dependencies).
    """
    out = Closure()
    todo = [(r, "the service extra") for r in roots]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req, wanted_by = todo.pop()
        name = canonicalize_name(req.name)
        if name in provided:
            if str(req.specifier):
                out.from_image.setdefault(name, []).append((str(req.specifier), wanted_by))
            else:
                out.from_image.setdefault(name, [])
            continue
        if (name, frozenset(req.extras)) in seen:
            continue
        seen.add((name, frozenset(req.extras)))
        pinned = version(name)
        if not req.specifier.contains(pinned, prereleases=True):
            raise SystemExit(f"{wanted_by} asks {req}, the .venv has {name} {pinned}")
        out.carry[name] = pinned
        extras = {"", *req.extras}
        for line in requires(name):
            dep = Requirement(line)
            if dep.marker is None or any(dep.marker.evaluate({**markers, "extra": e}) for e in extras):
                todo.append((dep, f"{name} {pinned}"))
    return out


def read_record(zf: zipfile.ZipFile) -> tuple[str, list[list[str]]]:
    """A wheel's RECORD: its path in the archive and its rows."""
    (path,) = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/RECORD")]
    return path, [row for row in csv.reader(io.StringIO(zf.read(path).decode())) if row]


def removes(path: str, remove: Collection[str]) -> bool:
    """Whether `path` is one of `remove`: an exact path, or under a prefix that ends in '/'."""
    return path in remove or any(p.endswith("/") and path.startswith(p) for p in remove)


def trim_wheel(src: Path, dst: Path, remove: Collection[str], lzma_from: int | None = LZMA_FROM) -> int:
    """Copy the wheel `src` to `dst` without the members `remove` names; return the bytes removed.

    The removed files' lines leave RECORD (the others' hashes still hold: their bytes are unchanged);
    members of at least `lzma_from` bytes are recompressed with LZMA (None: none). The .dist-info
    folder is never trimmed. Fails when the new RECORD would not list exactly the wheel's files.
    """
    removed = 0
    with zipfile.ZipFile(src) as zin:
        record_path, rows = read_record(zin)
        info_dir = record_path.rsplit("/", 1)[0] + "/"
        bad = [p for p in remove if p.startswith(info_dir)]
        if bad:
            raise ValueError(f"{src.name}: will not trim its metadata {bad}")
        kept = [i for i in zin.infolist() if not removes(i.filename, remove)]
        removed = sum(i.file_size for i in zin.infolist() if removes(i.filename, remove))
        rows = [row for row in rows if not removes(row[0], remove)]
        files = {i.filename for i in kept if not i.is_dir()}
        if {row[0] for row in rows} != files:
            extra = sorted({row[0] for row in rows} ^ files)[:5]
            raise ValueError(f"{src.name}: RECORD and its files differ ({extra} …)")
        record = io.StringIO()
        csv.writer(record, lineterminator="\n").writerows(rows)
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_suffix(".part")
        with zipfile.ZipFile(tmp, "w") as zout:
            for info in kept:
                data = record.getvalue().encode() if info.filename == record_path else zin.read(info)
                new = zipfile.ZipInfo(info.filename, info.date_time)
                new.external_attr = info.external_attr  # the executable bits (gcs_server, raylet)
                new.create_system = info.create_system
                big = lzma_from is not None and len(data) >= lzma_from
                new.compress_type = zipfile.ZIP_LZMA if big else zipfile.ZIP_DEFLATED
                zout.writestr(new, data)
        tmp.replace(dst)
    return removed


def in_dist_info(path: str) -> bool:
    return path.split("/", 1)[0].endswith(".dist-info")


def record_hashes(wheel: Path) -> dict[str, str]:
    """path → RECORD hash of a wheel's files outside its .dist-info."""
    with zipfile.ZipFile(wheel) as zf:
        _, rows = read_record(zf)
    return {row[0]: row[1] for row in rows if not in_dist_info(row[0])}


def same_files(wheel: Path, holder: Path) -> list[str]:
    """The files of `wheel` (outside its .dist-info) that `holder` holds too; fails if any differs."""
    mine, theirs = record_hashes(wheel), record_hashes(holder)
    missing = [p for p in mine if theirs.get(p) != mine[p]]
    if missing:
        raise SystemExit(f"{holder.name} does not hold {wheel.name}'s {missing[:3]} byte for byte")
    return sorted(mine)


def top_levels(wheel: Path) -> set[str]:
    """The top-level names a wheel installs (`pip --target --upgrade` replaces each one whole)."""
    with zipfile.ZipFile(wheel) as zf:
        return {n.split("/", 1)[0] for n in zf.namelist() if not in_dist_info(n)}


def split(sizes: dict[Path, int], limit: int) -> list[list[Path]] | None:
    """Two parts, each at most `limit`, wheels that install the same top-level name kept together."""
    groups: list[tuple[set[str], list[Path]]] = []
    for wheel in sizes:
        names, members = top_levels(wheel), [wheel]
        for g in [g for g in groups if g[0] & names]:
            groups.remove(g)
            names |= g[0]
            members += g[1]
        groups.append((names, members))
    parts: list[list[Path]] = [[], []]
    totals = [0, 0]
    for _, members in sorted(groups, key=lambda g: -sum(sizes[w] for w in g[1])):
        i = totals.index(min(totals))
        parts[i] += members
        totals[i] += sum(sizes[w] for w in members)
    return parts if max(totals) <= limit else None


def download(pins: dict[str, str], cache: Path) -> dict[str, Path]:
    """name → the cached wheel of each pinned distribution for CPython 3.12 on manylinux x86_64."""
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--progress-bar", "off", "--python-version", "3.12", "--implementation", "cp", "-d", str(cache)]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    cmd += [f"{name}=={version}" for name, version in sorted(pins.items())]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode:
        noise = "WARNING: Location "  # find-links folders this machine's pip.conf names
        print("\n".join(line for line in run.stderr.splitlines() if not line.startswith(noise)))
        raise SystemExit(f"pip download failed ({run.returncode})")
    # the files this run chose (the cache may hold other builds of the same version)
    saved = re.findall(r"^\s*(?:Saved|File was already downloaded) (.+\.whl)$", run.stdout, re.MULTILINE)
    found: dict[str, Path] = {}
    for wheel in map(Path, saved):
        name, version = wheel.name.split("-")[:2]
        if pins.get(canonicalize_name(name)) == version:
            found[canonicalize_name(name)] = wheel
    missing = sorted(set(pins) - set(found))
    if missing:
        raise SystemExit(f"no wheel in {cache} for {missing}")
    return found


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def repack(src: Path, remove: Collection[str], cache: Path) -> Path:
    """`trim_wheel` into the cache, once per source wheel and removal list (LZMA takes a minute)."""
    key = json.dumps([REPACK_VERSION, sha256(src), sorted(remove), LZMA_FROM])
    dst = cache / "repacked" / hashlib.sha256(key.encode()).hexdigest()[:16] / src.name
    if not dst.exists():
        trim_wheel(src, dst, remove)
    return dst


def tree_size(root: Path) -> int:
    """Bytes of the working tree that travels with a device call (tracked and untracked, not ignored)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root, capture_output=True, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return 0
    paths = (root / p.decode() for p in out.split(b"\0") if p)
    return sum(p.stat().st_size for p in paths if p.is_file())


def mib(n: float) -> str:
    return f"{n / MiB:.1f} MiB"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / ".whl"), help="the folder to fill (default: .whl)")
    p.add_argument(
        "--cache",
        default=str(Path.home() / ".cache" / "memsweep" / "device-wheels"),
        help="downloads and repacked wheels, kept between runs",
    )
    p.add_argument("--limit-mib", type=float, default=60.0, help="the most the wheels may weigh (60)")
    p.add_argument("--lean", action="store_true", help="leave MLflow's UI build out even if it fits")
    args = p.parse_args()
    out, cache, limit = Path(args.out), Path(args.cache), int(args.limit_mib * MiB)
    tree = tree_size(ROOT)
    if tree + limit > CALL_LIMIT:
        limit = CALL_LIMIT - tree
        print(f"the working tree weighs {mib(tree)}: the wheels get at most {mib(limit)}")

    pyproject = ROOT / "pyproject.toml"
    if (declared := {n: pyproject_pins(pyproject).get(n) for n in PINS}) != PINS:
        raise SystemExit(f"PINS {PINS} disagree with pyproject.toml's {declared}")
    installed = {n: importlib.metadata.version(n) for n in PINS}
    if installed != PINS:
        raise SystemExit(f"this Python has {installed}, not {PINS}: run me with the .venv's Python")

    def requires(name: str) -> list[str]:
        return importlib.metadata.requires(name) or []

    need = closure(service_roots(pyproject), importlib.metadata.version, requires)
    print(f"{len(need.carry)} distributions to carry; {len(need.from_image)} taken from the device image")
    wheels = download(need.carry, cache / "downloads")

    def build(optional: bool) -> tuple[dict[str, Path], dict[str, list[tuple[str, int, str]]]]:
        """name → the wheel to carry, and name → [(what was trimmed, compressed bytes, why)]."""
        chosen, notes = {}, {}
        for name, src in sorted(wheels.items()):
            trims = [
                ([pre], pre, why)
                for dist, pre, why in (TRIMS + IF_NEEDED if optional else TRIMS)
                if dist == name
            ]
            if SAME_FILES_AS.get(name) in wheels:
                holder = SAME_FILES_AS[name]
                why = f"the {holder} wheel holds every one of them, byte for byte"
                trims.append((same_files(src, wheels[holder]), "all but its .dist-info", why))
            with zipfile.ZipFile(src) as zf:
                packed = {i.filename: i.compress_size for i in zf.infolist()}
                big = max(i.file_size for i in zf.infolist()) >= LZMA_FROM
            if not trims and not big:
                chosen[name] = src
                continue
            chosen[name] = repack(src, [p for paths, _, _ in trims for p in paths], cache)
            notes[name] = [
                (what, sum(n for f, n in packed.items() if removes(f, paths)), why)
                for paths, what, why in trims
            ]
        return chosen, notes

    chosen, notes = build(optional=args.lean)
    total = sum(w.stat().st_size for w in chosen.values())
    if total > limit and not args.lean:
        print(f"{mib(total)} > {mib(limit)}: leaving out {', '.join(pre for _, pre, _ in IF_NEEDED)} too")
        chosen, notes = build(optional=True)
        total = sum(w.stat().st_size for w in chosen.values())

    sizes = {w: w.stat().st_size for w in chosen.values()}
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])
    parts: list[list[Path]] = [list(chosen.values())]
    if total > limit:
        halves = split(sizes, limit)
        if halves is None:
            print("largest wheels:\n" + "\n".join(f"  {mib(s):>10}  {w.name}" for w, s in largest[:6]))
            raise SystemExit(
                f"the wheels weigh {mib(total)}, over --limit-mib {mib(limit)} even split in two"
            )
        parts = halves
        print(f"{mib(total)} > {mib(limit)}: split into part1 and part2, one device call each")

    # write .whl/: the wheels and manifests (only what this tool writes is removed first)
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("*.whl"), *out.glob("part*/*.whl"), *out.glob("*.txt"), *out.glob("part*/*.txt")]:
        old.unlink()
    version_of = {w: n for n, w in chosen.items()}
    for i, part in enumerate(parts, 1):
        folder = out if len(parts) == 1 else out / f"part{i}"
        folder.mkdir(exist_ok=True)
        lines = [
            "# memsweep's service stack for the lent GPU machine (CPython 3.12, manylinux x86_64), made by",
            "# tools/device_wheels.py with the .venv's versions; tools/device_install.sh installs it",
        ]
        if len(parts) > 1:
            lines.append(f"# part {i} of {len(parts)}")
        for wheel in sorted(part, key=lambda w: version_of[w]):
            name = version_of[wheel]
            shutil.copy2(wheel, folder / wheel.name)
            lines.append(f"{name}=={need.carry[name]}  # {wheel.name}, {sizes[wheel]:,} bytes")
            lines += [
                f"#   trimmed {what} ({n:,} bytes compressed): {why}" for what, n, why in notes.get(name, [])
            ]
        (folder / "requirements.txt").write_text("\n".join(lines) + "\n")
        image = ["# what the carried wheels ask of the device image's own distributions (`name specifier`)"]
        for name, specs in sorted(need.from_image.items()):
            image += [f"{name}{spec}  # {by}" for spec, by in specs] or [name]
        (folder / "from-image.txt").write_text("\n".join(image) + "\n")

    print(f"\n{'bytes':>12}  wheel")
    for wheel, size in sorted(sizes.items(), key=lambda kv: kv[0].name):
        print(f"{size:>12,}  {wheel.name}")
    print(
        f"{total:>12,}  in all: {mib(total)} in {len(sizes)} wheels → {out}"
        + (" (2 parts)" if len(parts) > 1 else "")
    )
    for name, trimmed in notes.items():
        for what, n, why in trimmed:
            print(f"  trimmed {name}: {what} ({mib(n)} compressed) — {why}")
    if any(pre in what for _, pre, _ in IF_NEEDED for trimmed in notes.values() for what, _, _ in trimmed):
        print("  note: MLflow's UI does not render on the device (tracking and `mlflow server` work)")
    heaviest = max(sum(sizes[w] for w in part) for part in parts)
    print(f"a call carries {mib(heaviest + tree)} of {mib(CALL_LIMIT)} (the working tree: {mib(tree)})")
    if heaviest + tree > CALL_LIMIT:
        raise SystemExit("over what one device call carries: lower --limit-mib to split, or --lean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
