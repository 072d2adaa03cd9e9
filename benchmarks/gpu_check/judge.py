"""How a check is judged: its tolerance, the deviation of two runs, and the verdict it records."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

# max |Δ| / max |reference|, per tensor
KERNEL_RTOL = 1e-9  # float64, hand-written backward vs autograd: only the order of sums differs
NRU_RTOL = 1e-6  # float32, compiled vs Python loops: the same ATen calls (bit-equal expected)
MEMBER_RTOL = 1e-3  # float32 after tens of steps, bundle member vs its solo run (other GEMM kernels)
GRAPH_RTOL = 1e-3  # float32, graphed vs eager step (the same kernels: bit-equal expected)
CHAOS_FACTOR = 10.0  # a chaotic point's bundle may part from its solo run this many times its rounding spread


@dataclass
class Check:
    section: str
    name: str
    status: str  # pass | chaotic | FAIL | refused | skipped
    max_abs: float | None = None
    max_rel: float | None = None
    tol: float | None = None
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.status != "FAIL"


def failed(section: str, name: str, exc: BaseException, limit: int = 200) -> Check:
    """A check that raised: FAIL, with the exception's type and the start of its message."""
    return Check(section, name, "FAIL", note=f"{type(exc).__name__}: {str(exc)[:limit]}")


def deviation(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, float]:
    """(max |a − b|, max over pairs of max |a − b| / max |b|) over (ours, reference) pairs. Non-finite
    values must sit at the same places with the same values in both (a grid point that diverges does
    so in both runs: Orhan's grid has such points); anywhere else they make the deviation inf."""
    worst_abs, worst_rel = 0.0, 0.0
    for a, b in pairs:
        a64, b64 = a.detach().double().cpu(), b.detach().double().cpu()
        if a64.shape != b64.shape:
            return math.inf, math.inf
        finite = torch.isfinite(b64)
        if not torch.equal(finite, torch.isfinite(a64)):
            return math.inf, math.inf
        odd_a, odd_b = a64[~finite], b64[~finite]  # the same infinities, NaN where NaN
        if not torch.equal(torch.isnan(odd_a), torch.isnan(odd_b)) or not torch.equal(
            odd_a.nan_to_num(0.0), odd_b.nan_to_num(0.0)
        ):
            return math.inf, math.inf
        a64, b64 = a64[finite], b64[finite]
        if a64.numel() == 0:
            continue
        diff = (a64 - b64).abs().max().item()
        scale = b64.abs().max().item()
        worst_abs = max(worst_abs, diff)
        worst_rel = max(worst_rel, diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf))
    return worst_abs, worst_rel


def judged(section: str, name: str, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], tol: float) -> Check:
    a, r = deviation(pairs)
    bits = all(torch.equal(x.detach(), y.detach()) for x, y in pairs)
    return Check(section, name, "pass" if r <= tol else "FAIL", a, r, tol, "bit-equal" if bits else "")
