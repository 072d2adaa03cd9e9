"""A cell against a transcription of its authors' code: one float64 batch forward and backward through both."""

from __future__ import annotations

from collections.abc import Callable

import torch


def forward_backward(
    cell: torch.nn.Module, reference: Callable[[torch.Tensor], torch.Tensor], d: int = 3, n: int = 6
) -> tuple[tuple[torch.Tensor, dict[str, torch.Tensor]], tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    """The cell in float64 (in place), every parameter moved off its initial value (so that a missed or
    misplaced bias shows), then one batch x [17, 4, d] through the cell and through `reference(x)`, each
    backward from the same loss: ((states, gradients by name) of the cell, the same of the reference)."""
    gen = torch.Generator
    cell.double()
    with torch.no_grad():
        for p in cell.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen().manual_seed(4), dtype=p.dtype))
    x = torch.randn(17, 4, d, generator=gen().manual_seed(5), dtype=torch.float64)
    target = torch.randn(17, 4, n, generator=gen().manual_seed(6), dtype=torch.float64)

    def run(fn: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cell.zero_grad()
        hs = fn(x)
        (hs * target).sum().backward()
        return hs.detach(), {
            name: p.grad.clone() for name, p in cell.named_parameters() if p.grad is not None
        }

    return run(cell), run(reference)
