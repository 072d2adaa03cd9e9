"""`memsweep serve` for the end-to-end tests: the real server under uvicorn on loopback."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from service.cli.servers import LocalServer, free_port


class Server(LocalServer):
    """`memsweep serve` in its own process group on a free loopback port, with its own home."""

    def __init__(
        self,
        home: Path,
        mlflow_uri: str | None,
        token: str | None = None,
        environ: Mapping[str, str] | None = None,
        **settings: str,
    ) -> None:
        """`mlflow_uri` None: the server starts its own MLflow on a free port; `environ`: its environment
        (default this process's: what it has installed); `settings`: more MEMSWEEP_* variables, by their
        lower-case names."""
        env = {
            **(os.environ if environ is None else environ),
            "MEMSWEEP_HOME": str(home),
            "MEMSWEEP_RAY_NUM_CPUS": "2",
            "MEMSWEEP_MAX_PARALLEL_STUDIES": "2",
            **{f"MEMSWEEP_{k.upper()}": v for k, v in settings.items()},
        }
        env.pop("MEMSWEEP_API_TOKEN", None)
        env.pop("MEMSWEEP_MLFLOW_TRACKING_URI", None)
        if mlflow_uri:
            env["MEMSWEEP_MLFLOW_TRACKING_URI"] = mlflow_uri
        else:
            env["MEMSWEEP_MLFLOW_PORT"] = str(free_port())
        if token:
            env["MEMSWEEP_API_TOKEN"] = token
        super().__init__(free_port(), home / "serve.log", env)
        self.home = home
