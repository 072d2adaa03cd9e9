"""The server's secrets stay with the server: its embedded Ray's processes (a worker runs a trial's code,
a plugin's among it) inherit neither the API's token nor the ledger's URL, and still get what a trial
needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

#: a driver that starts its embedded Ray as the server does, with the secrets in its environment: what
#: a task on a worker sees, what every process under the driver holds, and what the driver keeps
SECRETS_SEEN = """
import json, os, sys
from pathlib import Path
from service.core.settings import Settings
from service.study.nodes import ensure_ray

settings = Settings(home=Path(sys.argv[1]), ray_num_cpus=1)
ensure_ray(settings)
import ray
from service.core.processes import descends_from

def seen():
    names = ("MEMSWEEP_API_TOKEN", "memsweep_database_url", "MEMSWEEP_DATA_DIR", "RAY_DISABLE_FAILURE_SIGNAL_HANDLER")
    return {name: os.environ.get(name) for name in names}

environs = []
for proc in Path("/proc").glob("[0-9]*"):
    try:
        if descends_from(int(proc.name), os.getpid()):
            environs.append((proc / "environ").read_bytes().decode(errors="replace"))
    except OSError:
        pass
print(json.dumps({
    "worker": ray.get(ray.remote(seen).remote(), timeout=120),
    "processes": len(environs),
    "leaked": sum("a-secret-token" in e or "a-password" in e for e in environs),
    "driver": [os.environ.get("MEMSWEEP_API_TOKEN"), settings.api_token.get_secret_value()],
}), flush=True)
ray.shutdown()
"""


@pytest.mark.slow
def test_no_process_of_the_embedded_ray_inherits_the_servers_secrets(tmp_path: Path):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MEMSWEEP_"))}
    env = {
        **clean,
        "MEMSWEEP_API_TOKEN": "a-secret-token",
        "memsweep_database_url": f"postgresql://memsweep:a-password@db/ledger?{tmp_path}",  # any case reads
        "MEMSWEEP_DATA_DIR": str(tmp_path / "datasets"),
    }
    done = subprocess.run(
        [sys.executable, "-c", SECRETS_SEEN, str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2], env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["worker"] == {
        "MEMSWEEP_API_TOKEN": None,
        "memsweep_database_url": None,
        "MEMSWEEP_DATA_DIR": str(tmp_path / "datasets"),  # what a trial needs still reaches it
        "RAY_DISABLE_FAILURE_SIGNAL_HANDLER": "0",
    }
    assert seen["processes"] >= 3 and seen["leaked"] == 0, seen  # gcs, raylet, agents, workers
    assert seen["driver"] == ["a-secret-token", "a-secret-token"]  # the server keeps its own
