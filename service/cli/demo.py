"""`memsweep demo`: the README's main job, end to end through the REST service.

It starts `memsweep serve` on loopback (its own process group, the embedded Ray and a local MLflow
server behind it, the SQLite ledger in MEMSWEEP_HOME), submits a small real preset study with the
Python client, follows its progress, prints the success table and every point of the study ranked (the
best configurations), and leaves the MLflow UI's URL. The study: Orhan & Pitkow's copy grid (§3.1.1) cut
to T = 50 and 2,000 steps, chain against orthogonal, 2 learning rates × 2 seeds. The API server it started is stopped at the end
(`--keep-serving` leaves it up); the MLflow server stays up for browsing, as after `memsweep run`.
A memsweep server already answering at the URL is used as it is.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from service.cli.console import (
    EXIT_FAILED,
    Failed,
    answer,
    build_spec,
    client_for,
    console,
    print_best,
    print_success,
)
from service.cli.servers import LocalServer, answers, free_port, port_free

DEMO_SPEC: dict[str, Any] = {
    "name": "demo-copy50",
    "preset": "orhan2020-copy500",
    "models": ["chain", "orthogonal"],
    "dims": {"lr": [1e-3, 3e-4], "scale": [1.0]},
    "seeds": [1, 2],
    "base": {"seq_len": 50, "steps": 2000, "eval_every": 500},
}


def run_demo(args: argparse.Namespace) -> int:
    from service.core.settings import get_settings

    settings = get_settings()
    port = args.port or settings.port
    url = f"http://127.0.0.1:{port}"
    server: LocalServer | None = None
    if answers(url):
        print(f"using the memsweep server already at {url}", file=sys.stderr)
    else:
        if not port_free("127.0.0.1", port):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
        log = settings.home / "demo-server.log"
        print(f"starting `memsweep serve` at {url} (log: {log}) …", file=sys.stderr)
        server = LocalServer(port, log)
        try:
            server.start()
        except RuntimeError as exc:
            raise Failed(f"error: {exc}") from None
    try:
        spec = build_spec(args, stored=DEMO_SPEC)
        with client_for(url) as client:
            study = answer(lambda: client.submit(spec))
            print(
                f"submitted study {study['id']} ({study['name']}): {study['counts']['total']} trials — "
                f"chain vs orthogonal on copy T={spec.base.get('seq_len')}",
                file=sys.stderr,
            )
            study = answer(lambda: client.wait(study["id"], poll=1.0, progress=True, console=console()))
            success = answer(lambda: client.success(study["id"]))
            # every point: a point has a trial at least (the README's orthogonal at lr 1e-3 ranks last)
            best = answer(lambda: client.best(study["id"], k=study["counts"]["total"]))
        print_success({"name": study["name"], "success": success})
        print_best(best, success["by_model"])
        print(
            f"\nstudy {study['id']}: {study['state']}"
            + (f" ({study['error']})" if study.get("error") else "")
        )
        run_url = study["mlflow"].get("run_url")
        print(f"MLflow UI (stays up): {run_url or study['mlflow'].get('experiment_url')}")
        if args.keep_serving and server is not None:
            print(f"memsweep server (left up, pid {server.proc.pid if server.proc else '?'}): {url}")
            print(f"  curl {url}/studies/{study['id']}/success")
            server = None  # not stopped below
        else:
            print(f"to query it over REST: `memsweep serve`, then `curl {url}/studies/{study['id']}/success`")
        return 0 if study["state"] == "done" else EXIT_FAILED
    finally:
        if server is not None:
            server.stop()
