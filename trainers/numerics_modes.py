"""The numerics modes by name: what each sets and the mode a trial takes when it names none. The rest of
the concept, applying a mode in a process and the portable mode's maths, is `trainers.numerics`; these
need no torch, so a study spec names its mode and is read without it (the service's ledger reads)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal, cast

#: the environment variable that names the mode of a trial that names none
ENV = "MEMSWEEP_NUMERICS"
#: the modes' names, as a type
Numerics = Literal["portable", "native"]


@dataclass(frozen=True)
class Mode:
    """What a numerics mode sets: MKL's branch (MKL_CBWR), ATen's capability and oneDNN's ISA limit
    (None: the CPU's own)."""

    name: str
    mkl_cbwr: str  # MKL_CBWR: its branch, and STRICT where MKL supports it
    aten_capability: str | None  # ATEN_CPU_CAPABILITY's value (torch then reports it upper-case)
    onednn_isa: str | None  # ONEDNN_MAX_CPU_ISA's value


MODES = {
    # the same numbers on any x86-64 CPU with AVX2
    "portable": Mode("portable", "COMPATIBLE", "avx2", "AVX2"),
    # the same numbers on the same kind of machine; this CPU's fastest kernels
    "native": Mode("native", "AUTO,STRICT", None, None),
}
DEFAULT: Numerics = "portable"


def default_mode() -> Numerics:
    """The mode of a trial that names none: $MEMSWEEP_NUMERICS, else ``portable`` (a value that names
    no mode is refused where a trial config is resolved)."""
    return cast(Numerics, os.environ.get(ENV) or DEFAULT)


def environment(name: str) -> dict[str, str]:
    """The environment a new process needs to compute with mode `name` from its start (what `use`
    sets; a Ray worker's runtime environment, so that workers of different modes are never shared)."""
    mode = MODES[name]
    env = {ENV: name, "MKL_CBWR": mode.mkl_cbwr}
    if mode.aten_capability is not None:
        env["ATEN_CPU_CAPABILITY"] = mode.aten_capability
    if mode.onednn_isa is not None:
        env["ONEDNN_MAX_CPU_ISA"] = mode.onednn_isa
    return env
