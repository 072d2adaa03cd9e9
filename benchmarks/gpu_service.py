"""The service on a GPU (issue 34): a study posted over REST trains its fused bundles on CUDA under
Ray, MLflow records it, and a killed Ray worker or a bundle too large for the card loses nothing.

On a lent GPU machine (bare: torch 2.11, Python 3.12; the service's wheels carried in `.whl/`, made
here by `tools/device_wheels.py`), from the repository's root:

    . tools/device_install.sh && python3 benchmarks/gpu_service.py --out $OUT

Here, the same script on the CPU against a CPU-only embedded Ray (tests/service/test_gpu_service.py
runs it): `python benchmarks/gpu_service.py --device cpu --out /tmp/gpu-service`.

What it does, in a fresh home, with the real `memsweep serve` on loopback (an embedded Ray that sees
the GPU, a local MLflow server, a SQLite ledger) driven by the Python client:

1. plans a study (`POST /studies?dry_run=true`, calibrated on the GPU) and submits it: Orhan &
   Pitkow's addition grid cut to T = 100 and 600 steps, chain against orthogonal, 11 learning rates ×
   6 scales each, `resources: {gpus: 0.5}` at concurrency 2, so that two bundles of 66 share the card;
2. SIGKILLs one Ray worker in the middle of a bundle, after its first evaluation (the unit goes back
   to pending and runs again);
3. on a GPU, submits a second study whose one bundle (`bundle_size`, at T = 750) is three times what
   a trainer may allocate (`MEMSWEEP_GPU_MEMORY_FRACTION`, 5 % of the card for the whole run): it runs
   out of memory, trains again in halves, and the study completes;
4. checks, printed as one table and written to OUT/checks.json (with OUT/plan.json, OUT/trials.json,
   OUT/server.log): every trial finished once with a result (done, or failed by a loss that is not
   finite, the protocol's rule), on CUDA, its provenance naming the card; the
   bundles graphed (captures counted); the memory a unit may use, measured by the probe on the GPU;
   packing's `member_bytes` model against the peak memory each bundle's process allocated; the plan's
   estimate against the wall time; one MLflow child run per trial, in its trial's status, with its
   provenance tags;
   the success table and the best configurations over REST; the killed worker's trials run again and
   recorded once; the split bundle's trials done once, in smaller bundles.

Exit status 0 when every check holds. The whole run is sized for one device call of at most 6 minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from search_spaces.orhan2020 import LEARNING_RATES  # noqa: E402
from service.core.processes import ray_workers  # noqa: E402

#: what a trainer may allocate of the card during the run: 4 GB of an H100's 80 (the second study's
#: bundle exceeds it on purpose). A unit of the first study (two share the card) is given a quarter of
#: it, 1 GB; its bundle of 66 needs about 0.45 by estimate: 0.18 by packing's model, plus the validation
#: buffer (up to 256 MiB) and cuBLAS's workspaces, which the model leaves out. 2 %, as before, gave a
#: unit 0.4 GB, less than that
MEMORY_FRACTION = 0.05


def main_study(device: str) -> dict[str, Any]:
    """Two bundles that share the device: 2 × 66 on a GPU, 2 × 4 on the CPU."""
    cuda = device == "cuda"
    return {
        "name": f"gpu-service-{device}",
        "preset": "orhan2020-addition750",
        "models": ["chain", "orthogonal"],
        # the paper's 11 learning rates (8e-4 to 3e-6) and 6 scales of both its α and λ grids: rates up
        # to 1e-2, as before, sent chains at scale 0.9-1.0 to a non-finite loss by step 50 (a `failed`
        # trial), which no check here is about
        "dims": {
            "lr": list(LEARNING_RATES) if cuda else [1e-3, 3e-4],
            "scale": [0.99, 1.0, 1.01, 1.02, 1.03, 1.05] if cuda else [1.0, 1.02],
        },
        "seeds": [1],
        # 3,000 steps: a graphed bundle of 66 at T = 100 takes a few ms a step (docs/gpu.md's timings), so
        # 600 left a second or two between a bundle's first evaluation and its end to kill its worker in
        "base": {"seq_len": 100, "steps": 3000, "eval_every": 500, "n_train": 4096, "n_val": 1024} if cuda
        else {"seq_len": 20, "steps": 90, "eval_every": 30, "n_train": 256, "n_val": 64},
        "resources": {"cpus": 1, "gpus": 0.5 if cuda else 0.0},
        "concurrency": 2,
    }  # fmt: skip


def oom_study(members: int) -> dict[str, Any]:
    """One bundle of `members` at T = 750 (forced by `bundle_size`): more than the cap allows."""
    return {
        "name": "gpu-service-out-of-memory",
        "preset": "orhan2020-addition750",
        "models": ["chain"],
        "dims": {"lr": [1e-4 * (1 + i / members) for i in range(members)], "scale": [1.0]},
        "seeds": [2],
        "base": {"steps": 20, "eval_every": 20, "n_train": 256, "n_val": 64},
        "resources": {"cpus": 1, "gpus": 1.0},
        "bundle_size": members,
    }


@dataclass
class Check:
    name: str
    ok: bool
    figure: str


def evaluated(study: dict[str, Any]) -> bool:
    """Whether a trial of the running study has evaluated (its pace gives the ETA) and trials still run:
    not "none finished yet", which a fast GPU bundle can end between two polls, never to hold again."""
    return study["counts"]["running"] > 0 and study.get("eta_seconds") is not None


def wait_for(what: str, condition: Callable[[], bool], timeout: float) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{what}: not within {timeout:g} s")
        time.sleep(0.2)
    return time.monotonic() - started


def member_bytes_of(spec: dict[str, Any]) -> int:
    """Packing's model of one member's memory, for the study's shape (every member shares it)."""
    from service.core.spec import StudySpec
    from service.study.packing import member_bytes
    from service.study.search import execution, grid_trials, study_space

    parsed = StudySpec.model_validate(spec)
    first = grid_trials(study_space(parsed, 10**6), execution(parsed))[0]
    return member_bytes(first.resolved)


def child_runs(tracking_uri: str, study: dict[str, Any]) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    exp, parent = study["mlflow"]["experiment_id"], study["mlflow"]["run_id"]
    return list(client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent}'", max_results=5000))


def trial_checks(label: str, trials: list[dict[str, Any]], runs: list[Any], device: str) -> list[Check]:
    """Every trial finished once with a result, where it should have trained, and its MLflow child run."""
    # a result: done, or failed by the protocol's own rule (a loss that is not finite, a result the papers
    # count as no success); never an infrastructure fault (`error`) or a trial left pending
    done = [t for t in trials if t["status"] == "done"]
    diverged = [t for t in trials if t["status"] == "failed" and "not finite" in (t["reason"] or "")]
    checks = [
        Check(
            f"{label}: every trial finished with a result",
            len(done) + len(diverged) == len(trials) and all(t["runs"] >= 1 for t in trials),
            f"{len(done)} done, {len(diverged)} failed (loss not finite), of {len(trials)}",
        )
    ]
    on = [t for t in trials if (t["device"] or "").startswith(device)]
    checks.append(Check(f"{label}: trained on {device}", len(on) == len(trials), f"{len(on)}/{len(trials)}"))
    if device == "cuda":
        cards = {(t["provenance"] or {}).get("gpu") for t in trials}
        checks.append(
            Check(f"{label}: provenance names the card", None not in cards, ", ".join(map(str, cards)))
        )
    status = {t["config_hash"]: {"done": "FINISHED", "failed": "FAILED"}.get(t["status"]) for t in trials}
    hashes = sorted(r.data.tags.get("memsweep.config_hash", "") for r in runs)
    matching = [r for r in runs if status.get(r.data.tags.get("memsweep.config_hash", "")) == r.info.status]
    checks.append(
        Check(
            f"{label}: one MLflow child run per trial, in its trial's status",
            hashes == sorted(status) and len(matching) == len(runs),
            f"{len(matching)} of {len(runs)} child runs FINISHED or FAILED as their trials, {len(trials)} trials",
        )
    )
    finished = [r for r in runs if r.info.status == "FINISHED"]
    tagged = all(
        {k.removeprefix("memsweep.provenance."): v for k, v in r.data.tags.items() if "provenance." in k}
        == next(
            t["provenance"] for t in trials if t["config_hash"] == r.data.tags.get("memsweep.config_hash")
        )
        for r in finished
    )
    checks.append(Check(f"{label}: MLflow tags carry each trial's provenance", tagged, ""))
    return checks


def stop_local_mlflow(home: Path) -> None:
    """The run's MLflow server outlives `memsweep serve` by design (its UI stays up to browse); the run
    stops its own (a session of its own, `service.tracking.server`), so that nothing of the run holds
    the machine's cores through the next step."""
    with contextlib.suppress(OSError, ValueError):
        os.killpg(int((home / "mlflow" / "mlflow-server.pid").read_text()), signal.SIGTERM)


def run(args: argparse.Namespace, checks: list[Check]) -> None:
    """The run, its checks appended to `checks` as they are made (what was made stays when it stops)."""
    from service.cli.servers import LocalServer, free_port
    from service.client import MemsweepClient

    device: str = args.device
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="gpu-service-"))
    token = secrets.token_hex(16)
    mlflow_port = free_port()
    env = {
        **os.environ,
        "MEMSWEEP_HOME": str(home),
        "MEMSWEEP_API_TOKEN": token,
        "MEMSWEEP_MLFLOW_PORT": str(mlflow_port),
        "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)])),
    }
    env.pop("MEMSWEEP_MLFLOW_TRACKING_URI", None)
    env.pop("MEMSWEEP_DATABASE_URL", None)
    env.pop("MEMSWEEP_RAY_ADDRESS", None)
    if device == "cuda":
        env["MEMSWEEP_GPU_MEMORY_FRACTION"] = str(args.memory_fraction)
    began = time.monotonic()
    server = LocalServer(free_port(), out / "server.log", env=env).start(timeout=180)
    try:
        with MemsweepClient(server.url, token=token, timeout=120) as client:
            wait_for("the server is ready (MLflow up)", lambda: bool(client.ready().get("ready")), 180)
            spec = main_study(device)
            t0 = time.monotonic()
            plan = client.plan(spec)
            plan_seconds = time.monotonic() - t0
            (out / "plan.json").write_text(json.dumps(plan, indent=1))
            memory = plan.get("unit_memory") or {}
            checks.append(Check(
                "the probe measured a unit's memory on the device", memory.get("device") == device,
                f"{memory.get('bytes', 0) / 2**30:,.2f} GiB a unit on {memory.get('device')} ({plan.get('node_type')})",
            ))  # fmt: skip
            sizes = {int(k): n for k, n in plan["unit_sizes"].items()}
            checks.append(Check(
                "the grid packs into two bundles that share the device",
                plan["bundles"] >= 2 and plan["slots"] >= 2,
                f"bundles {sizes}, {plan['slots']} slots; plan took {plan_seconds:.1f} s",
            ))  # fmt: skip

            t0 = time.monotonic()
            study = client.submit(spec)
            sid = study["id"]
            # a running trial has evaluated (its rate gives the ETA): its bundle is past its warm-up and,
            # on a GPU, replays its captured graph
            wait_for("a bundle has evaluated", lambda: evaluated(client.get(sid)), 300)
            time.sleep(args.kill_after)
            assert server.proc is not None
            workers = ray_workers(server.proc.pid)
            killed = workers[0] if workers else None
            if killed is not None:
                os.kill(killed, signal.SIGKILL)
            study = client.wait(sid, poll=1.0, timeout=args.timeout, progress=False)
            wall = time.monotonic() - t0
            trials = list(client.iter_trials(sid, history=False))
            (out / "trials.json").write_text(json.dumps(trials, indent=1, default=str))
            runs = child_runs(f"http://127.0.0.1:{mlflow_port}", study)
            checks.append(
                Check(
                    "the study is done", study["state"] == "done", f"{study['state']} {study['error'] or ''}"
                )
            )
            checks += trial_checks("main", trials, runs, device)
            again = [t for t in trials if t["runs"] > 1]
            checks.append(Check(
                "a Ray worker SIGKILLed mid-bundle: its trials ran again, recorded once",
                killed is not None and bool(again) and all(t["status"] in ("done", "failed") for t in again),
                f"killed pid {killed} of {len(workers)} workers; {len(again)} trials started twice",
            ))  # fmt: skip
            fused = [t for t in trials if int((t["provenance"] or {}).get("bundle_members", "1")) > 1]
            if device == "cuda":
                captures = [int(t["provenance"].get("cuda_graph_captures", "0")) for t in fused]
                checks.append(Check(
                    "the bundles trained as CUDA graphs", bool(captures) and min(captures) >= 1,
                    f"captures per member's bundle: {sorted(set(captures))}",
                ))  # fmt: skip
                per_member = member_bytes_of(spec)
                measured = [t["provenance"] for t in fused if "cuda_peak_bytes" in t["provenance"]]
                ratios = [
                    int(p["cuda_peak_bytes"]) / (per_member * int(p["bundle_members"])) for p in measured
                ]
                peaks = [int(p["cuda_peak_bytes"]) for p in measured]
                allotted = int(memory.get("bytes") or 0)
                # the property packing must keep: a bundle's peak within the memory the plan gave its unit;
                # the model's ratio is the finding (it leaves out a process's fixed part: the validation
                # buffer, up to trainers.fused.validation.EVAL_BUFFER_BYTES, and cuBLAS's workspaces)
                checks.append(Check(
                    "each bundle's peak within its unit's memory (and packing's model against it)",
                    bool(peaks) and max(peaks) <= allotted,
                    f"peak {max(peaks) / 2**20:,.0f} MiB of {allotted / 2**20:,.0f} allotted; peak ÷ "
                    f"(member_bytes × members) {min(ratios):.2f}–{max(ratios):.2f} (member_bytes "
                    f"{per_member / 2**20:,.2f} MiB)" if peaks else "no bundle",
                ))  # fmt: skip
            estimate = (plan.get("estimate") or {}).get("wall_seconds")
            checks.append(Check(
                "the plan's estimate against the wall time", estimate is not None,
                f"estimate {estimate:,.0f} s, took {wall:,.0f} s ({wall / estimate:.2f}×)" if estimate
                else f"no estimate; took {wall:,.0f} s",
            ))  # fmt: skip
            success = client.success(sid)
            best = client.best(sid, k=3)
            checks.append(Check(
                "the success table and the best configurations over REST",
                bool(success.get("by_model")) and bool(best),
                f"{(success.get('total') or {}).get('trials')} trials in {len(success.get('by_model') or {})} models, "
                f"{len(best)} best",
            ))  # fmt: skip

            if device == "cuda":
                import torch

                _, total = torch.cuda.mem_get_info()
                spec2 = oom_study(1)
                cap = args.memory_fraction * total
                members = max(4, math.ceil(3 * cap / member_bytes_of(spec2)))  # its model may overstate
                spec2 = oom_study(members)
                study2 = client.submit(spec2)
                study2 = client.wait(study2["id"], poll=1.0, timeout=args.timeout, progress=False)
                trials2 = list(client.iter_trials(study2["id"], history=False))
                runs2 = child_runs(f"http://127.0.0.1:{mlflow_port}", study2)
                checks += trial_checks("out of memory", trials2, runs2, device)
                sizes2 = sorted(
                    {
                        int(t["provenance"]["bundle_members"])
                        for t in trials2
                        if "bundle_members" in (t["provenance"] or {})
                    }
                )
                # planned as one bundle of all (`bundle_size`), trained to the end in smaller ones: the split
                # (the worker's "ran out of memory" line is in Ray's logs: the server's Ray keeps them)
                planned2 = ((study2.get("plan") or {}).get("planned") or {}).get("unit_sizes") or {}
                checks.append(Check(
                    "a bundle larger than the card's cap trained again in halves",
                    planned2 == {str(members): 1} and bool(sizes2) and max(sizes2) < members,
                    f"planned {planned2}, {members * member_bytes_of(spec2) / 2**30:,.1f} GiB by the model, cap "
                    f"{cap / 2**30:,.1f} GiB: trained as bundles of {sizes2}",
                ))  # fmt: skip
    except Exception as exc:  # a check of its own, so the table still prints
        checks.append(Check("the run went to its end", False, f"{type(exc).__name__}: {exc}"[:400]))
    finally:
        server.stop()
        stop_local_mlflow(home)
    checks.append(Check("the whole run", True, f"{time.monotonic() - began:,.0f} s"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-service-out")))
    ap.add_argument("--memory-fraction", type=float, default=MEMORY_FRACTION, dest="memory_fraction")
    ap.add_argument(
        "--kill-after", type=float, default=0.0, dest="kill_after", help="seconds after its first evaluation"
    )
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a study may take")
    args = ap.parse_args()
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device here: run it on a GPU machine, or with --device cpu")

    # the device step's `timeout` sends SIGTERM: stop the server (its Ray and MLflow, in a session of
    # their own) and print what was checked, rather than die leaving them on the card
    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    checks: list[Check] = []
    try:
        run(args, checks)
    except KeyboardInterrupt as exc:
        checks.append(Check("the run went to its end", False, f"stopped by {exc}"))
    width = max(len(c.name) for c in checks)
    for c in checks:
        print(f"{'ok  ' if c.ok else 'FAIL'}  {c.name:<{width}}  {c.figure}")
    (args.out / "checks.json").write_text(json.dumps([c.__dict__ for c in checks], indent=1))
    failed = [c for c in checks if not c.ok]
    print(f"{len(checks) - len(failed)} of {len(checks)} checks hold")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
