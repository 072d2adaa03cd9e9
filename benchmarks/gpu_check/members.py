"""Check 1d: each fused cell's bundle members against their solo runs (`train_fused` against `train`):
every evaluation's losses and the trained W; a member beyond the tolerance whose own solo runs on the
CPU and on the device part beyond it too is `chaotic`, not failed (its training amplifies rounding)."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

import torch

from benchmarks.gpu_check.judge import CHAOS_FACTOR, MEMBER_RTOL, Check, deviation, failed, judged
from benchmarks.gpu_check.report import Report
from trainers import train
from trainers.cells import get_cell
from trainers.fused import FUSED_CELLS, train_fused
from trainers.result import TrialResult

Pairs = list[tuple[torch.Tensor, torch.Tensor]]

#: per fused cell: three members that differ in learning rate, seed and initial weights (tests/trainers/test_fused.py)
CELL_MEMBERS: dict[str, list[dict[str, Any]]] = {
    "rnn": [{"init": "chain"}, {"init": "orthogonal", "scale": 0.9}, {"init": "identity"}],
    "urnn": [{}, {"init": "chain"}, {"input_init": "initializer", "init": "identity"}],
    "crnn": [{}, {"init": "fbchain", "scale": 1.5}, {"scale": 1.2}],
    "vprnn": [{}, {"theta_bound": 0.5}, {}],
    "fastrnn": [{}, {"alpha_init": -2.0, "beta_init": 2.0}, {}],
    "sgornn": [{}, {"alpha_init": -2.0}, {"theta_bound": 0.3}],
    "srnn": [{}, {}, {}],
}
SMALL_SHAPE_FIELDS = {"rotations": 4, "hyper_size": 8}
MEMBER_LRS = ((1e-3, 1), (3e-3, 2), (5e-4, 3))  # (lr, seed) of the three members
VARIANTS = ("copy", "addition-adam")


def member_configs(cell: str, variant: str, device: torch.device, quick: bool) -> list[dict[str, Any]]:
    """The three members of `cell`'s small bundle: copy under RMSprop, or addition under Adam."""
    steps = 12 if quick else 30
    task_params = {"seq_len": 24 if quick else 30, "n_train": 128, "n_val": 64}
    if variant == "copy":
        base: dict[str, Any] = {"task": "copy", "hidden": 26, "batch_size": 12, "task_params": task_params}
    else:
        base = {"task": "addition", "hidden": 16, "optimizer": "adam", "task_params": task_params}
    names = {f.name for f in fields(get_cell(cell).Config)}
    shape = {k: v for k, v in SMALL_SHAPE_FIELDS.items() if k in names}
    return [
        {
            **base,
            "cell": cell,
            "lr": lr,
            "seed": seed,
            "steps": steps,
            "eval_every": steps // 3,
            "early_stop_loss": None,
            "device": str(device),
            "cell_params": {**shape, **extra},
        }
        for (lr, seed), extra in zip(MEMBER_LRS, CELL_MEMBERS[cell], strict=True)
    ]


def course(result: TrialResult) -> list[torch.Tensor]:
    """What a member-against-solo check compares of one run: every evaluation (train and validation
    loss) and the trained W."""
    out = [torch.tensor([e.train_loss, e.val_loss]) for e in result.history]
    return out + ([result.recurrent_matrix] if result.recurrent_matrix is not None else [])


def member_pairs(configs: list[dict[str, Any]]) -> tuple[list[Pairs], list[TrialResult], list[str]]:
    """Per member: its course in the bundle paired with its solo run's; the solo results; and what
    went wrong outright (a status or course that differs)."""
    fused = train_fused(configs)
    solo = [train(c) for c in configs]
    pairs: list[Pairs] = []
    bad = []
    for f, s in zip(fused, solo, strict=True):
        if (f.status, f.steps, len(f.history)) != (s.status, s.steps, len(s.history)) or f.status != "done":
            bad.append(f"{f.status}/{s.status} {f.reason or s.reason or ''}"[:120])
            pairs.append([])
            continue
        pairs.append(list(zip(course(f), course(s), strict=True)))
    return pairs, solo, bad


def rounding_spread(config: dict[str, Any], on_device: TrialResult) -> float:
    """How far two correct float32 runs of one config part: the solo run on the CPU against the solo
    run on the device (max rel, as `deviation`). Beyond the tolerance, the point's training amplifies
    rounding (a diverging or chaotic point): no float32 check of any two kernels can hold it to the
    tolerance over these steps, the bundle's included."""
    on_cpu = train({**config, "device": "cpu"})
    if on_cpu.status != on_device.status or len(on_cpu.history) != len(on_device.history):
        return math.inf
    return deviation(list(zip(course(on_cpu), course(on_device), strict=True)))[1]


def check_members(report: Report, device: torch.device, quick: bool) -> None:
    """`train_fused` against `train`, per fused cell, as the trainers set a GPU process up (TF32 off:
    `trainers.runtime.configure_process`); a failure off the CPU is judged again by `judge_chaos`."""
    section = f"bundle member vs solo run ({device.type})"
    for cell in sorted(FUSED_CELLS):
        for variant in VARIANTS:
            configs = member_configs(cell, variant, device, quick)
            name = f"{cell} {variant} (3 members, {configs[0]['steps']} steps)"
            try:
                per_member, solo, bad = member_pairs(configs)
                check = judged(section, name, [p for pairs in per_member for p in pairs], MEMBER_RTOL)
                if bad:
                    check.status, check.note = "FAIL", "; ".join(bad)
                elif check.status == "FAIL" and device.type != "cpu":
                    judge_chaos(check, per_member, configs, solo)
                report.add(check)
            except Exception as exc:
                report.add(failed(section, name, exc))


def judge_chaos(
    check: Check, per_member: list[Pairs], configs: list[dict[str, Any]], solo: list[TrialResult]
) -> None:
    """Each member beyond the tolerance against its own rounding spread (`rounding_spread`): where the
    solo run on the CPU parts from the solo run on the device by more than the tolerance too, and the
    bundle parts no more than CHAOS_FACTOR times that, the point is `chaotic` (reported with both
    figures, not a failure); else the bundle is wrong (FAIL)."""
    notes, failing = [], False
    for i, pairs in enumerate(per_member):
        rel = deviation(pairs)[1]
        if rel <= MEMBER_RTOL:
            continue
        spread = rounding_spread(configs[i], solo[i])
        # chaotic only where the bundle parts no further than rounding alone parts runs
        failing = failing or spread <= MEMBER_RTOL or rel > CHAOS_FACTOR * spread
        notes.append(
            f"member {i} (lr {configs[i]['lr']}, {configs[i]['cell_params']}): bundle vs solo "
            f"{rel:.3g}, solo on the CPU vs solo here {spread:.3g}"
        )
    check.status = "FAIL" if failing else "chaotic"
    check.note = "; ".join(notes)
