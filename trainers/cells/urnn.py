"""URNN by projection (Emami et al. 2019, §5): a vanilla RNN whose W is projected after every step.

    h_t = f(W h_{t−1} + V x_t + b)      (the vanilla RNN, `trainers.cells.rnn`: same equations, same kernel)
    after every optimiser step:  W = U S Vᵀ (SVD)  →  W ← U Vᵀ

U Vᵀ is the polar factor, the orthogonal matrix nearest to W in Frobenius norm ("we chose to project
the transition matrix on the full space of unitary matrices after each iteration using SVD"). The
authors' code does exactly this after every batch (`melikaemami/URNN:urnn_synth_test.py:project`,
`urnn_pmnist_test.py:ProjectCB`; docs/protocol.md §3); the optimiser's state is left as is.
`project_` also holds the contractive variant (singular values clipped to ≤ 1) used by
`trainers.cells.crnn`.

Initialisation follows their student model, Keras `SimpleRNN(relu)` defaults: W orthogonal (gain 1,
so it starts on the constraint set; W is not projected before the first step, as in their code),
V Glorot-uniform, b = 0. The fields inherited from the vanilla RNN let a study start from another W
(chain, identity, …); the first step's projection then brings it onto the set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from trainers.cells.rnn import InputInit, RNNCell, RNNConfig

Projection = Literal["orthogonal", "contractive"]


@torch.no_grad()
def project_(w: torch.Tensor, mode: Projection) -> None:
    """Project W in place: onto the orthogonal group (U Vᵀ) or onto ‖W‖₂ ≤ 1 (singular values ≤ 1).

    The SVD runs in float64 so that the float32 result is orthogonal (or contractive) to ~1e-7.
    W may be a stack [K, N, N] (a fused bundle's members): on the CPU one batched SVD, which LAPACK
    computes one matrix at a time, so each member's factors are bit for bit its solo ones (tested);
    elsewhere (cuSOLVER's batched SVD is another algorithm) one member at a time. The products that
    follow run per member, as the solo hook runs them.
    """
    if w.dim() == 3:
        if w.device.type != "cpu":
            for member in w.unbind(0):
                project_(member, mode)
            return
        factors = torch.linalg.svd(w.double())
        for k, member in enumerate(w.unbind(0)):
            _apply(member, factors.U[k], factors.S[k], factors.Vh[k], mode)
        return
    u, s, vh = torch.linalg.svd(w.double())  # W = U diag(s) Vᵀ
    _apply(w, u, s, vh, mode)


def _apply(w: torch.Tensor, u: torch.Tensor, s: torch.Tensor, vh: torch.Tensor, mode: Projection) -> None:
    if mode == "orthogonal":
        w.copy_(u @ vh)
    elif s[0] > 1.0:  # contractive: nothing to do when already non-expansive (keeps W bit-identical)
        w.copy_((u * s.clamp(max=1.0)) @ vh)


@dataclass(frozen=True)
class URNNConfig(RNNConfig):
    # Keras SimpleRNN's default W
    init: Literal["chain", "fbchain", "identity", "orthogonal", "plain"] = "orthogonal"
    scale: float = 1.0  # gain of the initial W
    nonlinearity: Literal["elu", "relu", "tanh"] | None = "relu"  # their SimpleRNN(activation='relu')
    input_init: InputInit = "glorot"  # Keras default; or `init`'s own V (Orhan), or xavier_normal


class URNNCell(RNNCell):
    name = "urnn"
    Config = URNNConfig
    config: URNNConfig
    projection: ClassVar[Projection] = "orthogonal"

    def __init__(self, config: URNNConfig, input_size: int, hidden_size: int, gen: torch.Generator) -> None:
        super().__init__(config, input_size, hidden_size, gen)  # V Glorot-uniform by default (RNNCell)

    def after_step(self) -> None:
        project_(self.weight_hh, self.projection)
