"""The plugin examples (issue 38: examples/indrnn, examples/temporal-order), installed as a user installs
them, pass their own tests and memsweep's contract check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.plugin_dists import EXAMPLES, env_with, install, memsweep

pytestmark = pytest.mark.slow


def test_the_examples_installed_pass_their_own_tests_and_the_contract_check(tmp_path: Path):
    site = install(tmp_path / "site", EXAMPLES / "indrnn", EXAMPLES / "temporal-order")
    listed = memsweep("plugins", "check", paths=(site,))
    assert listed.returncode == 0, listed.stdout + listed.stderr[-2000:]
    assert "cell 'indrnn' (memsweep-indrnn==0.1.0+" in listed.stdout
    assert "task 'temporal-order' (memsweep-temporal-order==0.1.0+" in listed.stdout
    for package in ("indrnn", "temporal-order"):
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLES / package / "tests")],
            env=env_with(site), cwd=EXAMPLES / package, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        assert " passed" in done.stdout and " failed" not in done.stdout
