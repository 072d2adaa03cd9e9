"""The persistent kernel (`trainers.kernels_persistent`, issue 37) under Triton's interpreter, for the tests
that run it on the CPU.

Triton chooses between compiling and interpreting when @triton.jit runs, i.e. when the module is first
imported: call `persistent_kernel()` at a test module's top, before anything imports the kernel.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def persistent_kernel() -> ModuleType:
    """The kernel's module with its kernels interpreted: the interpreter set first, and the module
    imported again if something imported it earlier without (its INTERPRETED says which it got).
    Skips the calling module where Triton is not installed."""
    os.environ["TRITON_INTERPRET"] = "1"
    pytest.importorskip("triton")
    module = importlib.import_module("trainers.kernels_persistent")
    return module if module.INTERPRETED else importlib.reload(module)
