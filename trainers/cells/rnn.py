"""Vanilla (Elman) RNN with Orhan & Pitkow's initialisers (paper §3.1.1, docs/protocol.md §1.4).

    h_t = f(W h_{t−1} + V x_t + b),   f ∈ {elu, relu, tanh},   h_0 = 0,   b initialised to 0

W and V start from one of `trainers.initializers` (chain α, fbchain β, identity λ, orthogonal λ);
`scale` is that initialiser's own hyperparameter (the authors' `--init_scale`). The nonlinearity
defaults to the task's (Orhan: elu on copy and psMNIST, relu on addition).

`input_init` draws V another way (after W, from the same generator): `glorot`, Keras' default
Glorot-uniform (Emami et al.'s SimpleRNN students: the `urnn` and `crnn` cells' default), or
`xavier_normal`, N(0, g·√(2/(d + N))) with g torch's `calculate_gain` of the nonlinearity (√2 for relu),
as the NRU authors' RNNCell draws its input weights (`apsarath/myTorch:myTorch/memory/RNNCell.py`).

`init="plain"`: `nn.RNN`'s default, every weight and bias ~ U(−1/√N, 1/√N), drawn in its order (V, W,
then the biases); `bias_hh`: its second bias b_hh beside b (its b_ih), both trained, the recurrence
taking b + b_hh: under RMSprop or Adam two biases move about twice as fast as one (Rotman & Wolf's
RNN baseline is `nn.RNN`, `rotmanmi/SRNN:models/SRNN.py:RNNtanh`).

`layer_norm`: that RNNCell's `layer_norm: True`, which every RNN-orth / RNN-id config of theirs sets,

    h_t = f(LN(W h_{t−1} + V x_t + b)),   LN(a) = γ ⊙ (a − mean(a)) / √(var(a) + 1e-5) + β

over the N units, γ = 1 and β = 0 at init and trained (torch's `nn.LayerNorm`). It runs through plain
autograd, step by step (`trainers.kernels.elman_layer_norm`), and its trials train alone, not in fused
bundles.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from trainers.cells.base import Cell
from trainers.initializers import INITIALIZERS, glorot_uniform
from trainers.kernels import elman_layer_norm, elman_rnn
from trainers.params import UNHASHED_DEFAULT, ConfigError
from trainers.persistent import check_elman_hidden, persistent_kernel

#: how V is drawn: the initialiser's own (`input_gain`), Keras' Glorot-uniform, or torch's Xavier-normal
#: with the nonlinearity's gain (the NRU authors' RNNCell)
InputInit = Literal["initializer", "glorot", "xavier_normal"]


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
    init: Literal["chain", "fbchain", "identity", "orthogonal", "plain"] = "chain"
    scale: float = 1.0  # α (chain), β (fbchain) or λ (identity, orthogonal); plain has none
    fb_forward: float = 0.99  # fbchain's fixed forward weight
    input_gain: float = 0.9  # V = gain·I (chains) or std gain/√N (identity, orthogonal)
    nonlinearity: Literal["elu", "relu", "tanh"] | None = None  # None: the task's default
    bias: bool = True  # Keras SimpleRNN has one (zero-initialised) bias
    # see trainers.kernels; "persistent" (the Triton kernel, issue 37) only when asked for
    backend: Literal["auto", "scan", "native", "persistent"] = "auto"
    input_init: InputInit = field(default="initializer", metadata=UNHASHED_DEFAULT)  # V's draw (above)
    # LayerNorm on the pre-activation, before f (the NRU authors' RNN-orth / RNN-id); trains alone
    layer_norm: bool = field(default=False, metadata=UNHASHED_DEFAULT)
    # nn.RNN's second bias b_hh beside b (its b_ih): the recurrence takes b + b_hh, each trained (above)
    bias_hh: bool = field(default=False, metadata=UNHASHED_DEFAULT)


class RNNCell(Cell):
    name = "rnn"
    Config = RNNConfig
    config: RNNConfig

    def __init__(self, config: RNNConfig, input_size: int, hidden_size: int, gen: torch.Generator) -> None:
        super().__init__(config, input_size, hidden_size, gen)
        N, d = hidden_size, input_size
        k = 1.0 / math.sqrt(N)  # plain: nn.RNN's U(±1/√N), in its order: weight_ih, weight_hh, biases
        if config.init == "plain":
            v, w = (
                torch.empty(N, d).uniform_(-k, k, generator=gen),
                torch.empty(N, N).uniform_(-k, k, generator=gen),
            )
        else:
            init = INITIALIZERS.get(config.init)
            w, v = init(N, d, config.scale, config.fb_forward, config.input_gain, gen)
        if config.input_init == "glorot":
            v = glorot_uniform(hidden_size, input_size, gen)
        elif config.input_init == "xavier_normal":  # myTorch draws its [d, N] W_i2h: the same law transposed
            gain = nn.init.calculate_gain(config.nonlinearity or "tanh")  # type: ignore[arg-type]  # elu refused
            v = nn.init.xavier_normal_(torch.empty(hidden_size, input_size), gain, generator=gen)
        self.weight_hh = nn.Parameter(w)  # W [N, N]
        self.weight_ih = nn.Parameter(v)  # V [N, d]
        self.bias = nn.Parameter(torch.zeros(hidden_size)) if config.bias else None
        self.bias_hh = nn.Parameter(torch.zeros(hidden_size)) if config.bias_hh else None  # nn.RNN's b_hh
        if config.init == "plain":
            with torch.no_grad():
                for b in (self.bias, self.bias_hh):
                    if b is not None:
                        b.uniform_(-k, k, generator=gen)
        self.norm = nn.LayerNorm(hidden_size) if config.layer_norm else None  # γ = 1, β = 0

    @classmethod
    def resolve(cls, config: RNNConfig, default_nonlinearity: str) -> RNNConfig:
        if config.nonlinearity is None:
            config = dataclasses.replace(config, nonlinearity=default_nonlinearity)  # type: ignore[arg-type]
        if config.bias_hh and not config.bias:
            raise ConfigError(
                f"{cls.name}: bias_hh is nn.RNN's second bias, beside the first (bias): set bias true with it"
            )
        if config.init == "plain" and config.scale != 1.0:
            raise ConfigError(
                f"{cls.name}: scale = {config.scale} has no effect with init 'plain' (nn.RNN's U(±1/√N)); it "
                "is α of chain, β of fbchain and λ of identity / orthogonal: leave scale at 1"
            )
        if config.layer_norm and config.backend != "auto":
            raise ConfigError(
                f"{cls.name}: backend {config.backend!r} has no layer normalisation (its kernels run the plain "
                "recurrence); leave backend auto with layer_norm"
            )
        if config.input_init == "xavier_normal" and config.nonlinearity == "elu":
            raise ConfigError(
                f"{cls.name}: input_init 'xavier_normal' takes torch's gain for the nonlinearity (relu √2, "
                "tanh 5/3), which has none for elu: choose nonlinearity relu or tanh, or another input_init "
                "(initializer, glorot)"
            )
        return config

    @classmethod
    def check_hidden(cls, config: RNNConfig, hidden: int) -> None:
        check_elman_hidden(config.backend, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h0 = x.new_zeros(x.shape[1], self.hidden_size)  # [B, N]
        nonlinearity = self.config.nonlinearity or "tanh"
        bias = self.bias if self.bias_hh is None or self.bias is None else self.bias + self.bias_hh
        if self.norm is not None:
            ln = (self.norm.weight, self.norm.bias)
            return elman_layer_norm(x, h0, self.weight_ih, self.weight_hh, bias, *ln, nonlinearity)
        return recurrence(x, h0, self.weight_ih, self.weight_hh, bias, nonlinearity, self.config.backend)

    def recurrent_matrix(self) -> torch.Tensor:
        return self.weight_hh.detach()

    def input_matrix(self) -> torch.Tensor:
        return self.weight_ih.detach()
