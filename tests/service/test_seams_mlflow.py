"""MLflow's settings are a process's, set once at its start (`prepare_mlflow_process`, by each entry
point): building a `Tracker` leaves the environment alone, and a server or a command still gives up on
a tracking server that is down within seconds, unless MLFLOW_HTTP_* say otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.tracking.tracker import MLFLOW_FAIL_FAST

MLFLOW_SETTINGS = ("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", *MLFLOW_FAIL_FAST)


def test_a_tracker_leaves_the_environment_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from service.tracking.tracker import Tracker

    for name in MLFLOW_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    before = dict(os.environ)
    Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "seams", artifacts=tmp_path / "artifacts")
    assert dict(os.environ) == before


def settings_at_start(entry: str, **env: str) -> list[str]:
    """The MLflow settings of a fresh process once an entry point ran: `memsweep`'s main (a command
    that tracks nothing), or the app made without the CLI."""
    start = {
        "main": "from service.cli.commands import main; main(['presets'])",
        "app": "from service.api.app import create_app; create_app()",
    }[entry]
    code = (
        f"import os, sys; {start}; print(*(os.environ.get(n) for n in {MLFLOW_SETTINGS!r}), file=sys.stderr)"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_", "MEMSWEEP_"))}
    done = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stderr.strip().splitlines()[-1].split()


@pytest.mark.parametrize("entry", ["main", "app"])
def test_every_entry_point_sets_mlflows_fail_fast_settings_and_explicit_ones_win(entry: str, tmp_path: Path):
    home = {"MEMSWEEP_HOME": str(tmp_path)}
    assert settings_at_start(entry, **home) == ["true", "3", "1", "30"]
    assert settings_at_start(entry, MLFLOW_HTTP_REQUEST_MAX_RETRIES="7", **home) == ["true", "7", "1", "30"]
