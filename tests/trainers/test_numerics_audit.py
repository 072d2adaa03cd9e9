"""The portable mode's promise checked on one machine (tools/numerics_audit.py, issue 33): every cell
and every task, solo and fused, RMSprop and Adam (and the presets' settings beside the defaults: the
layer-normalised RNN, the second biases, Keras' Adam, AMSGrad), trained with MKL told it runs on the other vendor's
CPU gives the same numbers, and no kernel it runs holds an approximate instruction (rcpps, rsqrtps…),
whose bits each vendor sets. Before issue 33 this failed on the optimisers' √ (MKL's vsSqrt) and the
float64 log (PTB's baseline, the LSTM's chrono initialisation)."""

from __future__ import annotations

import os
import shutil

import pytest

from tools import numerics_audit
from trainers.cells import list_cells

pytestmark = pytest.mark.slow

X86 = os.uname().machine in ("x86_64", "AMD64")
needs = pytest.mark.skipif(not X86, reason="the portable mode is defined for x86-64 CPUs only")


@pytest.fixture(scope="module")
def tools_present():
    missing = [t for t in ("cc", "nm", "objdump") if shutil.which(t) is None]
    assert not missing, f"the audit needs {missing}: `make setup` installs g++ and binutils (Debian)"


@needs
def test_every_cell_and_task_in_the_portable_mode_computes_the_same_on_either_vendor(
    tmp_path, tiny_task_params, tools_present
):
    configs = numerics_audit.trial_configs(list_cells(), dict(tiny_task_params))
    audit = numerics_audit.run(configs, tmp_path)
    assert audit.problems == []
    # the audit saw what it checks: runs, MKL's vector maths (tanh, exp, log …) and oneDNN's LSTM kernels
    assert audit.trials > len(configs)  # each config solo, and fused where its cell and task fuse
    # the presets' settings beside the defaults ran, and trained: the layer-normalised RNN (ATen's
    # LayerNorm), nn.RNN's and nn.LSTM's second bias, Keras' Adam and both AMSGrads, fused where they fuse
    variants = {
        numerics_audit.label(c) for c in configs if c["cell"] in {v[0] for v in numerics_audit.VARIANTS}
    }
    ran = {run.rsplit("/", 1)[0] for run in audit.runs}
    assert variants <= ran
    assert any("layer_norm=True" in run for run in audit.runs)
    assert any("amsgrad[" in run and run.endswith("/fused") for run in audit.runs)
    assert not [f for f in audit.failed if "[" in f], audit.failed
    assert {"vmsExp", "vmsTanh", "vmsLn"} <= set(audit.vml_called)
    assert audit.jit_kernels


@needs
def test_the_audit_sees_what_would_part_two_vendors(tmp_path, tools_present):
    """Its two checks bite: in the native mode MKL picks kernels by vendor, so telling it the other
    vendor moves the numbers; and MKL's float32 √ kernel, which torch.sqrt runs, starts from rsqrtps."""
    configs = numerics_audit.trial_configs(
        ["rnn"], {"copy": numerics_audit.SYNTHETIC_TASKS["copy"]}, "native"
    )
    audit = numerics_audit.run(configs[:1], tmp_path)
    assert audit.vendor_dependent, "MKL told the other vendor moved no native run: the interposition is void"
    library = numerics_audit.torch_cpu_library()
    start, size = numerics_audit.symbols(library)[numerics_audit.vml_kernel("vmsSqrt")]
    assert "rsqrtps" in numerics_audit.approximations(numerics_audit.disassemble(library, start, size))
