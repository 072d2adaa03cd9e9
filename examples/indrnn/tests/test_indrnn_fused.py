"""The fused form: each member of a bundle computes, bit for bit, what it computes alone — the scan on
its slice, and a whole training run (`trainers.fused.train_fused` against `trainers.train`)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from trainers import TrialResult, train
from trainers.fused import train_fused
from trainers.kernels import Workspace

from memsweep_indrnn.scan import FusedIndScan, IndScan

pytestmark = pytest.mark.numerics  # memsweep's CI runs these under every numerics mode


@pytest.mark.parametrize("last", [False, True])
def test_fused_scan_is_each_members_scan(last: bool) -> None:
    """Float32, B·N = 16·25 (torch's vectorised body and scalar tail both occur in every member's rows),
    twice through one workspace: states, drive gradients and ∂u against `IndScan` on each member."""
    g = torch.Generator().manual_seed(0)
    K, T, B, N = 3, 9, 16, 25
    ws = Workspace()
    for _ in range(2):
        drives = [torch.randn(T, B, N, generator=g).requires_grad_() for _ in range(K)]
        u = torch.empty(K, N).uniform_(-1.1, 1.1, generator=g).requires_grad_()
        outs = FusedIndScan.apply(last, ws, u, *drives)
        weights = [torch.randn_like(o) for o in outs]
        sum((o * q).sum() for o, q in zip(outs, weights, strict=True)).backward()
        for k, drive in enumerate(drives):
            d_k, u_k = drive.detach().clone().requires_grad_(), u.detach()[k].clone().requires_grad_()
            hs = IndScan.apply(d_k, u_k)
            ref = hs[-1] if last else hs
            (ref * weights[k]).sum().backward()
            assert torch.equal(outs[k], ref), k
            assert (
                drive.grad is not None
                and u.grad is not None
                and d_k.grad is not None
                and u_k.grad is not None
            )
            assert torch.equal(drive.grad, d_k.grad) and torch.equal(u.grad[k], u_k.grad), k


# ----- whole runs ------------------------------------------------------------------------------------

SCHEDULE = {"steps": 60, "eval_every": 20, "early_stop_loss": None}
# hidden 25 with batch 16: 400 states a step
ADDITION = {"task": "addition", "hidden": 25, "task_params": {"seq_len": 30, "n_train": 128, "n_val": 64}}
COPY = {"task": "copy", "hidden": 25, "task_params": {"seq_len": 30, "n_train": 128, "n_val": 64}}
# members differ in learning rate, seed and every field that sets only initial weights or the bound
MEMBERS: list[dict[str, Any]] = [
    {"lr": 1e-2, "seed": 1, "cell_params": {"T": 30}},
    {"lr": 3e-2, "seed": 2, "cell_params": {"T": 10, "mag": 1.5, "recurrent_init": "first_layer"}},
    {"lr": 5e-3, "seed": 3, "cell_params": {"T": 100, "input_std": 0.3}},
]


def assert_same_run(fused: TrialResult, solo: TrialResult) -> None:
    """Member vs solo, with `==`: every evaluation's losses and metric, the outcome, trained W and u."""
    assert (fused.status, fused.steps, fused.early_stopped) == (solo.status, solo.steps, solo.early_stopped)
    assert [(e.step, e.train_loss, e.val_loss, e.metric) for e in fused.history] == [
        (e.step, e.train_loss, e.val_loss, e.metric) for e in solo.history
    ]
    assert fused.recurrent_matrix is not None and solo.recurrent_matrix is not None
    assert fused.input_matrix is not None and solo.input_matrix is not None
    assert torch.equal(fused.recurrent_matrix, solo.recurrent_matrix)
    assert torch.equal(fused.input_matrix, solo.input_matrix)


@pytest.mark.parametrize(
    ("base", "common"),
    [
        (ADDITION, {"optimizer": "adam"}),  # last-step readout
        (COPY, {"optimizer": "rmsprop", "cell_params_extra": {"bias": False}}),  # a readout at every step
    ],
    ids=["addition-adam", "copy-rmsprop-nobias"],
)
def test_each_member_trains_as_it_would_alone(base: dict[str, Any], common: dict[str, Any]) -> None:
    extra = common.pop("cell_params_extra", {})
    configs = [
        {**base, **SCHEDULE, **common, **m, "cell": "indrnn", "cell_params": {**m["cell_params"], **extra}}
        for m in MEMBERS
    ]
    fused = train_fused(configs)
    solo = [train(c) for c in configs]
    for f, s in zip(fused, solo, strict=True):
        assert f.status == "done" and len(f.history) == 3, f.reason
        assert_same_run(f, s)
    # the members differ (a bundle that trained one network K times would pass the above too)
    assert (
        len(
            {float(torch.diagonal(f.recurrent_matrix).sum()) for f in fused if f.recurrent_matrix is not None}
        )
        == 3
    )


def test_members_must_share_the_bias() -> None:
    configs = [{**ADDITION, **SCHEDULE, **m, "cell": "indrnn"} for m in MEMBERS[:2]]
    configs[1] = {**configs[1], "cell_params": {"bias": False}}
    with pytest.raises(ValueError, match=re.escape("differ in 'cell_params.bias'")):
        train_fused(configs)
