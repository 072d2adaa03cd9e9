"""Run a fixed grid through `memsweep run` and write every number it produced, bit for bit.

A refactor must move no number. This tool runs a fixed set of small studies (solo and fused; copy,
addition and psMNIST; the four initialisers; diverging, early-stopping and gated-cell trials) through
the real engine in a fresh home and writes, per trial, every evaluation, the final loss, the status,
the reason, the trained W and V (from each trial's MLflow artifact) and the analyses — floats as
`float.hex`, so two files are equal exactly when the numbers are. Times are left out.

    python tools/ledger_fingerprint.py --out before.json        # on the old tree
    python tools/ledger_fingerprint.py --out after.json         # on the new tree
    python tools/ledger_fingerprint.py --compare before.json after.json

It only uses the CLI, the SQLite ledger and MLflow's artifact folder, so it runs unchanged on older
trees; a field renamed between the two (`henrici` → `henrici_index`) is read under either name.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

COPY = {
    "task": "copy",
    "seq_len": 30,
    "n_train": 64,
    "n_val": 40,
    "hidden": 16,
    "steps": 60,
    "eval_every": 20,
}
ADDITION = {"task": "addition", "seq_len": 20, "n_train": 64, "n_val": 40, "hidden": 16, "steps": 60}
PSMNIST = {"task": "psmnist", "n_train": 64, "n_val": 48, "hidden": 8, "steps": 12, "eval_every": 6}


def _inits(lrs: list[float], scales: list[float] | None = None) -> dict[str, Any]:
    dims: dict[str, Any] = {"lr": lrs}
    if scales:
        dims["scale"] = scales
    return {
        name: {"fixed": {"init": name}, "dims": dims}
        for name in ("chain", "fbchain", "identity", "orthogonal")
    }


#: the fixed grid: (spec name, spec); every study runs once fused and once with fused: false
STUDIES: list[tuple[str, dict[str, Any]]] = [
    (
        "copy",
        {
            "space": {"models": _inits([1e-3, 3e-2], [1.0, 1.02])},
            "base": {**COPY, "eval_batch_size": 16},  # several validation batches
            "seeds": [1, 2],
        },
    ),
    (
        "addition",
        {
            "space": {"models": _inits([1e-3, 40.0])},
            "base": {**ADDITION, "eval_every": 20, "clip_norm": None, "early_stop_loss": 0.12},
            "seeds": [1, 2],
        },
    ),
    (
        "addition-adam",
        {
            "space": {"models": _inits([3e-3, 1e-2])},
            "base": {**ADDITION, "eval_every": 15, "optimizer": "adam"},
            "seeds": [3],
        },
    ),
    ("psmnist", {"space": {"models": _inits([1e-3])}, "base": PSMNIST, "seeds": [1, 2]}),
    (
        "cells",
        {
            "space": {
                "models": {
                    cell: {"fixed": {"cell": cell}, "dims": {"lr": [1e-3]}}
                    for cell in ("lstm", "gru", "janet", "nru", "srnn", "urnn", "sgornn")
                }
            },
            "base": {**ADDITION, "eval_every": 30},
            "seeds": [1],
        },
    ),
]

NUMBER_FIELDS = ("final_val_loss", "final_metric", "baseline_loss", "success_threshold")


def _hex(value: Any) -> Any:
    """Floats as hex (exact), recursively; everything else as it is."""
    if isinstance(value, float):
        return value.hex()
    if isinstance(value, list):
        return [_hex(v) for v in value]
    if isinstance(value, dict):
        return {k: _hex(v) for k, v in value.items()}
    return value


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _memsweep(tree: Path) -> list[str]:
    exe = tree / ".venv" / "bin" / "memsweep"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "service.cli"]


def run_study(
    tree: Path, home: Path, name: str, spec: dict[str, Any], fused: bool, env: dict[str, str]
) -> str:
    path = home / f"{name}-{'fused' if fused else 'solo'}.json"
    path.write_text(json.dumps({"name": f"{name}-{'fused' if fused else 'solo'}", **spec, "fused": fused}))
    out = subprocess.run(
        [*_memsweep(tree), "run", str(path), "--json"], env=env, cwd=tree, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise SystemExit(f"memsweep run {path} failed ({out.returncode}):\n{out.stderr[-4000:]}")
    study_id: str = json.loads(out.stdout.strip().splitlines()[-1])["study_id"]
    return study_id


def _artifact(home: Path, run_id: str | None) -> dict[str, Any] | None:
    if not run_id:
        return None
    hits = list((home / "mlflow" / "mlartifacts").glob(f"*/{run_id}/artifacts/recurrent_matrix.json"))
    return json.loads(hits[0].read_text()) if hits else None


def fingerprint(tree: Path) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="fingerprint-"))
    env = {
        **os.environ,
        "MEMSWEEP_HOME": str(home),
        "MEMSWEEP_MLFLOW_PORT": str(_free_port()),
        "PYTHONPATH": str(tree),
    }
    env.pop("MEMSWEEP_MLFLOW_TRACKING_URI", None)
    env.pop("MEMSWEEP_DATABASE_URL", None)
    studies = {}
    try:
        for name, spec in STUDIES:
            for fused in (True, False):
                studies[f"{name}-{'fused' if fused else 'solo'}"] = run_study(
                    tree, home, name, spec, fused, env
                )
    finally:  # `memsweep run` leaves its MLflow server up for browsing: not this one
        pid = home / "mlflow" / "mlflow-server.pid"
        if pid.exists():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pid.read_text()), signal.SIGTERM)
    db = sqlite3.connect(home / "ledger.db")
    db.row_factory = sqlite3.Row
    out: dict[str, Any] = {}
    for label, study_id in studies.items():
        rows = db.execute(
            "SELECT * FROM trials WHERE study_id = ? ORDER BY config_hash", (study_id,)
        ).fetchall()
        trials = {}
        for row in rows:
            r = dict(row)
            history = json.loads(r["history"]) if r["history"] else []
            for e in history:
                e.pop("seconds", None)
            matrices = _artifact(home, r.get("mlflow_run_id"))
            reason = r.get("reason") or ""
            trials[r["config_hash"]] = _hex(
                {
                    "model": r["model"],
                    "params": json.loads(r["params"]),
                    "status": "done" if r["status"] in ("done", "ok") else r["status"],
                    "reason": reason.splitlines()[0] if reason else None,
                    "success": None
                    if r.get("success") is None
                    else bool(r["success"]),  # a column before TRAINER_VERSION 4
                    "steps": r["steps"],
                    "henrici_index": r.get("henrici_index", r.get("henrici")),
                    "profile": json.loads(r["profile"]) if r.get("profile") else None,
                    "history": history,
                    **{k: r.get(k) for k in NUMBER_FIELDS},
                    "W": matrices.get("W") if matrices else None,
                    "V": matrices.get("V") if matrices else None,
                }
            )
        out[label] = trials
    return out


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Where b differs from a, one line per difference (empty: identical)."""
    diffs = []
    for label in sorted(set(a) | set(b)):
        ta, tb = a.get(label, {}), b.get(label, {})
        if set(ta) != set(tb):
            diffs.append(f"{label}: trial hashes differ ({len(ta)} vs {len(tb)} trials)")
            ta_by = {(t["model"], json.dumps(t["params"], sort_keys=True)): t for t in ta.values()}
            tb_by = {(t["model"], json.dumps(t["params"], sort_keys=True)): t for t in tb.values()}
            pairs = [(k, ta_by[k], tb_by[k]) for k in ta_by if k in tb_by]
        else:
            pairs = [(h, ta[h], tb[h]) for h in ta]
        for key, x, y in pairs:
            for field in sorted(set(x) | set(y)):
                if x.get(field) != y.get(field):
                    diffs.append(f"{label} {key}: {field} differs")
    return diffs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="write the fingerprint of this tree here")
    p.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]), help="the checkout to run")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two fingerprint files")
    args = p.parse_args()
    if args.compare:
        a, b = (json.loads(Path(f).read_text()) for f in args.compare)
        diffs = compare(a, b)
        n = sum(len(v) for v in a.values())
        if diffs:
            print("\n".join(diffs[:200]))
            print(f"{len(diffs)} differences over {n} trials")
            return 1
        print(f"identical: {len(a)} studies, {n} trials, every evaluation, final loss, status, W and V")
        return 0
    if not args.out:
        p.error("give --out FILE or --compare A B")
    result = fingerprint(Path(args.tree).resolve())
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True))
    print(f"{sum(len(v) for v in result.values())} trials in {len(result)} studies → {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
