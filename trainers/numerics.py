"""A trial's numerics mode: which CPU kernels compute its numbers, fixed for the whole process before
its first computation, and the record of where a result's numbers came from (`provenance`).

A float32 result on the CPU depends on the kernels that ran, not only on the config and the seed:

- MKL's GEMMs (every matmul): MKL picks a code path per CPU (its "branch"), and without its
  conditional-reproducibility mode its rounding also depends on the memory alignment of the operands, so a bundle
  member's slice of a stacked tensor and a solo run's fresh tensor could round differently (seen on an
  Intel Xeon with AVX-512: 22 bundle-against-solo tests failed in the last bits);
- ATen's vectorised elementwise loops and reductions (tanh, exp, sums): 8 floats a vector with AVX2,
  16 with AVX-512, so the split between vector body and scalar tail, and a sum's order, move;
- oneDNN (the `lstm` cell's kernel): its own ISA choice.

A mode fixes all three for a process (`use`):

- ``portable`` (the default): MKL's COMPATIBLE branch, ATen's AVX2 kernels, oneDNN at most AVX2,
  and the two pieces of maths below computed without MKL's vector maths. The same trial gives the
  same numbers on any x86-64 CPU with AVX2, Intel or AMD. MKL's named AVX2 branch would be faster but
  is Intel-only: on an AMD CPU MKL answers "unsupported branch" and falls back to its automatic
  choice. Under COMPATIBLE MKL runs the same kernels whatever the vendor, but a few of its
  vector-maths kernels start from rcpps / rsqrtps, approximations whose bits each vendor sets: the
  float32 √ (torch.sqrt: the optimisers') and the float64 log. The portable mode takes its own
  `sqrt` (correctly rounded) and `log` (the C library's) there, issue 33; `tools/numerics_audit.py`
  checks the rest on one machine. Its cost: `benchmarks/numerics.py`, quoted in docs/speed.md.
- ``native``: MKL's automatic branch in strict mode and the CPU's widest kernels. The same trial gives
  the same numbers on the same kind of machine, and no more; it is the fastest.

In both, MKL runs in its conditional-reproducibility mode, where a GEMM's result does not depend on
its operands' alignment, so a bundle member equals its solo run bit for bit on any CPU
(tests/trainers/test_numerics.py: operands at odd alignments). MKL's STRICT flag adds independence
from the thread count, and MKL supports it on the AVX2 and AVX-512 branches only (so under AUTO on
such a CPU, not under COMPATIBLE): a portable trial's numbers hold for its `threads` (1 by default),
which its config records. On a GPU the mode fixes only the CPU side (data, host-side sums): cuBLAS and
cuDNN rounding depends on the card.

MKL reads its setting at its first call and ATen its capability at its first dispatch, so a process
runs one mode: `use` applies it before the first computation, and refuses (NumericsError) a mode
other than the one the process already computes with. Trials of different modes therefore train in
different processes (the service runs one mode per study). A trial names its mode in its config
(`TrainConfig.numerics`, part of its hash); one that names none takes ``MEMSWEEP_NUMERICS``, else
``portable``.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import platform
from pathlib import Path
from typing import Any

import torch

from trainers.environ import environ_lock

# the modes by name, what each sets, the default (no torch: a study spec names its mode without it)
from trainers.numerics_modes import DEFAULT as DEFAULT
from trainers.numerics_modes import ENV as ENV
from trainers.numerics_modes import MODES as MODES
from trainers.numerics_modes import Mode as Mode
from trainers.numerics_modes import Numerics as Numerics
from trainers.numerics_modes import default_mode as default_mode
from trainers.numerics_modes import environment as environment

#: what the portable mode costs, as `memsweep plan` says it (the figures: docs/reproducibility.md,
#: measured side by side with benchmarks/numerics.py)
PORTABLE_COST = (
    "numerics portable (the default): the same numbers on any x86-64 CPU with AVX2, Intel or AMD; on a "
    "CPU it costs about 1.4-1.8x the native mode's solo step and 2x a bundle's (MKL's COMPATIBLE "
    "branch), about what torch's own kernels cost run natively; `numerics: native` is this CPU's "
    "fastest, the same numbers on the same kind of machine only (docs/reproducibility.md)"
)


class NumericsError(RuntimeError):
    """A mode this process cannot compute with: another mode already ran here, or the CPU lacks it."""


class ProcessNumericsError(NumericsError):
    """A mode this process cannot compute with because of what it computed before (another mode, MKL or
    ATen already fixed): a new process on the same machine can."""


# ----- MKL's conditional numerical reproducibility (mkl_cbwr.h), reached in torch's own library -----

_CBWR_ALL, _CBWR_STRICT = -1, 0x10000  # mkl_cbwr_get(MKL_CBWR_ALL); the STRICT bit
_CBWR_BRANCHES = {"OFF": 1, "AUTO": 2, "COMPATIBLE": 3, "AVX2": 10, "AVX512": 12}
_CBWR_ERRORS = {-1: "invalid settings", -2: "invalid input", -3: "unsupported branch on this CPU",
                -4: "unknown branch", -8: "MKL already ran in this process"}  # fmt: skip


@functools.cache
def _mkl() -> ctypes.CDLL | None:
    """torch's CPU library when it carries MKL's service functions (x86-64 builds), else None."""
    if not torch.backends.mkl.is_available():  # type: ignore[no-untyped-call]
        return None
    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        lib.mkl_serv_cbwr_get.argtypes = [ctypes.c_int]
        lib.mkl_serv_cbwr_set.argtypes = [ctypes.c_int]
        lib.MKL_Get_Version_String.argtypes = [ctypes.c_char_p, ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return lib


def mkl_cbwr() -> str | None:
    """MKL's reproducibility setting now, as MKL_CBWR spells it ("AUTO,STRICT"); None without MKL."""
    lib = _mkl()
    if lib is None:
        return None
    value = lib.mkl_serv_cbwr_get(_CBWR_ALL)
    names = {v: k for k, v in _CBWR_BRANCHES.items()}
    branch = names.get(value & 0xFFFF, f"branch {value & 0xFFFF}")
    return f"{branch},STRICT" if value & _CBWR_STRICT else branch


def mkl_version() -> str | None:
    lib = _mkl()
    if lib is None:
        return None
    buf = ctypes.create_string_buffer(256)
    lib.MKL_Get_Version_String(buf, len(buf))
    text = buf.value.decode(
        errors="replace"
    )  # "Intel(R) oneAPI Math Kernel Library Version 2024.2-Product …"
    return text.split("Version ", 1)[-1].split("-", 1)[0] if "Version " in text else text


#: below this many multiply-adds per member (B·N·N) ATen runs a batched matmul in its own loops, not
#: MKL's, and they round otherwise than addmm (aten/src/ATen/native/LinearAlgebra.cpp, bmm_out_or_baddbmm_)
ATEN_SMALL_BATCHED_GEMM = 400


def batched_gemm_rounds_as_single(rows: int, n: int) -> bool:
    """Whether MKL's batched GEMM (torch's bmm and baddbmm on the CPU) rounds each matrix of the batch
    as a single GEMM (mm, addmm) of that matrix does, at a fused scan's shapes ([rows, n] × [n, n] per
    member), so that a bundle may run its members' products in one call. Under COMPATIBLE it does not
    (most shapes whose N is not a multiple of 32 differ in the last bits, even a batch of one): bundles
    of the portable mode run one GEMM per member. Under AUTO it did at every shape measured on an AMD
    EPYC and an Intel Xeon with AVX-512, but which kernels MKL picks is the CPU's: so the process asks
    its own MKL, once per shape (`_batched_rounds_as_single`), rather than trusting two machines."""
    branch = mkl_cbwr() or ""
    if branch.startswith("COMPATIBLE"):
        return False
    return _batched_rounds_as_single(branch, torch.get_num_threads(), rows, n)


@functools.cache
def _batched_rounds_as_single(branch: str, threads: int, rows: int, n: int) -> bool:
    """Whether this process's batched GEMMs give each member's single GEMM bit for bit, in the three
    forms a fused scan uses (`trainers.kernels.member_gemms`: baddbmm with W stored transposed, baddbmm
    and bmm with W as stored), on random operands: which kernel MKL runs, and so how it rounds,
    depends on the shapes, the layout, the branch, the threads and the CPU, not on the values."""
    g = torch.Generator().manual_seed(0)
    k = 3
    a, c = torch.randn(k, rows, n, generator=g), torch.randn(k, rows, n, generator=g)
    w = torch.randn(k, n, n, generator=g)
    wt = w.transpose(1, 2)
    forms = (
        (torch.baddbmm(c, a, wt), [torch.addmm(c[i], a[i], wt[i]) for i in range(k)]),
        (torch.baddbmm(c, a, w), [torch.addmm(c[i], a[i], w[i]) for i in range(k)]),
        (torch.bmm(a, w), [torch.mm(a[i], w[i]) for i in range(k)]),
    )
    return all(torch.equal(batched, torch.stack(single)) for batched, single in forms)


def _set_mkl(mode: Mode) -> None:
    wanted = mode.mkl_cbwr
    with environ_lock:
        os.environ["MKL_CBWR"] = wanted  # for this process's children too; set() below wins over it here
    lib = _mkl()
    if lib is None:
        return
    branch, _, strict = wanted.partition(",")
    code = lib.mkl_serv_cbwr_set(_CBWR_BRANCHES[branch] | (_CBWR_STRICT if strict == "STRICT" else 0))
    if code == 0 or mkl_cbwr() == wanted:
        return
    other = next(m for m in MODES if m != mode.name)
    raise (ProcessNumericsError if code == -8 else NumericsError)(
        f"numerics {mode.name!r} needs MKL_CBWR={wanted}, but MKL answered "
        f"{_CBWR_ERRORS.get(code, code)!r} (it computes with {mkl_cbwr()}): "
        + ("MKL fixes its setting at its first call, so train this trial in a new process"
           if code == -8 else f"this CPU cannot run this mode; try numerics={other}")
    )  # fmt: skip


# ----- the process's mode -------------------------------------------------------------------------

_current: str | None = None  # the mode this process computes with, once `use` applied one


def current() -> str | None:
    """The mode this process computes with (None before the first `use`)."""
    return _current


def use(name: str) -> None:
    """Compute with mode `name` in this process from now on; NumericsError when it cannot (another
    mode already ran here, or this CPU cannot run it). Cheap after the first call."""
    global _current
    if name not in MODES:
        raise NumericsError(f"unknown numerics mode {name!r}; valid: {', '.join(MODES)}")
    mode = MODES[name]
    if _current == name:
        return
    if _current is not None:
        raise ProcessNumericsError(
            f"this process computes with numerics {_current!r}; a trial with numerics {name!r} must train "
            "in a new process (MKL and ATen fix their kernels at their first use)"
        )
    if mode.aten_capability is not None and platform.machine().lower() not in ("x86_64", "amd64"):
        raise NumericsError(
            f"numerics {name!r} is defined for x86-64 CPUs with AVX2; this machine is {platform.machine()}: "
            "use numerics=native (set it per trial, or MEMSWEEP_NUMERICS=native)"
        )
    with environ_lock:  # the processes another thread starts meanwhile see all of it or none
        told = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR")  # what the processes it starts read
        before = {var: os.environ.get(var) for var in told}
        try:
            for var, value in (
                ("ATEN_CPU_CAPABILITY", mode.aten_capability),
                ("ONEDNN_MAX_CPU_ISA", mode.onednn_isa),
            ):
                if value is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = value
            _set_mkl(mode)
            capability = torch.backends.cpu.get_cpu_capability()  # fixed from here on
            if mode.aten_capability is not None and capability != mode.aten_capability.upper():
                raise (NumericsError if capability == "DEFAULT" else ProcessNumericsError)(
                    f"numerics {name!r} needs ATen's {mode.aten_capability.upper()} kernels, but this process "
                    f"computes with {capability} ("
                    + ("this CPU lacks AVX2" if capability == "DEFAULT" else "torch computed here before")
                    + "): use numerics=native, or train this trial in a new process"
                )
        except NumericsError:  # the processes this one starts are not told a mode it does not compute with
            for var, value in before.items():
                if value is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = value
            raise
    _current = name


# ----- the maths the portable mode computes its own way --------------------------------------------
#
# In MKL's COMPATIBLE branch every kernel is the same on Intel and AMD (tools/numerics_audit.py trains
# trials with MKL told it runs on Intel: not a bit moves), but a few of MKL's vector-maths kernels start
# from rcpps / rsqrtps, approximations whose bits each vendor sets: its float32 √ (torch.sqrt, the
# optimisers') and its float64 log. Where a trial takes those, the portable mode takes the maths below
# (issue 33); every other MKL vector-maths kernel a trial calls is exact instructions only (the audit).


def portable_sqrt(t: torch.Tensor) -> torch.Tensor:
    """√t of a float32 tensor, correctly rounded, with ATen's own kernels (no MKL vector maths): in
    float64 as t · (1/√t) — IEEE √, division and product, three roundings of at most 2⁻⁵³ each —
    then rounded once to float32; ±0 and +∞ are their own roots.

    Why that rounds correctly: the exact root of a float32 x is never within m·2⁻⁵¹ of a float32
    rounding boundary m (x ≠ m², and both lie on the grid of m²'s last bit, so |x − m²| ≥ that
    grid's step), and three roundings move the float64 root by less than that. Scaling x by 4
    scales every step by 2 exactly, so every float32 in [1, 4), all checked in tests, stands for all."""
    d = t.double()
    root = torch.rsqrt(d).mul_(d)  # 0 · ∞ and ∞ · 0 are NaN: the where puts ±0 and ∞ back
    return torch.where((d == 0) | (d == math.inf), d, root).to(t.dtype)


def _portable(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and _current == "portable"


class _PortableSqrt(torch.autograd.Function):
    """`portable_sqrt` with torch.sqrt's gradient, g / (2√t) (ATen's `sqrt_backward`): IEEE operations
    only, so the backward is as portable as the forward."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor) -> torch.Tensor:
        root = portable_sqrt(t)
        ctx.save_for_backward(root)
        return root

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (root,) = ctx.saved_tensors
        out: torch.Tensor = grad / (2 * root)
        return out


def sqrt(t: torch.Tensor) -> torch.Tensor:
    """√t as this process's mode computes it: a float32 tensor's correctly rounded on the CPU in the
    portable mode (`portable_sqrt`, differentiable as torch.sqrt is: a cell's √ takes it too),
    `torch.sqrt` in the native mode, on a GPU (as before issue 33) and in float64 (tests' references)."""
    if not _portable(t) or t.dtype != torch.float32:  # `portable_sqrt` rounds float32 alone correctly
        return t.sqrt()
    if t.requires_grad and torch.is_grad_enabled():
        root: torch.Tensor = _PortableSqrt.apply(t)
        return root
    return portable_sqrt(t)


def log(t: torch.Tensor) -> torch.Tensor:
    """ln t of a float64 tensor as this process's mode computes it: on the CPU in the portable mode
    with the C library's `log` (through `xlogy`, 1 · log t: ATen calls it element by element), not
    MKL's float64 log, whose kernel starts from rcpps; `torch.log` otherwise (as before)."""
    return torch.special.xlogy(torch.ones_like(t), t) if _portable(t) else t.log()


@functools.cache
def cpu_model() -> str:
    """The CPU's model name as the kernel reports it ("AMD EPYC", "Intel(R) Xeon(R) …")."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(device: torch.device) -> dict[str, str]:
    """Where this process's numbers come from: the numerics mode, the CPU and ATen's capability,
    torch, the C library, MKL's version and setting, oneDNN's ISA limit (and on CUDA the card and
    CUDA's version)."""
    out = {
        "numerics": _current or "unset",
        "cpu": cpu_model(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
    }
    libc = " ".join(platform.libc_ver()).strip()
    if libc:  # ATen's scalar loops (a vector's remainder, one-element tensors) call the C library's maths
        out["libc"] = libc
    for key, value in (
        ("mkl", mkl_version()),
        ("mkl_cbwr", mkl_cbwr()),
        ("onednn_isa", os.environ.get("ONEDNN_MAX_CPU_ISA")),
    ):
        if value:
            out[key] = value
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
        out["cuda"] = str(torch.version.cuda)
    return out
