"""The timed shapes: Orhan & Pitkow's three task grids (copy-500, addition-750, psMNIST), their points as
trial configs, the steps of a run at the paper's budget, and the bundles of K of their points."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from search_spaces import orhan2020
from search_spaces.space import SearchSpace
from trainers.config import Resolved, TrainConfig, apply_overrides, resolve
from trainers.schedule import Schedule

#: the Orhan grid's models: 462 points each for the chain models, 594 for the normal ones
ORHAN = {"copy500": orhan2020.COPY_500, "addition750": orhan2020.ADDITION_750, "psmnist": orhan2020.PSMNIST}
MNIST_TRAIN = {"train_test": 60_000, "train_val": 50_000}  # training images of the psMNIST split


def materialize(settings: dict[str, Any]) -> TrainConfig:
    """A grid point's flat settings → its trial config (as the service's `materialize` layers them)."""
    settings = dict(settings)
    base = TrainConfig(task=str(settings.pop("task")), cell=str(settings.pop("cell")))
    return apply_overrides(base, settings)


def paper_budget(resolved: Resolved) -> int:
    """Optimiser steps of one run at the preset's budget (its epochs over the full training set)."""
    tc = resolved.task_config
    n = getattr(tc, "n_train", None)
    if resolved.config.task == "psmnist":
        n = min(MNIST_TRAIN[tc.split], n or MNIST_TRAIN[tc.split])
    assert n is not None
    return Schedule.of(resolved.config, n).budget


@dataclass
class Shape:
    name: str
    cell: str
    space: SearchSpace
    points: dict[str, list[TrainConfig]]  # model → its grid's trial configs (paper settings)
    timing: dict[str, Any]  # what the timed configs change: device, small data sets, quick shapes
    budget: int  # steps a run at the paper's budget
    dims: str = ""  # T, N, B, d of the timed configs

    def configs(self, K: int) -> list[dict[str, Any]]:
        """K members of one layout: the chain model's points for K ≤ its size, else the identity's."""
        model = "chain" if len(self.points["chain"]) >= K else "identity"
        points = self.points[model]
        if len(points) < K:
            raise ValueError(f"no model of {self.name} has {K} points")
        out = []
        for c in sorted(points, key=lambda c: c.lr)[:K]:  # small bundles of the grid's smallest rates
            d = c.to_dict()
            d["task_params"] = {**d["task_params"], **self.timing.get("task_params", {})}
            if self.cell != "rnn":  # another cell at this shape: the grid's learning rates and seeds
                d["cell"], d["cell_params"] = self.cell, dict(self.timing.get("cell_params", {}))
            d.update({k: v for k, v in self.timing.items() if k not in ("task_params", "cell_params")})
            out.append(d)
        return out


def shapes(quick: bool, other_cell: str, device: torch.device, mnist: Path) -> list[Shape]:
    """rnn at each Orhan shape, then `other_cell` (none when '' or rnn) at copy-500's."""
    out = []
    for name, space in ORHAN.items():
        points: dict[str, list[TrainConfig]] = {}
        for model, settings in space.trials():
            points.setdefault(model, []).append(materialize(settings))
        first = resolve(points["chain"][0])
        timing = timing_settings(name, quick, device, mnist)
        out.append(Shape(name, "rnn", space, points, timing, paper_budget(first)))
    if other_cell and other_cell != "rnn":
        copy = out[0]
        timing = dict(copy.timing)
        if other_cell in ("vprnn", "sgornn") and timing.get("hidden", 100) % 2:
            timing["hidden"] = timing.get("hidden", 100) + 1
        timing["cell_params"] = {"hyper_size": 8} if quick and other_cell == "srnn" else {}
        out.append(Shape(copy.name, other_cell, copy.space, copy.points, timing, copy.budget))
    for shape in out:
        r = resolve(shape.configs(1)[0])
        task = r.make_task()
        shape.dims = f"T={task.seq_len} N={r.config.hidden} B={r.config.batch_size} d={task.input_dim}"
    return out


def timing_settings(name: str, quick: bool, device: torch.device, mnist: Path) -> dict[str, Any]:
    """What the timed configs change of the paper's: the device, no evaluation or early stop, small
    data sets (a step's cost does not depend on the set's size), tiny shapes in quick mode."""
    timing: dict[str, Any] = {
        "device": str(device),
        "steps": 10**6,
        "eval_every": 10**6,
        "early_stop_loss": None,
    }
    small = {"n_train": 256 if quick else 2048, "n_val": 16}
    if name == "psmnist":
        timing["task_params"] = {**small, "root": str(mnist)}
        if quick:
            timing["hidden"] = 4
    else:
        timing["task_params"] = {**small, **({"seq_len": 24} if quick else {})}
        if quick:
            timing["hidden"] = 8
    return timing
