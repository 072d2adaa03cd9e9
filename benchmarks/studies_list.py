"""What `GET /studies` costs: one call in-process, and 200 concurrent calls against the real server.

Builds a home with N finished studies (default 25) in a SQLite ledger, each as `memsweep demo` makes
one — Orhan & Pitkow's copy grid cut down to 2 models × 2 learning rates × 2 seeds, its plan recorded,
every trial's result written with 20 evaluations — then measures

    in-process   the median of 30 `GET /studies` through FastAPI's TestClient (no network), and the
                 answer's size;
    server CPU   the server process's CPU time per `GET /studies`, over 200 calls one after the other
                 (user + system, from /proc: steadier than wall time on a busy machine);
    concurrent   `--calls` (default 200) `GET /studies` sent at once over `--calls` connections to
                 `memsweep serve` on a loopback port (MEMSWEEP_MAX_PARALLEL_STUDIES=0: it runs no
                 study), each call's latency from the moment all were sent; `--rounds` rounds, each
                 beside the same burst of `GET /health` (no query: the floor of the server and of
                 this client, which share the machine).

Run it on two checkouts (`git stash` or `git archive REV | tar -x -C DIR`, then `PYTHONPATH=DIR`) for a
before and after on the same machine.

    python benchmarks/studies_list.py [--studies 25] [--calls 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path


def populate(home: Path, n: int) -> None:
    from service.core.settings import Settings
    from service.core.spec import StudySpec
    from service.planning.record import record_plan
    from service.study.engine import Engine
    from trainers import Evaluation, TrialResult

    engine = Engine(Settings(home=home, max_parallel_studies=0, mlflow_tracking_uri="http://127.0.0.1:9"))
    for i in range(n):
        spec = StudySpec.model_validate(
            {
                "name": f"bench-{i:02d}",
                "preset": "orhan2020-copy500",
                "models": ["chain", "orthogonal"],
                "dims": {"lr": [1e-3, 3e-4], "scale": [1.0]},
                "base": {"seq_len": 50, "steps": 2000, "eval_every": 100},
                "seeds": [1, 2],
            }
        )
        study = engine.create_study(spec)
        record_plan(engine, study.id, calibrate=False)
        for t in engine.ledger.trials(study.id):
            loss = 0.05 if t.model == "chain" else 3.0
            history = [Evaluation(100 * k, float(k), loss * 2, loss, None, 0.0) for k in range(1, 21)]
            result = TrialResult(
                status="done",
                final_val_loss=loss,
                baseline_loss=3.2,
                steps=2000,
                seconds=9.0,
                history=history,
            )
            engine.ledger.start_trial(study.id, t.config_hash)
            engine.ledger.finish_trial(t.id, result)
        engine.ledger.update_study(study.id, state="done")


def in_process(home: Path, calls: int = 30) -> dict[str, float]:
    from fastapi.testclient import TestClient

    from service.api import create_app
    from service.core.settings import Settings

    settings = Settings(home=home, max_parallel_studies=0, mlflow_tracking_uri="http://127.0.0.1:9")
    with TestClient(create_app(settings)) as c:
        first = c.get("/studies")
        assert first.status_code == 200, first.text
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            c.get("/studies").raise_for_status()
            times.append(time.perf_counter() - t0)
    return {
        "median_ms": statistics.median(times) * 1e3,
        "bytes": len(first.content),
        "items": len(first.json()["items"]),
    }


async def burst(url: str, path: str, calls: int) -> tuple[float, list[float]]:
    import httpx

    limits = httpx.Limits(max_connections=calls, max_keepalive_connections=calls)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:
        start = time.perf_counter()

        async def one() -> float:
            r = await client.get(path)
            r.raise_for_status()
            return time.perf_counter() - start

        latencies = await asyncio.gather(*(one() for _ in range(calls)))
        return time.perf_counter() - start, sorted(latencies)


def server_cpu(pid: int) -> float:
    """Seconds of CPU the process has used (user + system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def against_server(home: Path, calls: int, rounds: int) -> tuple[float, list[dict[str, dict[str, float]]]]:
    import httpx

    from service.cli.servers import LocalServer, free_port

    env = {
        **os.environ,
        "MEMSWEEP_HOME": str(home),
        "MEMSWEEP_MAX_PARALLEL_STUDIES": "0",
        "MEMSWEEP_MLFLOW_TRACKING_URI": "http://127.0.0.1:9",
    }
    server = LocalServer(free_port(), home / "server.log", env).start()
    assert server.proc is not None
    out = []
    try:
        with httpx.Client(base_url=server.url) as c:
            for _ in range(20):
                c.get("/studies").raise_for_status()
            before, n = server_cpu(server.proc.pid), 200
            for _ in range(n):
                c.get("/studies").raise_for_status()
            cpu = (server_cpu(server.proc.pid) - before) / n
        for _ in range(rounds):
            result = {}
            for path in ("/health", "/studies"):
                wall, latencies = asyncio.run(burst(server.url, path, calls))
                result[path] = {
                    "wall_s": wall,
                    "median_s": statistics.median(latencies),
                    "p90_s": latencies[int(0.9 * (len(latencies) - 1))],
                }
            out.append(result)
    finally:
        server.stop()
    return cpu, out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--studies", type=int, default=25)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="memsweep-list-") as tmp:
        home = Path(tmp)
        populate(home, args.studies)
        one = in_process(home)
        print(
            f"GET /studies, {one['items']:.0f} studies, in-process: {one['median_ms']:.1f} ms median, "
            f"{one['bytes'] / 1024:.1f} KiB"
        )
        cpu, rounds = against_server(home, args.calls, args.rounds)
        print(f"GET /studies, the server's CPU per call: {cpu * 1e3:.1f} ms")
        for i, r in enumerate(rounds, 1):
            print(
                f"{args.calls} concurrent calls, round {i}: "
                + "; ".join(
                    f"{path} median {x['median_s']:.2f} s, p90 {x['p90_s']:.2f} s, all in {x['wall_s']:.2f} s"
                    for path, x in r.items()
                )
            )


if __name__ == "__main__":
    main()
