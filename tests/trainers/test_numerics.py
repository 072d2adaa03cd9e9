"""Numerics modes (trainers/numerics.py): what each mode sets in a process, that a process computes
with one mode, what a trial records of where its numbers came from, and that a bundle member equals
its solo run bit for bit whatever the alignment of its operands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import trainers
from trainers import numerics
from trainers.cells.fastrnn import fast_rnn, fused_fast_rnn
from trainers.config import config_hash, resolve
from trainers.kernels import Workspace, elman_rnn, fused_elman_rnn

pytestmark = pytest.mark.numerics  # CI runs them under every numerics mode

X86 = os.uname().machine in ("x86_64", "AMD64")


def run_python(code: str, mode: str | None = None) -> dict:
    """Run `code` in a fresh Python (MEMSWEEP_NUMERICS=mode when given); its last stdout line as JSON."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
    }
    env.pop(numerics.ENV, None)
    if mode is not None:
        env[numerics.ENV] = mode
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


PROCESS_STATE = """
    import json, torch
    from trainers import numerics
    numerics.use(numerics.default_mode())
    a = torch.randn(64, 64)
    (a @ a).sum()
    print(json.dumps({"cbwr": numerics.mkl_cbwr(), "capability": torch.backends.cpu.get_cpu_capability(),
                      "provenance": numerics.provenance(torch.device("cpu"))}))
"""


@pytest.mark.skipif(not X86, reason="the portable mode is defined for x86-64; elsewhere `use` refuses it")
def test_each_mode_sets_mkls_reproducibility_and_portable_fixes_avx2_kernels():
    portable = run_python(PROCESS_STATE, "portable")
    assert portable["cbwr"] == "COMPATIBLE"
    assert portable["capability"] == "AVX2"
    native = run_python(PROCESS_STATE, "native")
    assert native["cbwr"] == "AUTO,STRICT"
    # native is the CPU's own widest kernels: whatever torch picks with no ATEN_CPU_CAPABILITY set
    own = run_python("import json, torch; print(json.dumps(torch.backends.cpu.get_cpu_capability()))")
    assert native["capability"] == own
    for mode, state in (("portable", portable), ("native", native)):
        p = state["provenance"]
        assert (
            p["numerics"] == mode
            and p["mkl_cbwr"] == state["cbwr"]
            and p["capability"] == state["capability"]
        )
        assert p["torch"] == torch.__version__ and p["cpu"] and p["mkl"][:2] == "20"  # "2024.2"
    assert portable["provenance"]["onednn_isa"] == "AVX2" and "onednn_isa" not in native["provenance"]


@pytest.mark.skipif(not X86, reason="oneDNN's ISA limit is set by the portable mode, x86-64 only")
def test_portable_mode_limits_onednn_so_the_lstm_runs_avx2():
    """oneDNN (the `lstm` cell's kernel) reads its ISA limit at its first use: its verbose log names
    the ISA it runs."""
    code = """
        import io, json, os, sys, torch
        from trainers import numerics
        numerics.use(numerics.default_mode())
        lstm = torch.nn.LSTM(10, 20)
        r, w = os.pipe()
        saved = os.dup(1); os.dup2(w, 1)
        with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
            lstm(torch.randn(5, 3, 10))
        sys.stdout.flush(); os.dup2(saved, 1); os.close(w)
        log = os.read(r, 1 << 20).decode()
        print(json.dumps([ln for ln in log.splitlines() if ",isa:" in ln]))
    """
    (isa,) = run_python(code, "portable")
    assert isa.endswith("isa:Intel AVX2"), isa


def test_a_process_computes_with_one_mode_and_refuses_another():
    other = "native" if numerics.current() == "portable" else "portable"
    with pytest.raises(numerics.NumericsError, match="new process"):
        numerics.use(other)
    numerics.use(numerics.current())  # the process's own mode: accepted again


@pytest.mark.skipif(not X86, reason="the portable mode is defined for x86-64")
def test_a_mode_is_refused_once_mkl_has_computed_without_it():
    code = """
        import json, torch
        from trainers import numerics
        a = torch.randn(64, 64)
        (a @ a).sum()  # MKL reads its setting at its first call: from here on it is fixed
        try:
            numerics.use("portable")
            print(json.dumps("accepted"))
        except numerics.NumericsError as exc:
            import os
            told = [v for v in ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA") if v in os.environ]
            print(json.dumps(f"{exc} / told: {told}"))
    """
    message = run_python(code)
    assert "MKL already ran in this process" in message and "new process" in message, message
    # the processes it starts are not told a mode it does not compute with (it was, before)
    assert message.endswith(" / told: []"), message


def test_a_trial_of_another_mode_fails_with_the_reason_and_one_of_this_mode_records_its_provenance():
    cfg = {
        "task": "addition",
        "task_params": {"seq_len": 10, "n_train": 32, "n_val": 16},
        "steps": 2,
        "hidden": 8,
    }
    mine = trainers.train({**cfg, "numerics": numerics.current()})
    assert mine.status == "done", mine.reason
    assert mine.provenance is not None and mine.provenance["numerics"] == numerics.current()
    assert mine.to_dict()["provenance"] == mine.provenance
    other = "native" if numerics.current() == "portable" else "portable"
    theirs = trainers.train({**cfg, "numerics": other})
    assert theirs.status == "failed" and "new process" in (theirs.reason or ""), theirs.reason


def test_numerics_is_part_of_a_trials_identity_and_checked():
    portable, native = (resolve({"numerics": m}) for m in ("portable", "native"))
    assert config_hash(portable.to_dict()) != config_hash(native.to_dict())
    with pytest.raises(trainers.ConfigError, match="valid: portable, native"):
        resolve({"numerics": "fast"})


def test_a_trial_that_names_no_mode_takes_memsweep_numerics_else_portable(monkeypatch):
    monkeypatch.delenv(numerics.ENV, raising=False)
    assert trainers.TrainConfig().numerics == "portable"
    monkeypatch.setenv(numerics.ENV, "native")
    assert trainers.TrainConfig().numerics == "native"
    assert resolve({}).config.numerics == "native"


# ----- bundle members against solo runs, operands at other alignments ------------------------------


def misaligned(t: torch.Tensor, offset: int) -> torch.Tensor:
    """A copy of t whose data start `offset` floats past a 64-byte boundary (a fresh tensor starts on one)."""
    buf = torch.empty(t.numel() + 16, dtype=t.dtype)
    base = (-buf.data_ptr() // t.element_size()) % 16  # elements to the next 64-byte boundary
    out = buf[base + offset : base + offset + t.numel()].view(t.shape)
    out.copy_(t)
    assert out.data_ptr() % 64 == offset * t.element_size()
    return out


@pytest.mark.parametrize(
    ("m", "k", "n"), [(16, 100, 100), (16, 25, 25), (16, 10, 100), (1600, 100, 100), (7, 13, 5)]
)
def test_a_gemm_rounds_alike_at_every_alignment_of_its_operands(m, k, n):
    """MKL's conditional-reproducibility mode (every numerics mode sets it): addmm's result does not
    depend on where its operands start, which lets a member's slice of a bundle tensor round as a fresh
    solo tensor does. (Without it, MKL's default: 5 of these 30 products differed here, at 7×13×5.)"""
    g = torch.Generator().manual_seed(m * k + n)
    c, a, b = torch.randn(m, n, generator=g), torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    fresh = torch.addmm(c, a, b.t())
    for offset in (1, 2, 3, 5, 8, 13):
        out = misaligned(torch.empty(m, n), (offset * 7) % 16)
        torch.addmm(
            misaligned(c, offset), misaligned(a, (offset * 3) % 16), misaligned(b, offset).t(), out=out
        )
        assert torch.equal(out, fresh), offset


@pytest.mark.parametrize("cell", ["rnn", "fastrnn"])
@pytest.mark.parametrize("n", [4, 6, 25])
def test_bundle_members_equal_their_solo_runs_at_sizes_aten_multiplies_itself(cell, n):
    """Below B·N·N = 400 ATen runs a batched matmul in its own loops, not MKL's (the Emami preset's
    hidden 2–14 at batch 10 gets there): such bundles run one GEMM per member, in either mode."""
    K, T, B, d = 3, 5, 10, 2
    g = torch.Generator().manual_seed(n)
    xs = [torch.randn(T, B, d, generator=g) for _ in range(K)]
    w_in, w = torch.randn(K, n, d, generator=g), torch.randn(K, n, n, generator=g) / n**0.5
    bias, h0 = torch.randn(K, n, generator=g), torch.zeros(K, B, n)
    a, b = torch.rand(K, 1, generator=g), torch.rand(K, 1, generator=g)
    with torch.no_grad():
        if cell == "rnn":
            outs = fused_elman_rnn(xs, h0, w_in, w, bias, "tanh", False, Workspace())
            solos = [elman_rnn(x, h0[k], w_in[k], w[k], bias[k], "tanh") for k, x in enumerate(xs)]
        else:
            outs = fused_fast_rnn(xs, w_in, bias, w, a, b, "tanh", False, Workspace())
            solos = [fast_rnn(x, w_in[k], w[k], bias[k], a[k], b[k], "tanh") for k, x in enumerate(xs)]
    for k, (fused, solo) in enumerate(zip(outs, solos, strict=True)):
        assert torch.equal(fused, solo), (k, (fused - solo).abs().max())


@pytest.mark.parametrize("cell", ["rnn", "fastrnn"])
def test_bundle_members_with_misaligned_operands_equal_their_solo_runs(cell):
    """Both fused kernels (`fused_elman_rnn`: rnn, urnn, crnn, vprnn; `fused_fast_rnn`: fastrnn, sgornn),
    forward and every gradient, with each member's inputs and the bundle's weights stored at odd float
    offsets from a 64-byte boundary, against the solo kernel on fresh (aligned) tensors."""
    K, T, B, N, d = 3, 6, 16, 25, 10
    g = torch.Generator().manual_seed(7)
    xs = [misaligned(torch.randn(T, B, d, generator=g), 2 * k + 1) for k in range(K)]
    w_in = misaligned(torch.randn(K, N, d, generator=g), 3).requires_grad_()
    w = misaligned(torch.randn(K, N, N, generator=g) / N**0.5, 5).requires_grad_()
    bias = misaligned(torch.randn(K, N, generator=g), 7).requires_grad_()
    if cell == "rnn":
        h0 = misaligned(torch.zeros(K, B, N), 9).requires_grad_()
        params = (h0, w_in, w, bias)
        outs = fused_elman_rnn(xs, h0, w_in, w, bias, "elu", False, Workspace())
    else:
        a = misaligned(torch.rand(K, 1, generator=g), 9).requires_grad_()
        b = misaligned(torch.rand(K, 1, generator=g), 11).requires_grad_()
        params = (w_in, bias, w, a, b)
        outs = fused_fast_rnn(xs, w_in, bias, w, a, b, "elu", False, Workspace())
    weights = [torch.randn(o.shape, generator=g) for o in outs]
    sum((o * q).sum() for o, q in zip(outs, weights, strict=True)).backward()
    for k, x in enumerate(xs):
        solo = [p.detach()[k].clone().requires_grad_() for p in params]  # fresh, aligned
        x_solo = x.clone()
        if cell == "rnn":
            hs = elman_rnn(x_solo, solo[0], solo[1], solo[2], solo[3], "elu")
        else:
            hs = fast_rnn(x_solo, solo[0], solo[2], solo[1], solo[3], solo[4], "elu")
        (hs * weights[k]).sum().backward()
        assert torch.equal(outs[k], hs), k
        for p, q in zip(params, solo, strict=True):
            assert torch.equal(p.grad[k], q.grad), k


def test_bundles_run_batched_gemms_only_where_this_processs_mkl_rounds_them_as_single_ones(monkeypatch):
    """Whether MKL's batched GEMM rounds each member as its single GEMM depends on the shapes and the
    CPU (which kernel MKL picks): it was a rule measured on two machines (every branch but COMPATIBLE);
    the process now asks its own MKL, once per shape. A batched GEMM that rounds otherwise (here one
    made to) is not used, and the bundle runs one GEMM per member, its members' solo ops."""
    from trainers.kernels import _addmm_each, member_gemms

    cpu, asked = torch.device("cpu"), numerics.batched_gemm_rounds_as_single(16, 64)
    assert (member_gemms(cpu, 16, 64)[0] is torch.baddbmm) == asked
    if (numerics.mkl_cbwr() or "").startswith("COMPATIBLE"):  # the portable mode's branch: never batched
        assert not asked
    real = torch.bmm

    def rounds_otherwise(a, b, **kwargs):
        out = real(a, b, **kwargs)
        return out.copy_(torch.nextafter(out, torch.full_like(out, float("inf"))))

    numerics._batched_rounds_as_single.cache_clear()
    try:
        monkeypatch.setattr(torch, "bmm", rounds_otherwise)
        assert not numerics._batched_rounds_as_single("AUTO", 1, 16, 64)
        monkeypatch.setattr(numerics, "mkl_cbwr", lambda: "AUTO,STRICT")
        assert member_gemms(cpu, 16, 64)[0] is _addmm_each
    finally:
        numerics._batched_rounds_as_single.cache_clear()


@pytest.mark.parametrize("pool_first", [True, False])
def test_denormals_are_flushed_on_every_thread_whatever_the_process_computed_before(pool_first):
    """A trial on 2 threads flushes denormals on both, whether or not its process had made OpenMP's
    pool before it set its flags (a task's data built first, an earlier trial in a reused Ray worker):
    `torch.set_flush_denormal` alone reached only the calling thread, and half of a large elementwise
    op's elements stayed denormal when the pool came first. Turned off, they are off on both."""
    import subprocess
    import sys

    code = f"""
import numpy as np
import torch
from trainers.numerics import use
from trainers.runtime import configure_process, flush_denormals
use("portable")
torch.set_num_threads(2)
x = torch.from_numpy(np.full(1 << 22, 1e-39, dtype=np.float32))  # denormals, made by numpy: no pool
if {pool_first}:
    (torch.ones(1 << 22) * 2).sum()  # OpenMP's pool, made before the trial sets its flags
configure_process(torch.device("cpu"), 2, "portable")
flushed = int(((x * 1.5) == 0).sum())
flush_denormals(False)
print(flushed, int(((x * 1.5) == 0).sum()), x.numel())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    flushed, after_off, n = map(int, out.stdout.split())
    assert (flushed, after_off) == (n, 0)


ENVIRON_LOCKED = """
    import json, os, threading
    from trainers import numerics
    from trainers.environ import environ_lock

    told = ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
    held, release = threading.Event(), threading.Event()

    def hold():  # another thread's edit of the environment (a server starting a child: service.core.processes)
        with environ_lock:
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    user = threading.Thread(target=numerics.use, args=(numerics.default_mode(),))
    user.start()
    user.join(1.0)
    during = {"waiting": user.is_alive(), "set": [v for v in told if v in os.environ]}
    release.set()
    user.join()
    holder.join()
    print(json.dumps({"during": during, "after": [v for v in told if v in os.environ],
                      "current": numerics.current()}))
"""


@pytest.mark.skipif(not X86, reason="the portable mode is defined for x86-64; elsewhere `use` refuses it")
def test_a_mode_edits_the_environment_under_the_one_lock_of_the_process():
    """`use` sets what the processes this one starts read (MKL_CBWR, ...) holding `environ_lock`, the
    lock the service holds around its own edits and while it starts children: while another thread
    holds it, `use` waits and the environment is as it was; then it sets its variables as before."""
    out = run_python(ENVIRON_LOCKED, "portable")
    assert out["during"] == {"waiting": True, "set": []}
    assert out["after"] == ["MKL_CBWR", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"]
    assert out["current"] == "portable"
