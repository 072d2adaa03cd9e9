"""End-to-end throughput and per-trial overhead of the study engine, fused bundles against one trial
per Ray trial, side by side in one run.

Runs a grid of N very short trials (addition, T=10, N=8, 5 steps; the points differ in learning
rate) through the real engine — embedded Ray, a real MLflow server on loopback, a SQLite ledger —
once with fusing off (one trial per Ray trial) and once with the default packing into fused
bundles, each study in its own home so that nothing is reused, and prints for each:

    trials per hour      = N / study wall time × 3600
    overhead (slot-s)    = (wall × concurrency − Σ training time) / N

where the training time is each Ray unit's: a solo trial's seconds, a bundle's longest member (a
bundle's members train together). Ray's and the MLflow server's start-up are excluded (one-time
costs); the final summary, plots and the flush of every MLflow write are included.

    python benchmarks/engine_overhead.py [--trials 100] [--concurrency 2] [--rounds 1]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path


def run_study(uri: str, home: Path, trials: int, concurrency: int, fused: bool) -> dict[str, float]:
    from service.core.settings import Settings
    from service.core.spec import StudySpec
    from service.study.engine import Engine
    from service.study.packing import pack
    from service.tracking.tracker import prepare_mlflow_process

    prepare_mlflow_process()  # as memsweep's own entry points
    engine = Engine(Settings(home=home, mlflow_tracking_uri=uri, ray_num_cpus=concurrency))
    lrs = [1e-3 * (1 + i / trials) for i in range(trials)]
    spec = StudySpec.model_validate(
        {
            "name": f"overhead-{'fused' if fused else 'solo'}",
            "space": {"dims": {"lr": lrs}},
            "base": {"task": "addition", "seq_len": 10, "n_train": 16, "n_val": 16, "hidden": 8, "steps": 5},
            "seeds": [1],
            "concurrency": concurrency,
            "fused": fused,
        }
    )
    study = engine.create_study(spec)
    planned = [t.spec() for t in engine.ledger.trials(study.id)]
    units = pack(planned, fused=spec.fuses, slots=concurrency)  # the engine's own packing, to time each unit
    t0 = time.perf_counter()
    summary = engine.run_study(study.id)
    wall = time.perf_counter() - t0
    seconds = {t.config_hash: t.seconds or 0.0 for t in engine.ledger.trials(study.id)}
    train = sum(max(seconds[m.config_hash] for m in unit.members) for unit in units)
    n = len(planned)
    return {
        "n": n,
        "units": len(units),
        "wall": wall,
        "train": train,
        "tail": sum(v for k, v in summary["seconds"].items() if k != "ray_tune"),
        "per_hour": 3600 * n / wall,
        "overhead": (wall * concurrency - train) / n,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="studies per mode, interleaved; medians shown")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("service.study.engine").setLevel(logging.INFO)  # where each study's time went

    from service.cli.servers import free_port
    from service.core.settings import Settings
    from service.study.nodes import ensure_ray
    from service.tracking.server import start_mlflow_server, stop_mlflow_server

    home = Path(tempfile.mkdtemp(prefix="memsweep-bench-"))
    uri, server = start_mlflow_server(home / "mlflow", free_port())
    try:
        ensure_ray(Settings(home=home, mlflow_tracking_uri=uri, ray_num_cpus=args.concurrency))
        runs: dict[str, list[dict[str, float]]] = {"one trial per Ray trial": [], "fused bundles": []}
        for r in range(args.rounds):
            for label, fused in (("one trial per Ray trial", False), ("fused bundles", True)):
                runs[label].append(
                    run_study(uri, home / f"{r}-{fused}", args.trials, args.concurrency, fused)
                )
        print(f"{args.trials} trials of 5 steps, concurrency {args.concurrency}, median of {args.rounds}:")
        print(
            f"{'mode':<26}{'Ray units':>10}{'wall s':>9}{'train s':>9}{'tail s':>8}"
            f"{'trials/hour':>13}{'overhead slot-s':>17}"
        )
        for label, results in runs.items():

            def med(key: str, results: list[dict[str, float]] = results) -> float:
                return statistics.median(x[key] for x in results)

            print(
                f"{label:<26}{med('units'):>10.0f}{med('wall'):>9.1f}{med('train'):>9.1f}{med('tail'):>8.1f}"
                f"{med('per_hour'):>13,.0f}{med('overhead'):>17.3f}"
            )
        print("tail: after Ray Tune's last trial: MLflow's queue, the summary and the plots")
    finally:
        stop_mlflow_server(server)


if __name__ == "__main__":
    main()
