"""`backend="persistent"` for the Elman family (issue 37), on the CPU under Triton's interpreter: a solo
trial through the persistent kernel as a bundle of one, a bundle's members through the same kernel,
and the refusal where the kernel cannot run. The kernel's own arithmetic: test_persistent_kernel.py."""

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.trainers.interpreted import persistent_kernel

persistent = persistent_kernel()  # before anything imports the kernel without the interpreter

from tests.trainers.test_fused import assert_same_run  # noqa: E402
from trainers import train  # noqa: E402
from trainers.config import resolve  # noqa: E402
from trainers.fused import check_fusable, fusable_key, train_fused  # noqa: E402

pytestmark = pytest.mark.numerics

# tiny: the interpreter runs each program's T steps as numpy operations, one program after another
TASKS = {
    "addition": {"task": "addition", "task_params": {"seq_len": 8, "n_train": 32, "n_val": 16}},  # relu, last
    "copy": {"task": "copy", "task_params": {"seq_len": 21, "n_train": 32, "n_val": 16}},  # elu, every step
}
SCHEDULE = {"hidden": 12, "steps": 4, "eval_every": 2, "early_stop_loss": None}
MEMBERS = [  # learning rate, seed, initialiser and scale differ; chain is row-major, orthogonal column-major
    {"lr": 3e-3, "seed": 1, "cell_params": {"init": "chain", "scale": 1.0}},
    {"lr": 1e-3, "seed": 2, "cell_params": {"init": "orthogonal", "scale": 0.9}},
]


def configs(cell, task, backend, members=MEMBERS):
    out = []
    for m in members:
        params = {**m["cell_params"], "backend": backend} if cell != "vprnn" else {"backend": backend}
        out.append({**TASKS[task], **SCHEDULE, **m, "cell": cell, "cell_params": params})
    return out


@pytest.mark.parametrize(
    ("cell", "task"), [("rnn", "addition"), ("rnn", "copy"), ("urnn", "copy"), ("vprnn", "addition")]
)
def test_a_member_of_a_persistent_bundle_is_its_solo_persistent_run_bit_for_bit(cell, task):
    """`train_fused` against `train`, each with backend="persistent": the whole loop (every evaluation's
    train and validation loss, the trained W and V), bit for bit — a solo run is a bundle of one
    through the same kernel. urnn: the projection after each step; vprnn: W from rotations."""
    cfgs = configs(cell, task, "persistent")
    fused = train_fused(cfgs)
    for f, c in zip(fused, cfgs, strict=True):
        s = train(c)
        assert f.status == s.status == "done", (f.reason, s.reason)
        assert len(s.history) == 2
        assert_same_run(f, s)


@pytest.mark.parametrize(("cell", "task"), [("rnn", "addition"), ("rnn", "copy"), ("vprnn", "addition")])
def test_persistent_follows_the_scan_within_float32_rounding(cell, task):
    """The kernel sums in another order than the scan (one tl.dot per step, not addmm; ∂W summed over
    time on chip), so its runs are not the scan's bit for bit: over the loop's first steps they stay
    within float32 rounding of them (losses and the trained W)."""
    for p, s in zip(
        train_fused(configs(cell, task, "persistent")), train_fused(configs(cell, task, "scan")), strict=True
    ):
        assert p.status == s.status == "done"
        for a, b in zip(p.history, s.history, strict=True):
            assert abs(a.train_loss - b.train_loss) <= 1e-5 * abs(b.train_loss), (
                a.step,
                a.train_loss,
                b.train_loss,
            )
            assert abs(a.val_loss - b.val_loss) <= 1e-5 * abs(b.val_loss), (a.step, a.val_loss, b.val_loss)
        w_p, w_s = p.recurrent_matrix, s.recurrent_matrix
        assert (w_p - w_s).abs().max() <= 1e-5 * w_s.abs().max()
        assert not torch.equal(w_p, w_s)  # the kernel ran: another order of sums shows in W


def test_members_with_another_backend_do_not_fuse():
    """`backend` is one of the fields a bundle's members share (ELMAN_FIELDS)."""
    mixed = [
        resolve(c)
        for c in (configs("rnn", "addition", "persistent")[0], configs("rnn", "addition", "scan")[1])
    ]
    assert fusable_key(mixed[0]) != fusable_key(resolve(configs("rnn", "addition", "scan")[0]))
    with pytest.raises(ValueError, match=r"differ in 'cell_params.backend' \('persistent' vs 'scan'\)"):
        check_fusable(mixed)


REFUSAL = """
import json
from trainers import train
from trainers.fused import train_fused
cfgs = json.loads(input())
solo, bundle = train(cfgs[0]), train_fused(cfgs)
print(json.dumps([solo.reason, *(r.reason for r in bundle)]))
"""


def test_on_the_cpu_without_the_interpreter_the_backend_is_refused_with_the_fix():
    """A fresh process without TRITON_INTERPRET: a solo trial and a bundle fail at their first step
    (as `native`'s elu and a missing CUDA device do), with a reason that names the backend, the reason
    and the fix."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", REFUSAL], input=json.dumps(configs("rnn", "addition", "persistent")),
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    reasons = json.loads(proc.stdout.splitlines()[-1])
    assert len(reasons) == 3
    for reason in reasons:
        assert reason.startswith("RuntimeError: backend 'persistent'"), reason
        assert "runs on a CUDA GPU" in reason and "use backend 'auto' or 'scan'" in reason
        assert "set TRITON_INTERPRET=1" in reason
