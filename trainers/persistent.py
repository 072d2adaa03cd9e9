"""The persistent backends' kernels (`trainers.kernels_persistent`, issue 37), reached on first use:
that module imports Triton, which nothing else in the trainers needs (a run under `auto` never loads
it), and it builds on the scans of `trainers.kernels`, so the loader lives here rather than there."""

from __future__ import annotations

from types import ModuleType


def persistent_kernel() -> ModuleType:
    """`trainers.kernels_persistent`, imported on first use. The persistent backends of the Elman
    family and SRNN reach their kernels through it."""
    try:
        from trainers import kernels_persistent
    except ImportError as exc:
        raise ImportError(
            f"backend 'persistent' needs Triton ({exc}): install torch's CUDA wheel, which brings it, "
            "or use backend 'auto'"
        ) from exc
    return kernels_persistent
