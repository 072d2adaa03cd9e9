"""SGORNN: FastRNN's scalar gates around VPRNN's orthogonal recurrent matrix (SGORNN paper, eq. 1–3).

    h_t = a·f(W x_t + φ(Θ) h_{t−1} + b) + β·h_{t−1},   h_0 = 0                      (eq. 1)
    φ(Θ) = R₁Q₁ … R_kQ_k: k permuted rotation sublayers (`trainers.cells.vprnn`)   (eq. 2)
    a = sigmoid(α_raw), β = sigmoid(β_raw), β clipped to (0, 1 − 2a]               (eq. 3)

The authors' code is `FastRNNCell(VPRNNCell(128, n_rotations=7, activation='relu'), clip_scalar=True)`
(`sgornn/models.py`, `sgornn/layers.py`; docs/protocol.md §5): k = 14 sublayers, θ ~
U(−0.05, 0.05), fixed random permutation per sublayer, W Glorot-uniform, b = 0, α_raw = −3.75,
β_raw = 3.0. The rotations come from `vprnn`, the gates and the recurrence from `fastrnn`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from trainers.cells.base import Cell
from trainers.cells.fastrnn import ScalarGates, fast_rnn
from trainers.cells.vprnn import Rotations, check_rotations
from trainers.initializers import glorot_uniform


@dataclass(frozen=True)
class SGORNNConfig:
    rotations: int = 14  # rotation sublayers in all (the paper's k; the code's rots = 7, twice)
    theta_bound: float = 0.05  # θ ~ U(−bound, bound), Keras 'uniform'
    alpha_init: float = -3.75  # raw gate: a = sigmoid(α_raw) ≈ 0.0230
    beta_init: float = 3.0  # raw gate: β = sigmoid(β_raw) ≈ 0.9526
    clip_scalar: bool = True  # β ≤ 1 − 2a (eq. 3), the paper's generalisation constraint
    nonlinearity: Literal["elu", "relu", "tanh"] = "relu"
    bias: bool = True  # the VPRNN cell's bias, zero-initialised


class SGORNNCell(Cell):
    name = "sgornn"
    Config = SGORNNConfig
    config: SGORNNConfig

    def __init__(self, config: SGORNNConfig, input_size: int, hidden_size: int, gen: torch.Generator) -> None:
        super().__init__(config, input_size, hidden_size, gen)
        self.weight_ih = nn.Parameter(glorot_uniform(hidden_size, input_size, gen))  # W [N, d]
        self.rotations = Rotations(hidden_size, config.rotations, config.theta_bound, gen)  # φ(Θ), Θ [k, N/2]
        self.bias = nn.Parameter(torch.zeros(hidden_size)) if config.bias else None
        self.gates = ScalarGates(config.alpha_init, config.beta_init, config.clip_scalar)

    @classmethod
    def check_hidden(cls, config: SGORNNConfig, hidden: int) -> None:
        check_rotations(hidden, config.rotations, config.theta_bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.rotations.matrix()  # [N, N] orthogonal, materialised once per pass
        a, b = self.gates()
        return fast_rnn(x, self.weight_ih, w, self.bias, a, b, self.config.nonlinearity)

    def recurrent_matrix(self) -> torch.Tensor:
        with torch.no_grad():
            return self.rotations.matrix()
