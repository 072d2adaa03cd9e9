"""Henrici's departure from normality of a recurrent matrix (Orhan & Pitkow 2020 §3.2, Table 2)."""

from __future__ import annotations

import torch


def henrici_index(w: torch.Tensor) -> float:
    """Henrici's departure from normality d(W) = sqrt(‖W‖_F² − Σ_i |λ_i|²); 0 iff W is normal."""
    w64 = w.detach().to(torch.float64).cpu()
    eig = torch.linalg.eigvals(w64)
    gap = float(w64.pow(2).sum().item() - eig.abs().pow(2).sum().item())
    return float(max(gap, 0.0) ** 0.5)  # rounding can push a normal matrix's gap slightly below 0


def spectral_radius(w: torch.Tensor) -> float:
    """ρ(W) = max_i |λ_i|."""
    return float(torch.linalg.eigvals(w.detach().to(torch.float64).cpu()).abs().max().item())
