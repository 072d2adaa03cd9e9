"""Check 1c: every registered cell × copy, addition and psMNIST trains a few steps through
`trainers.train` on the device, with finite losses."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_check.judge import Check, failed
from benchmarks.gpu_check.report import Report
from trainers import train
from trainers.cells import list_cells

#: cell settings under which every cell trains on every task at tiny shapes (tests/trainers/test_contract.py)
CELL_PARAMS: dict[str, dict[str, Any]] = {
    "srnn": {"hyper_size": 8},
    "nru": {"memory_size": 16, "heads": 4},
    "rnn": {"init": "orthogonal"},
}


def cell_params(cell: str, task: str) -> dict[str, Any]:
    """The cell's settings for the few-steps check: nru without LayerNorm overflows float32 within
    three steps at psMNIST's 784 steps (its memory is unbounded; on the CPU too), so it takes it there."""
    params = dict(CELL_PARAMS.get(cell, {}))
    if cell == "nru" and task == "psmnist":
        params["layer_norm"] = True
    return params


def task_params(task: str, mnist: Path, quick: bool) -> dict[str, Any]:
    if task == "psmnist":
        return {"root": str(mnist), "n_train": 64, "n_val": 32}
    return {"seq_len": 24 if quick else 30, "n_train": 64, "n_val": 32}


def check_cells_train(report: Report, device: torch.device, mnist: Path, quick: bool) -> None:
    section = f"every cell trains on {device.type}"
    tasks = ("copy", "addition") if quick else ("copy", "addition", "psmnist")
    for cell in list_cells():
        for task in tasks:
            config = {
                "task": task,
                "cell": cell,
                "hidden": 8 if quick else 12,
                "seed": 1,
                "steps": 3,
                "eval_every": 3,
                "early_stop_loss": None,
                "device": str(device),
                "task_params": task_params(task, mnist, quick),
                "cell_params": cell_params(cell, task),
            }
            try:
                r = train(config)
                losses = [e.train_loss for e in r.history] + [e.val_loss for e in r.history]
                ok = r.status == "done" and r.steps == 3 and losses and all(math.isfinite(v) for v in losses)
                ok = ok and r.device == str(device)
                note = f"final val loss {r.history[-1].val_loss:.4g}" if r.history else (r.reason or "")
                report.add(Check(section, f"{cell} × {task}", "pass" if ok else "FAIL", note=note))
            except Exception as exc:
                report.add(failed(section, f"{cell} × {task}", exc))
