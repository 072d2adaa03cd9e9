"""Compile the persistent Elman kernels (`trainers/kernels_persistent.py`, issue 37) for a GPU that this
machine does not need to have, and print what ptxas made of each: registers, spills, shared memory.

A compile-time measurement, not a timing: it shows whether a kernel's state fits the register file
(spills are local-memory traffic inside the T-step loop), not how fast it runs. Triton's own compiler
and the ptxas it ships (its NVIDIA backend's) compile each kernel exactly as the launcher would launch
it — the grid, arguments and constexprs come from `_forward_launch` / `_backward_launch`, called on
tensors of the meta device at the configuration's shape — for sm_90 (H100, H200) by default.

    python tools/kernel_report.py                      # N = 32 and 128, both kernels, elu and relu, 4 and 8 warps
    python tools/kernel_report.py --n 25 100 --warps 8 --kernels forward   # Orhan's own N (psMNIST; addition, copy)
    PYTHONPATH=/path/to/other/triton:. python tools/kernel_report.py   # another Triton's compiler, e.g. the lent card's 3.6

Per kernel and configuration (N; activation elu / relu; for the backward, LAST: the loss reads the
last state only, or every state; num_warps), the columns are: registers a thread (ptxas), the stack
frame and spill stores / loads in bytes (ptxas `-v`), the local-memory load and store instructions
in the SASS (LDL / STL, what the spills cost in instructions), FFMA instructions (the products: one
step's unrolled loop body), tensor-core instructions (HMMA / HGMMA: there must be none, the products
are IEEE float32, never TF32) and shared memory in bytes (Triton's allocation, W's tiles mostly).
B = 16 (one batch slice), T = 750, K = 1 (K changes only the grid). The launch's specialisation is
mirrored: pointers 16-byte aligned, an int divisible by 16 marked so, an int equal to 1 (a stride)
made a constant, as Triton's JIT does.

It refuses to run under TRITON_INTERPRET (the interpreter compiles nothing). About a minute for the
default 24 configurations on two idle cores (--jobs; longer when they are shared).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
T, B = 750, 16
COLUMNS: tuple[str, ...] = ("kernel", "N", "act", "last", "warps", "regs", "stack", "spill_st", "spill_ld")
COLUMNS += ("LDL", "STL", "FFMA", "MMA", "smem")


@dataclass(frozen=True)
class Config:
    kernel: str  # forward | backward
    n: int
    act: str
    last: bool | None  # the backward's LAST; None for the forward
    warps: int


def configs(
    ns: Sequence[int], warps: Sequence[int], kernels: Sequence[str], acts: Sequence[str]
) -> list[Config]:
    out: list[Config] = []
    for kernel in kernels:
        for n in ns:
            for act in acts:
                for last in (None,) if kernel == "forward" else (False, True):
                    out.extend(Config(kernel, n, act, last, w) for w in warps)
    return out


def _specialise(value: Any) -> tuple[str, list[list[Any]] | None, Any]:
    """(signature type, attributes, constant) as Triton's JIT specialises a launch argument: a tensor is a
    pointer (torch's allocations are 16-byte aligned); an int equal to 1 a constant; an int divisible by
    16 marked divisible."""
    import torch

    if isinstance(value, torch.Tensor):
        ty = {torch.float32: "*fp32", torch.float64: "*fp64"}[value.dtype]
        return ty, [["tt.divisibility", 16]], None
    if isinstance(value, bool):
        return "constexpr", None, value
    if isinstance(value, int):
        if value == 1:
            return "constexpr", None, 1
        ty = "i32" if -(2**31) <= value < 2**31 else "i64"
        return ty, [["tt.divisibility", 16]] if value % 16 == 0 else None, None
    raise TypeError(f"cannot specialise {value!r}")


def _launch(config: Config) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """The kernel, its arguments and constexprs as the launcher makes them at this configuration."""
    import torch

    from trainers import kernels_persistent as kp

    K, N = 1, config.n

    def empty(*shape: int) -> torch.Tensor:  # row-major, float32: no memory behind it
        return torch.empty(*shape, device="meta", dtype=torch.float32)

    w, hs = empty(K, N, N), empty(K, T + 1, B, N)
    if config.kernel == "forward":
        _, args, meta = kp._forward_launch(empty(K, T, B, N), empty(K, B, N), w, hs, config.act)
        return kp._elman_forward, args, meta
    g = empty(K, B, N) if config.last else empty(K, T, B, N)
    ga, dw, dh0 = empty(K, T, B, N), empty(K, 1, N, N), empty(K, B, N)
    _, args, meta = kp._backward_launch(hs, w, g, ga, dw, dh0, config.act, bool(config.last))
    return kp._elman_backward, args, meta


def _sass(cubin: bytes, folder: str) -> str:
    """The cubin's SASS, by the cuobjdump Triton ships (its note on the ELF format left out)."""
    import triton

    path = Path(folder) / "kernel.cubin"
    path.write_bytes(cubin)
    cuobjdump = triton.knobs.nvidia.cuobjdump.path
    return subprocess.run([cuobjdump, "-sass", str(path)], capture_output=True, text=True, check=True).stdout


def _count(sass: str, *ops: str) -> int:
    return sum(len(re.findall(rf"\b{op}(\.[A-Z0-9_.]+)?\b", sass)) for op in ops)


def compile_one(config: Config, arch: int = 90) -> dict[str, Any]:
    """Compile one configuration for sm_`arch` and read ptxas's report and the SASS."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel, args, meta = _launch(config)
    names = [p.name for p in kernel.params]
    values = dict(zip(names, args, strict=False)) | meta
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(names):
        if name in meta:
            signature[name], constexprs[name] = "constexpr", meta[name]
            continue
        ty, attr, const = _specialise(values[name])
        signature[name] = ty
        if ty == "constexpr":
            constexprs[name] = const
        elif attr:
            attrs[(i,)] = attr
    knobs = triton.knobs
    with tempfile.TemporaryDirectory() as cache:
        knobs.cache.dir = cache  # a fresh cache: ptxas runs, and nothing is left in ~/.triton
        knobs.nvidia.dump_ptxas_log = True  # ptxas -v's report, printed by Triton's backend
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(
                ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs),
                target=GPUTarget("cuda", arch, 32),
                options={"num_warps": config.warps},
            )
        sass = _sass(compiled.asm["cubin"], cache)
    text = log.getvalue()

    def field(pattern: str) -> int:
        m = re.search(pattern, text)
        if m is None:
            raise RuntimeError(f"ptxas's report has no {pattern!r}:\n{text}")
        return int(m.group(1))

    return {
        "kernel": config.kernel,
        "N": config.n,
        "act": config.act,
        "last": "" if config.last is None else ("yes" if config.last else "no"),
        "warps": config.warps,
        "regs": field(r"Used (\d+) registers"),
        "stack": field(r"(\d+) bytes stack frame"),
        "spill_st": field(r"(\d+) bytes spill stores"),
        "spill_ld": field(r"(\d+) bytes spill loads"),
        "LDL": _count(sass, "LDL"),
        "STL": _count(sass, "STL"),
        "FFMA": _count(sass, "FFMA", "DFMA"),
        "MMA": _count(sass, "HMMA", "HGMMA", "DMMA"),
        "smem": compiled.metadata.shared,
        "triton": triton.__version__,
    }


def table(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table of the rows, in COLUMNS' order."""
    lines = [
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" if c in ("kernel", "act", "last") else "---:" for c in COLUMNS) + "|",
    ]
    lines += ["| " + " | ".join(str(r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, nargs="+", default=[32, 128], help="hidden sizes (default: 32 128)")
    ap.add_argument("--warps", type=int, nargs="+", default=[4, 8], help="num_warps (default: 4 8)")
    ap.add_argument("--kernels", nargs="+", choices=("forward", "backward"), default=["forward", "backward"])
    ap.add_argument("--acts", nargs="+", choices=("elu", "relu", "tanh"), default=["elu", "relu"])
    ap.add_argument("--arch", type=int, default=90, help="compute capability × 10 (default 90: H100, H200)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="processes (default 2)")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("kernel_report: unset TRITON_INTERPRET (the interpreter compiles nothing)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    import triton

    todo = configs(args.n, args.warps, args.kernels, args.acts)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(compile_one, todo, [args.arch] * len(todo)))
    print(f"Triton {triton.__version__}, sm_{args.arch}, B = {B}, T = {T}: compiled, not run (no timing)\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
