"""benchmarks/gpu_service.py, the device script of issue 34, dry-run on the CPU as the test suite can:
the real server on loopback, an embedded Ray, MLflow, two bundles sharing the node, a Ray worker
SIGKILLed mid-bundle. On a lent GPU it also trains on CUDA, graphed, and splits a bundle that runs
out of memory (that part is tested here by a fake allocator: tests/trainers/test_fused.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_service.py"


def test_the_device_script_runs_its_study_on_the_cpu_and_every_check_holds(tmp_path: Path):
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(out)],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    checks = {c["name"]: c for c in json.loads((out / "checks.json").read_text())}
    assert all(c["ok"] for c in checks.values()), checks
    for name in (
        "the probe measured a unit's memory on the device",
        "the grid packs into two bundles that share the device",
        "main: every trial finished with a result",
        "main: one MLflow child run per trial, in its trial's status",
        "a Ray worker SIGKILLed mid-bundle: its trials ran again, recorded once",
        "the success table and the best configurations over REST",
    ):
        assert name in checks, sorted(checks)
    trials = json.loads((out / "trials.json").read_text())
    assert len(trials) == 8 and {t["device"] for t in trials} == {"cpu"}
    assert (out / "plan.json").exists() and (out / "server.log").stat().st_size > 0
