"""Vanilla (Elman) RNN with Orhan & Pitkow's initialisers (paper §3.1.1, docs/protocol.md §1.4).

    h_t = f(W h_{t−1} + V x_t + b),   f ∈ {elu, relu, tanh},   h_0 = 0,   b initialised to 0

W and V start from one of `trainers.initializers` (chain α, fbchain β, identity λ, orthogonal λ);
`scale` is that initialiser's own hyperparameter (the authors' `--init_scale`). The nonlinearity
defaults to the task's (Orhan: elu on copy and psMNIST, relu on addition).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from trainers.cells.base import Cell
from trainers.initializers import INITIALIZERS
from trainers.kernels import elman_rnn
from trainers.persistent import check_elman_hidden, persistent_kernel


def recurrence(
    x: torch.Tensor,
    h0: torch.Tensor,
    w_in: torch.Tensor,
    w_rec: torch.Tensor,
    bias: torch.Tensor | None,
    nonlinearity: str,
    backend: str,
) -> torch.Tensor:
    """The Elman family's states [T, B, N] through its `backend`: `trainers.kernels.elman_rnn`, or the
    persistent kernel as a bundle of one (the very program a bundle's member runs, issue 37)."""
    if backend != "persistent":
        return elman_rnn(x, h0, w_in, w_rec, bias, nonlinearity, backend)
    b = bias.unsqueeze(0) if bias is not None else None  # [1, N]: K = 1
    states = persistent_kernel().persistent_elman_rnn(
        [x], h0.unsqueeze(0), w_in.unsqueeze(0), w_rec.unsqueeze(0), b, nonlinearity
    )
    return states[0]  # type: ignore[no-any-return]


@dataclass(frozen=True)
class RNNConfig:
    init: Literal["chain", "fbchain", "identity", "orthogonal"] = "chain"
    scale: float = 1.0  # α (chain), β (fbchain) or λ (identity, orthogonal)
    fb_forward: float = 0.99  # fbchain's fixed forward weight
    input_gain: float = 0.9  # V = gain·I (chains) or std gain/√N (identity, orthogonal)
    nonlinearity: Literal["elu", "relu", "tanh"] | None = None  # None: the task's default
    bias: bool = True  # Keras SimpleRNN has one (zero-initialised) bias
    # see trainers.kernels; "persistent" (the Triton kernel, issue 37) only when asked for
    backend: Literal["auto", "scan", "native", "persistent"] = "auto"


class RNNCell(Cell):
    name = "rnn"
    Config = RNNConfig
    config: RNNConfig

    def __init__(self, config: RNNConfig, input_size: int, hidden_size: int, gen: torch.Generator) -> None:
        super().__init__(config, input_size, hidden_size, gen)
        init = INITIALIZERS.get(config.init)
        w, v = init(hidden_size, input_size, config.scale, config.fb_forward, config.input_gain, gen)
        self.weight_hh = nn.Parameter(w)  # W [N, N]
        self.weight_ih = nn.Parameter(v)  # V [N, d]
        self.bias = nn.Parameter(torch.zeros(hidden_size)) if config.bias else None

    @classmethod
    def resolve(cls, config: RNNConfig, default_nonlinearity: str) -> RNNConfig:
        if config.nonlinearity is None:
            return dataclasses.replace(config, nonlinearity=default_nonlinearity)  # type: ignore[arg-type]
        return config

    @classmethod
    def check_hidden(cls, config: RNNConfig, hidden: int) -> None:
        check_elman_hidden(config.backend, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h0 = x.new_zeros(x.shape[1], self.hidden_size)  # [B, N]
        nonlinearity = self.config.nonlinearity or "tanh"
        return recurrence(x, h0, self.weight_ih, self.weight_hh, self.bias, nonlinearity, self.config.backend)

    def recurrent_matrix(self) -> torch.Tensor:
        return self.weight_hh.detach()

    def input_matrix(self) -> torch.Tensor:
        return self.weight_ih.detach()
