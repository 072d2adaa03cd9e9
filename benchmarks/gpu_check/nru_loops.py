"""Check 1b: the NRU's compiled step loops (trainers/csrc/nru_scan.cpp, ATen calls) against its Python
loops, float32 on the device (the same calls: bit-equal expected)."""

from __future__ import annotations

import os
import time

import torch

from benchmarks.gpu_check.judge import NRU_RTOL, Check, judged
from benchmarks.gpu_check.report import Report
from trainers.cells.nru import NRUCell, NRUConfig
from trainers.kernels_nru import build_directory, compiled_steps

STEPS_ENV = "MEMSWEEP_NRU_STEPS"  # "python": the NRU runs its Python loops


def build_nru_loops(report: Report, quick: bool) -> None:
    """Build (or load) the NRU's compiled loops first, and say how long it took: every NRU trial and
    NRUScan below runs them. Quick mode loads them only where they are built already."""
    if quick and not (build_directory() / "built").exists():
        os.environ[STEPS_ENV] = "python"  # no build in a smoke run: the same numbers
        report.note("quick mode: the NRU's compiled loops are not built here, its Python loops run")
        return
    started = time.perf_counter()
    ops = compiled_steps()
    report.note(
        f"NRU compiled loops {'loaded' if ops is not None else 'NOT built (Python loops run)'} in "
        f"{time.perf_counter() - started:.1f} s ({build_directory()})"
    )


def check_nru_loops(report: Report, device: torch.device, quick: bool) -> None:
    section = "NRU compiled loops vs Python loops (float32)"
    if (quick and not (build_directory() / "built").exists()) or compiled_steps() is None:
        why = (
            "not built on this machine (quick mode builds nothing)"
            if quick
            else "the loops could not be built"
        )
        report.add(Check(section, "NRUScan", "skipped", note=f"{why}: the Python loops run"))
        return
    T, B, N, d = (20, 4, 12, 3) if quick else (100, 16, 100, 10)
    for config in (
        NRUConfig(),
        NRUConfig(memory_size=8, heads=2, use_relu=True, layer_norm=True, head_reduction="sum"),
    ):
        before = os.environ.pop(STEPS_ENV, None)
        try:
            compiled = scan_and_grads(config, T, B, N, d, device)
            os.environ[STEPS_ENV] = "python"
            python = scan_and_grads(config, T, B, N, d, device)
        finally:
            os.environ.pop(STEPS_ENV, None)
            if before is not None:
                os.environ[STEPS_ENV] = before
        name = f"NRUScan T={T} N={N} m={config.memory_size} k={config.heads}{' relu ln sum' if config.use_relu else ''}"
        report.add(judged(section, name, list(zip(compiled, python, strict=True)), NRU_RTOL))


def scan_and_grads(
    config: NRUConfig, T: int, B: int, N: int, d: int, device: torch.device
) -> list[torch.Tensor]:
    """One seeded NRU cell's scan: its states, memories, and the gradients of a random projection."""
    cell = NRUCell(config, d, N, torch.Generator().manual_seed(3)).to(device)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(T, B, d, generator=g).to(device).requires_grad_()
    hs, ms = cell.scan(x, keep_memory=True)
    assert ms is not None
    (
        (hs * torch.randn(hs.shape, generator=g).to(device)).sum()
        + (ms * torch.randn(ms.shape, generator=g).to(device)).sum()
    ).backward()  # type: ignore[no-untyped-call]
    return [hs.detach(), ms.detach(), x.grad, *(p.grad for p in cell.parameters())]  # type: ignore[list-item]
