"""Contractive RNN by projection (Emami et al. 2019, §5, pMNIST): the URNN with a milder constraint.

    after every optimiser step:  W = U S Vᵀ (SVD)  →  W ← U min(S, 1) Vᵀ,   so ‖W‖₂ ≤ 1

The authors' `urnn_pmnist_test.py:ProjectCB(contractive=True)` (docs/protocol.md §3). Everything
else — equations, kernel, initialisation (W orthogonal, V Glorot-uniform, b = 0), relu — is the URNN's
(`trainers.cells.urnn`), which also holds the projection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trainers.cells.urnn import Projection, URNNCell, URNNConfig


@dataclass(frozen=True)
class CRNNConfig(URNNConfig):
    pass


class CRNNCell(URNNCell):
    name = "crnn"
    Config = CRNNConfig
    config: CRNNConfig
    projection: ClassVar[Projection] = "contractive"
