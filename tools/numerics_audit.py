"""Audit the portable numerics mode on this one machine: could any kernel a trial runs round otherwise
on another x86-64 CPU, Intel or AMD? Found from the binaries themselves (issue 33).

A float32 result is the same on every x86-64 CPU when each kernel that computes it runs the same
instructions everywhere and none of them is an approximation whose bits the ISA leaves to the vendor
(rcpps, rsqrtps and their scalar, AVX-512 and fp16 kin); the IEEE operations (add, mul, div, sqrt,
fma) are correctly rounded, so one answer on any CPU. The portable mode pins ATen to its AVX2 kernels,
oneDNN to at most AVX2 and MKL to its COMPATIBLE branch (trainers/numerics.py). This tool trains
small trials of the cells and tasks it is given, solo and fused, with RMSprop and Adam, and the
settings the papers' presets take beside the defaults (`VARIANTS`: the layer-normalised RNN, nn.RNN's and
nn.LSTM's second bias, the readouts' draws, Keras' Adam and AMSGrad), each in a fresh portable process,
and checks:

1. **MKL's choices do not depend on the vendor.** Every trial is trained twice, once as it is and once
   with MKL told that it runs on the other vendor's CPU (`mkl_serv_intel_cpu_true`, the check MKL
   dispatches on, interposed to answer the opposite: on an AMD CPU "Intel", on an Intel CPU "not
   Intel"), and both runs must give the same numbers bit for bit. Under the native mode they part
   (MKL then picks its kernels by vendor), which shows the check bites (`--mode native`).
2. **MKL's vector maths.** Every VML function the trials call (`vmsExp`, `vmsTanh`, …: ATen's exp,
   log, tanh, sqrt, … on contiguous CPU tensors) is counted through an interposed wrapper, and the
   kernel MKL runs for it in the COMPATIBLE branch on either vendor (`mkl_vml_kernel_sExp_EXHAynn`:
   the EX kernel, seen under both) is disassembled: it must contain no approximate instruction. Before
   issue 33 the optimisers' √ was `vmsSqrt`, whose EX kernel starts from `rsqrtps`: an EPYC and a Xeon
   parted in the last bit of the first RMSprop step.
3. **oneDNN's JIT kernels** (the `lstm` cell): dumped (ONEDNN_JIT_DUMP) and disassembled alike.

ATen's own kernels (Sleef's vector maths included) contain no approximate instruction at all:
`--scan-library` disassembles every function of torch's CPU library (several minutes) and lists
those that do (only MKL's: vector maths, sparse BLAS, a small Cholesky).

    python tools/numerics_audit.py                       # every cell and the synthetic tasks
    python tools/numerics_audit.py --cells rnn lstm --tasks copy addition
    python tools/numerics_audit.py --task-params params.json   # add tasks read from files (their roots)
    python tools/numerics_audit.py --scan-library

Needs a C compiler (`cc`) and binutils' `objdump` and `nm` (`make setup` installs g++, which brings
them). Exit status 0 when every check holds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: instructions whose results the ISA leaves to each vendor (approximations to 12 or 14 bits)
APPROXIMATE = re.compile(
    r"\b(v?rcp(ps|ss)|v?rsqrt(ps|ss)|vrcp(14|28)(ps|pd|ss|sd)|vrsqrt(14|28)(ps|pd|ss|sd)|vrcpph|vrsqrtph|vrcpsh|vrsqrtsh)\b"
)
#: the tasks whose data the trainers make themselves, with small settings
SYNTHETIC_TASKS: dict[str, dict[str, Any]] = {
    "copy": {"seq_len": 30, "n_train": 64, "n_val": 32},
    "addition": {"seq_len": 20, "n_train": 64, "n_val": 32},
    "varcopy": {"lag_min": 2, "lag_max": 12, "n_train": 64, "n_val": 22},
    "denoise": {"seq_len": 20, "n_train": 64, "n_val": 32},
    "teacher": {"seq_len": 50, "n_train": 16, "n_val": 8, "calibration_sequences": 8},
}
#: cell settings as the contract tests set them (a signal can persist), and the LSTM's chrono init
CELL_PARAMS: dict[str, dict[str, Any]] = {
    "srnn": {"hyper_size": 8},
    "nru": {"memory_size": 16, "heads": 4},
    "lstm": {"chrono_tmax": 20},  # the chrono initialisation takes a float64 log
}
#: settings the papers' presets take beside the defaults, each run on the first task (solo, and fused
#: where it fuses): the layer-normalised RNN (ATen's LayerNorm, forward and backward; NRU's RNN-orth /
#: RNN-id), nn.RNN's and nn.LSTM's second bias and draws (SRNN), the readouts' draws, and the Adam kinds
#: beyond `adam` (Keras' form, AMSGrad: NRU's code): (cell, cell settings, optimizer, trial settings)
VARIANTS: list[tuple[str, dict[str, Any], str, dict[str, Any]]] = [
    ("rnn", {"layer_norm": True, "nonlinearity": "tanh", "input_init": "xavier_normal"}, "keras_adam",
     {"readout_init": "xavier_normal"}),
    ("rnn", {"layer_norm": True, "nonlinearity": "relu", "init": "identity"}, "keras_amsgrad", {}),
    ("rnn", {"init": "plain", "bias_hh": True, "nonlinearity": "tanh"}, "amsgrad", {"readout_init": "plain"}),
    ("lstm", {"bias_hh": True}, "adam", {"readout_init": "plain"}),
    ("nru", {}, "keras_amsgrad", {"readout_init": "xavier_normal"}),
]  # fmt: skip


def other_vendor_source() -> str:
    """C for a library whose `mkl_serv_intel_cpu_true` answers the opposite of this CPU's vendor."""
    intel = "GenuineIntel" in Path("/proc/cpuinfo").read_text()
    return f"int mkl_serv_intel_cpu_true(void) {{ return {0 if intel else 1}; }}\n"


def torch_cpu_library() -> Path:
    import torch

    return Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"


def vml_functions() -> list[str]:
    """The MKL VML functions ATen calls (`vms<Op>` and `vmd<Op>`; aten/src/ATen/cpu/vml.h's list)."""
    import torch

    header = Path(torch.__file__).parent / "include" / "ATen" / "cpu" / "vml.h"
    ops = re.findall(r"^IMPLEMENT_VML_MKL\((\w+), (\w+)\)", header.read_text(), flags=re.M)
    return [f"vm{t}{mkl}" for _, mkl in ops for t in "sd"]


def wrapper_source(functions: Iterable[str]) -> str:
    """C for a library that stands in for each VML function: it notes the function's name once
    (appending to $MEMSWEEP_VML_LOG) and calls MKL's, found in torch's CPU library
    ($MEMSWEEP_VML_LIBRARY: Python loads it privately, so RTLD_NEXT would not see it). Every function
    here takes (n, a, r, mode): integers and pointers, so six integer registers forward them whatever
    the exact signature."""
    lines = [
        "#define _GNU_SOURCE",
        "#include <dlfcn.h>",
        "#include <stdio.h>",
        "#include <stdlib.h>",
        "typedef void (*fn6)(long, long, long, long, long, long);",
        "static fn6 real(const char *name, int *seen) {",
        '  const char *path = getenv("MEMSWEEP_VML_LOG");',
        "  if (!*seen && path) {",
        '    FILE *f = fopen(path, "a"); if (f) { fprintf(f, "%s\\n", name); fclose(f); }',
        "  }",
        "  *seen = 1;",
        '  void *lib = dlopen(getenv("MEMSWEEP_VML_LIBRARY"), RTLD_LAZY | RTLD_NOLOAD);',
        "  fn6 fn = lib ? (fn6)dlsym(lib, name) : 0;",
        '  if (!fn) { fprintf(stderr, "vmlwrap: no %s in $MEMSWEEP_VML_LIBRARY\\n", name); abort(); }',
        "  return fn;",
        "}",
    ]
    for name in functions:
        lines.append(
            f"static int seen_{name}; static fn6 real_{name}; "
            f"void {name}(long a, long b, long c, long d, long e, long f) "
            f'{{ if (!real_{name}) real_{name} = real("{name}", &seen_{name}); real_{name}(a, b, c, d, e, f); }}'
        )
    return "\n".join(lines) + "\n"


def build_shared(source: str, out: Path) -> Path:
    """Compile C `source` into the shared library `out` (with `cc`)."""
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(out), str(src), "-ldl"], check=True)
    return out


def vml_kernel(function: str) -> str:
    """The kernel MKL runs for VML function `function` in its COMPATIBLE branch, in ATen's mode
    (VML_HA): vmsSqrt → mkl_vml_kernel_sSqrt_EXHAynn."""
    m = re.fullmatch(r"vm?([sd])(\w+)", function)
    if m is None:
        raise ValueError(f"not a VML function name: {function}")
    return f"mkl_vml_kernel_{m.group(1)}{m.group(2)}_EXHAynn"


def symbols(library: Path) -> dict[str, tuple[int, int]]:
    """name → (address, size) of the library's defined dynamic symbols."""
    out = subprocess.run(
        ["nm", "-D", "--defined-only", "-S", str(library)], capture_output=True, text=True, check=True
    )
    table = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4:
            table[parts[3]] = (int(parts[0], 16), int(parts[1], 16))
    return table


def approximations(text: str) -> list[str]:
    """The approximate instructions in objdump's disassembly `text`, one entry per occurrence."""
    found = []
    for line in text.splitlines():
        fields_ = line.split("\t")
        if len(fields_) > 1 and APPROXIMATE.search(fields_[-1]):
            found.append(fields_[-1].split()[0])
    return found


def disassemble(library: Path, start: int, size: int) -> str:
    out = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", f"--start-address={start:#x}", f"--stop-address={start + size:#x}", str(library)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout


def disassemble_raw(blob: Path) -> str:
    out = subprocess.run(
        ["objdump", "-D", "--no-show-raw-insn", "-b", "binary", "-m", "i386:x86-64", str(blob)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout


# ----- the trials ---------------------------------------------------------------------------------


def trial_configs(
    cells: list[str], tasks: dict[str, dict[str, Any]], mode: str = "portable"
) -> list[dict[str, Any]]:
    """Every cell on the first task, the first cell on every task: solo, with RMSprop and Adam; and the
    `VARIANTS` of the given cells on the first task."""
    first_task, first_cell = next(iter(tasks)), cells[0]
    pairs = [(cell, first_task) for cell in cells] + [
        (first_cell, task) for task in tasks if task != first_task
    ]
    runs = [(cell, task, {}, opt, {}) for cell, task in pairs for opt in ("rmsprop", "adam")]
    runs += [(cell, first_task, params, opt, extra) for cell, params, opt, extra in VARIANTS if cell in cells]
    return [
        {"task": task, "cell": cell, "hidden": 12, "seed": 1, "steps": 3, "eval_every": 3, "optimizer": opt,
         "lr": 1e-3, "task_params": tasks[task], "cell_params": CELL_PARAMS.get(cell, {}) | params,
         "device": "cpu", "threads": 1, "numerics": mode, **extra}
        for cell, task, params, opt, extra in runs
    ]  # fmt: skip


def label(cfg: dict[str, Any]) -> str:
    """cell/task/optimizer, with the settings that set a variant apart (`VARIANTS`)."""
    base = CELL_PARAMS.get(cfg["cell"], {})
    extra = {k: v for k, v in cfg["cell_params"].items() if base.get(k) != v}
    extra |= {k: cfg[k] for k in ("readout_init",) if k in cfg}
    settings = ",".join(f"{k}={v}" for k, v in sorted(extra.items()))
    return f"{cfg['cell']}/{cfg['task']}/{cfg['optimizer']}" + (f"[{settings}]" if settings else "")


def digest(result: Any) -> str:
    """sha256 of a trial's numbers: its evaluations, final loss and trained recurrent matrix."""
    h = hashlib.sha256()
    h.update(json.dumps([result.status, result.reason, result.final_val_loss], default=str).encode())
    h.update(json.dumps([(e.step, e.train_loss, e.val_loss, e.metric) for e in result.history]).encode())
    if result.recurrent_matrix is not None:
        h.update(result.recurrent_matrix.numpy().tobytes())
    return h.hexdigest()[:16]


def child(configs: list[dict[str, Any]]) -> dict[str, Any]:
    """In a fresh process of the configs' mode: each config trained solo, and fused with a second
    member where it fuses (another seed and learning rate; the same seed where the task's batches
    differ in length by seed); {label: digest}."""
    sys.path.insert(0, str(ROOT))
    from trainers import numerics

    numerics.use(configs[0]["numerics"])
    from trainers.config import resolve
    from trainers.fused import fusable_key, train_fused
    from trainers.loop import train

    out: dict[str, Any] = {}
    for cfg in configs:
        name = label(cfg)
        result = train(cfg)
        out[f"{name}/solo"] = digest(result)
        if result.status != "done":
            out[f"{name}/solo:failed"] = result.reason
        key = fusable_key(resolve(cfg))
        if key is not None:
            other = {**cfg, "seed": 2, "lr": 3e-4}
            if fusable_key(resolve(other)) != key:  # a task whose batches differ in length by seed
                other = {**cfg, "lr": 3e-4}
            results = train_fused([cfg, other])
            out[f"{name}/fused"] = [digest(r) for r in results]
    return out


@dataclass
class Audit:
    """What `run` found."""

    runs: list[str] = field(default_factory=list)  # cell/task/optimizer[settings]/solo or /fused
    vendor_dependent: list[str] = field(
        default_factory=list
    )  # runs whose numbers moved, MKL told the other vendor
    vml_called: list[str] = field(default_factory=list)
    vml_kernels: dict[str, list[str]] = field(default_factory=dict)  # kernel → its approximate instructions
    jit_kernels: dict[str, list[str]] = field(default_factory=dict)  # oneDNN JIT dump → approximations
    failed: list[str] = field(default_factory=list)

    @property
    def trials(self) -> int:
        return len(self.runs)

    @property
    def problems(self) -> list[str]:
        out = [f"numbers depend on MKL's vendor check: {t}" for t in self.vendor_dependent]
        out += [f"{k} (called) contains approximate instructions: {', '.join(sorted(set(v)))}"
                for k, v in self.vml_kernels.items() if v]  # fmt: skip
        out += [f"oneDNN JIT kernel {k} contains approximate instructions: {', '.join(sorted(set(v)))}"
                for k, v in self.jit_kernels.items() if v]  # fmt: skip
        return out


def run(configs: list[dict[str, Any]], workdir: Path) -> Audit:
    """Train `configs` (of one numerics mode) in two children, as they are and with MKL told the other
    vendor, and check the three things the module's docstring lists."""
    library = torch_cpu_library()
    functions = vml_functions()
    wrap = build_shared(wrapper_source(functions), workdir / "vmlwrap.so")
    other = build_shared(other_vendor_source(), workdir / "othervendor.so")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
    }
    env |= {"MEMSWEEP_NUMERICS": configs[0]["numerics"], "PYTHONPATH": str(ROOT)}
    spec = workdir / "configs.json"
    spec.write_text(json.dumps(configs))
    outputs = {}
    for name, preload in (("as-is", [wrap]), ("other-vendor", [wrap, other])):
        rundir = workdir / name
        rundir.mkdir()
        child_env = env | {
            "LD_PRELOAD": " ".join(str(p) for p in preload),
            "MEMSWEEP_VML_LOG": str(rundir / "vml.log"),
            "MEMSWEEP_VML_LIBRARY": str(library),
            "ONEDNN_JIT_DUMP": "1",
        }
        done = subprocess.run(
            [sys.executable, __file__, "--child", str(spec)], env=child_env, cwd=rundir,
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"the {name} child failed:\n{done.stderr[-4000:]}")
        outputs[name] = json.loads(done.stdout.strip().splitlines()[-1])

    audit = Audit(runs=sorted(k for k in outputs["as-is"] if not k.endswith(":failed")))
    audit.failed = [f"{k}: {v}" for k, v in outputs["as-is"].items() if k.endswith(":failed")]
    audit.vendor_dependent = sorted(
        k for k, v in outputs["as-is"].items() if outputs["other-vendor"].get(k) != v
    )
    called: set[str] = set()
    for name in outputs:
        log = workdir / name / "vml.log"
        called |= set(log.read_text().split()) if log.exists() else set()
    audit.vml_called = sorted(called)
    table = symbols(library)
    for function in audit.vml_called:
        kernel = vml_kernel(function)
        if kernel not in table:
            raise RuntimeError(
                f"{function} is called but MKL has no kernel {kernel}: has MKL's naming changed?"
            )
        audit.vml_kernels[kernel] = approximations(disassemble(library, *table[kernel]))
    for blob in sorted((workdir / "as-is").glob("dnnl_dump_*.bin")):
        audit.jit_kernels[blob.name] = approximations(disassemble_raw(blob))
    return audit


def scan_library(library: Path) -> dict[str, int]:
    """Every function of `library` that contains an approximate instruction → how many (minutes)."""
    proc = subprocess.Popen(
        ["objdump", "-d", "--no-show-raw-insn", str(library)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    counts: dict[str, int] = {}
    function = "?"
    header = re.compile(r"^[0-9a-f]+ <(.*)>:$")
    for line in proc.stdout:
        m = header.match(line)
        if m:
            function = m.group(1)
        elif "\t" in line and APPROXIMATE.search(line.rsplit("\t", 1)[-1]):
            counts[function] = counts.get(function, 0) + 1
    proc.wait()
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", nargs="+", help="registered cells (default: every one)")
    ap.add_argument("--tasks", nargs="+", help="tasks (default: the synthetic ones and --task-params')")
    ap.add_argument("--task-params", type=Path, help="JSON {task: params} for more tasks (data roots)")
    ap.add_argument(
        "--mode",
        default="portable",
        choices=["portable", "native"],
        help="numerics mode (native: the control)",
    )
    ap.add_argument("--scan-library", action="store_true", help="also every function of torch's CPU library")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child.read_text()))))
        return

    sys.path.insert(0, str(ROOT))
    from trainers.cells import list_cells

    tasks = dict(SYNTHETIC_TASKS)
    if args.task_params:
        tasks |= json.loads(args.task_params.read_text())
    if args.tasks:
        missing = [t for t in args.tasks if t not in tasks]
        if missing:
            raise SystemExit(
                f"no settings for tasks {missing}: give their params (data root) with --task-params"
            )
        tasks = {t: tasks[t] for t in args.tasks}
    configs = trial_configs(args.cells or list_cells(), tasks, args.mode)
    with tempfile.TemporaryDirectory(prefix="numerics-audit-") as tmp:
        audit = run(configs, Path(tmp))
    print(f"{audit.trials} runs (solo and fused, RMSprop, the Adam kinds and the presets' variants) in the "
          f"{args.mode} mode, twice each")  # fmt: skip
    print(f"MKL told it runs on the other vendor's CPU: {len(audit.vendor_dependent)} runs moved")
    print(f"MKL VML functions called: {', '.join(audit.vml_called) or 'none'}")
    for kernel, found in audit.vml_kernels.items():
        print(
            f"  {kernel}: {'approximate: ' + ', '.join(sorted(set(found))) if found else 'exact instructions only'}"
        )
    print(f"oneDNN JIT kernels dumped: {len(audit.jit_kernels)}, with approximate instructions: "
          f"{sum(1 for v in audit.jit_kernels.values() if v)}")  # fmt: skip
    for failure in audit.failed:
        print(f"  (a trial failed, its numbers still compared: {failure})")
    if args.scan_library:
        found = scan_library(torch_cpu_library())
        print(f"functions of libtorch_cpu with approximate instructions: {len(found)}")
        for name in sorted(found):
            print(f"  {found[name]:>3}  {name}")
    for problem in audit.problems:
        print(f"PROBLEM: {problem}")
    raise SystemExit(1 if audit.problems else 0)


if __name__ == "__main__":
    main()
