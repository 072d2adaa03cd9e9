"""Per-trial overhead of the study engine: Ray scheduling, ledger writes and MLflow tracking.

Runs a grid of N very short trials (addition, T=10, N=8, 5 steps) through the real engine — embedded
Ray, a real MLflow server on loopback, a SQLite ledger — and compares the study's wall time with the
time the trials themselves spent training:

    overhead (slot-seconds per trial) = (wall × concurrency − Σ trial seconds) / N

Ray's start-up and the MLflow server's start-up are excluded (one-time costs); the final summary,
plots and the flush of every MLflow write are included.

    python benchmarks/engine_overhead.py [--trials 100] [--concurrency 2]
"""

from __future__ import annotations

import argparse
import socket
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=2)
    args = ap.parse_args()

    from service.engine import Engine, ensure_ray
    from service.settings import Settings
    from service.spec import StudySpec
    from service.tracking import start_mlflow_server, stop_mlflow_server

    home = Path(tempfile.mkdtemp(prefix="memsweep-bench-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uri, server = start_mlflow_server(home / "mlflow", port)
    try:
        settings = Settings(home=home, mlflow_tracking_uri=uri, ray_num_cpus=args.concurrency)
        engine = Engine(settings)
        ensure_ray(settings)
        lrs = [1e-3 * (1 + i / args.trials) for i in range(args.trials)]
        spec = StudySpec.model_validate(
            {
                "space": {"dims": {"lr": lrs}},
                "base": {
                    "task": "addition",
                    "seq_len": 10,
                    "n_train": 16,
                    "n_val": 16,
                    "hidden": 8,
                    "steps": 5,
                },
                "seeds": [1],
                "concurrency": args.concurrency,
            }
        )
        study = engine.create_study(spec)
        marks: dict[str, float] = {}
        tune = engine._tune

        def timed_tune(*a: object, **k: object) -> None:
            tune(*a, **k)  # type: ignore[arg-type]
            marks["tune_end"] = time.perf_counter()

        engine._tune = timed_tune  # type: ignore[method-assign]
        t0 = time.perf_counter()
        engine.run_study(study.id)
        wall = time.perf_counter() - t0
        trials = engine.ledger.trials(study.id)
        train = sum(t.seconds or 0.0 for t in trials)
        n = len(trials)
        overhead = (wall * args.concurrency - train) / n
        print(
            f"{n} trials at concurrency {args.concurrency}: study wall {wall:.1f} s, training {train:.1f} s in all"
        )
        tail = t0 + wall - marks["tune_end"]
        print(
            f"Ray Tune until the last trial ended: {wall - tail:.1f} s; then MLflow's queue, summary, plots: {tail:.1f} s"
        )
        print(
            f"overhead: {overhead:.3f} slot-seconds per trial (target ≤ 0.3), {3600 * n / wall:,.0f} trials per hour"
        )
    finally:
        stop_mlflow_server(server)


if __name__ == "__main__":
    main()
