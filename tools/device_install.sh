#!/bin/sh
# Install the service's wheels on a lent GPU machine and check that the service imports.
#
# Runs ON the device machine, from the repository root, in a call that carries the .whl folder that
# tools/device_wheels.py made here (or .whl/part1, then .whl/part2 in the next call while the machine
# is still warm, if the tool had to split the set). Source it, so that PYTHONPATH stays set:
#
#     . tools/device_install.sh && python3 -m service.cli serve ...
#
# It installs into /tmp/site (MEMSWEEP_DEVICE_SITE) with pip, offline and without dependencies, sets
# PYTHONPATH to /tmp/site and the repository root (absolute: Ray's workers and MLflow's server start
# in other folders), and imports Ray, Tune, MLflow and its server, Optuna, FastAPI, uvicorn,
# SQLAlchemy, Alembic, pydantic-settings and service.cli.commands: it exits non-zero naming the first
# import that fails. What the wheels ask of the image's own packages (.whl/from-image.txt) is checked
# too, as warnings. Idempotent: a folder whose manifest /tmp/site already holds is not installed again.

_dw_site=${MEMSWEEP_DEVICE_SITE:-/tmp/site}
_dw_stamps=$_dw_site/.memsweep-wheels
mkdir -p "$_dw_stamps" || exit 1
_dw_found=
for _dw_dir in .whl .whl/part1 .whl/part2; do
    ls "$_dw_dir"/*.whl >/dev/null 2>&1 || continue
    _dw_found=$_dw_dir
    _dw_tag=$(basename "$_dw_dir")
    if cmp -s "$_dw_dir/requirements.txt" "$_dw_stamps/$_dw_tag.txt"; then
        echo "device_install: $_dw_dir is already in $_dw_site"
        continue
    fi
    case $_dw_tag in  # a set of the other layout, left from an earlier call, no longer counts
        part*) rm -f "$_dw_stamps/.whl.txt" ;;
        *) rm -f "$_dw_stamps"/part*.txt ;;
    esac
    echo "device_install: installing $(ls "$_dw_dir"/*.whl | wc -l) wheels from $_dw_dir into $_dw_site"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$_dw_site" "$_dw_dir"/*.whl || { echo "device_install: pip failed on $_dw_dir" >&2; exit 1; }
    cp "$_dw_dir/from-image.txt" "$_dw_stamps/" 2>/dev/null
    cp "$_dw_dir/requirements.txt" "$_dw_stamps/$_dw_tag.txt" || exit 1
done
if [ -z "$_dw_found" ] && ! ls "$_dw_stamps"/*.txt >/dev/null 2>&1; then
    echo "device_install: no wheels: run tools/device_wheels.py here and carry .whl" >&2
    exit 1
fi

# a split set: every part must be in before the service can import
_dw_parts=$(sed -n 's/^# part [0-9]* of \([0-9]*\)$/\1/p' "$_dw_stamps"/part*.txt 2>/dev/null | head -n 1)
_dw_i=1
while [ -n "$_dw_parts" ] && [ "$_dw_i" -le "$_dw_parts" ]; do
    if [ ! -f "$_dw_stamps/part$_dw_i.txt" ]; then
        echo "device_install: part $_dw_i of $_dw_parts is not installed yet: carry .whl/part$_dw_i next"
        return 0 2>/dev/null || exit 0
    fi
    _dw_i=$((_dw_i + 1))
done

PYTHONPATH="$_dw_site:$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH
python3 - "$_dw_stamps/from-image.txt" <<'EOF' || exit 1
import importlib
import importlib.metadata as md
import sys
import traceback

from packaging.requirements import Requirement

for line in open(sys.argv[1]) if len(sys.argv) > 1 else []:
    spec, _, wanted_by = line.partition("#")
    if not spec.strip():
        continue
    req = Requirement(spec.strip())
    try:
        have = md.version(req.name)
    except md.PackageNotFoundError:
        print(f"device_install: warning: the image has no {req.name} ({wanted_by.strip()} needs it)")
        continue
    if not req.specifier.contains(have, prereleases=True):
        print(f"device_install: warning: the image's {req.name} {have} is not {req.specifier} ({wanted_by.strip()})")

MODULES = (
    "ray", "ray.tune", "mlflow", "mlflow.server", "optuna", "fastapi", "uvicorn", "sqlalchemy",
    "alembic", "pydantic_settings", "service.cli.commands",
)
for name in MODULES:
    try:
        importlib.import_module(name)
    except BaseException as e:  # noqa: BLE001 — name the import, whatever it raised
        traceback.print_exc()
        sys.exit(f"device_install: import {name} failed: {e!r}")
from ray import tune  # noqa: E402,F401

def version(name):
    try:
        return f"{name} {md.version(name)}"
    except md.PackageNotFoundError:
        return f"no {name}"


versions = ", ".join(version(n) for n in ("ray", "mlflow", "optuna", "fastapi", "torch"))
print(f"device_install: the service imports ({versions}; Python {sys.version.split()[0]})")
EOF
