"""The persistent backends' kernels (`trainers.kernels_persistent`, issue 37), reached on first use:
that module imports Triton, which nothing else in the trainers needs (a run under `auto` never loads
it), and it builds on the scans of `trainers.kernels`, so the loader lives here rather than there.
What the kernels can hold on chip is checked here too, at config time, without Triton."""

from __future__ import annotations

from types import ModuleType

from trainers.params import ConfigError

#: the widest hidden layer the persistent Elman kernels train: W (and ∂W in the backward) stay on chip
#: for all T steps in tiles of the next power of two, so from N = 129 every tile doubles (256).
#: Compiled for sm_90 (H100, H200; tools/kernel_report.py, Triton 3.8, 8 warps): at N = 128 the forward
#: needs 65 KB of shared memory and no spills, the backward 112 KB; at N = 129 to 256 the backward
#: needs 308–352 KB, past the 227 KB a block may have, so it cannot launch, and the forward spills
#: (docs/gpu.md). SRNN's shift kernel holds no matrix and has no such limit.
ELMAN_MAX_HIDDEN = 128


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


def check_elman_hidden(backend: str, hidden: int) -> None:
    """Refuse an Elman-family cell's `backend: persistent` at a hidden size its kernels cannot hold."""
    if backend == "persistent" and hidden > ELMAN_MAX_HIDDEN:
        raise ConfigError(
            f"backend = 'persistent' trains hidden sizes up to {ELMAN_MAX_HIDDEN} (its kernels keep W on "
            f"chip; docs/gpu.md), and hidden = {hidden}: use backend 'auto' (the same recurrence, "
            f"cuBLAS on a GPU), or hidden ≤ {ELMAN_MAX_HIDDEN}"
        )
