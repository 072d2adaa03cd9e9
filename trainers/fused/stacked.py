"""A bundle's stacked tensors [K, …]: member k's slice keeps the memory layout of its solo parameter
(the orthogonal initialiser's W comes out of QR column-major, the others' row-major). A GEMM's rounding
depends on its operands' layout, and the gradient norm's on the order in which it reads memory, so a
stack, a selection of rows and a flat view all keep each slice's strides.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def stack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """[K, …] stack whose slices take the layout (strides) most of the tensors have."""
    dense = [t.stride() for t in tensors if t.is_contiguous() or (t.dim() == 2 and t.t().is_contiguous())]
    first = tensors[0]
    layout = max(dense, key=dense.count) if dense else torch.empty(first.shape).stride()
    out = torch.empty_strided(
        (len(tensors), *first.shape), (first.numel(), *layout), dtype=first.dtype, device=first.device
    )
    for k, t in enumerate(tensors):
        out[k].copy_(t)
    return out


def take(stacked: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows `index` of a stacked tensor, keeping the slices' layout."""
    out = torch.empty_strided(
        (len(index), *stacked.shape[1:]), stacked.stride(), dtype=stacked.dtype, device=stacked.device
    )
    return out.copy_(stacked[index])


def flat(stacked: torch.Tensor) -> torch.Tensor:
    """[K, numel] view of a stacked tensor with each row in memory order (no copy)."""
    dims = sorted(range(1, stacked.dim()), key=lambda d: -stacked.stride()[d])
    return stacked.permute(0, *dims).reshape(stacked.shape[0], -1)
