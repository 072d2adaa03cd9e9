"""LSTM without peepholes, one bias per gate (Keras `LSTM`), on torch's native kernel.

    i_t = σ(W_ii x_t + W_hi h_{t−1} + b_i)        input gate
    f_t = σ(W_if x_t + W_hf h_{t−1} + b_f)        forget gate
    g_t = tanh(W_ig x_t + W_hg h_{t−1} + b_g)     candidate
    o_t = σ(W_io x_t + W_ho h_{t−1} + b_o)        output gate
    c_t = f_t ⊙ c_{t−1} + i_t ⊙ g_t,   h_t = o_t ⊙ tanh(c_t),   h_0 = c_0 = 0

Parameters: weight_ih [4N, d], weight_hh [4N, N], ONE bias [4N] (gate order i, f, g, o; torch's and
Keras' order alike). `nn.LSTM` would train two biases (b_ih + b_hh); Keras has one, and the SGORNN
paper's LSTM counts need one: h=128, d=2 plus a 1-unit readout = 67,201; h=64, d=9 = 19,009
(seed-code-facts §3.5). The kernel is `torch._VF.lstm` (what `nn.LSTM` calls; cuDNN on GPU) with our
parameters and a constant zero b_hh, as `trainers.kernels` does for the Elman RNN.

Initialisers (`init`):
- keras    Keras 2.3.1 `LSTM` defaults (the SGORNN code, `sgornn/models.py`): Glorot-uniform input kernel
           over all four gates (fan_in d, fan_out 4N), an orthogonal recurrent kernel over the whole
           [N, 4N] matrix (rows orthonormal in Keras' x·K convention, so weight_hh [4N, N] has
           orthonormal columns), zero biases, b_f = 1 (`unit_forget_bias=True`). Keras ≥ 2.3 uses the
           sigmoid as recurrent activation, as here (2.2.x used hard_sigmoid).
- plain    PyTorch's `nn.LSTM` default: every weight and the bias ~ U(−1/√N, 1/√N). (nn.LSTM's
           effective bias b_ih + b_hh is a sum of two such draws; ours is one.)
- mytorch  the NRU authors' LSTM (`apsarath/myTorch:myTorch/memory/LSTMCell.py`) without its peepholes:
           Xavier-normal input weights and an orthogonal N×N recurrent matrix per gate, b_f = 1, other
           biases 0. Their LSTM has peephole weights W_c2i/W_c2f/W_c2o (§3.4); this cell has none.
`init` is a Literal meant to grow (issue 8: the Orhan-style `orthogonal` / `chain` / `mixed` gates).

`forget_bias` sets b_f after the init (None: the init's own value). `chrono_tmax` applies the chrono
initialisation as the NRU authors' code does it (`LSTMCell.py:138-142`; §3.4, decision §0a item 7):
b_f = log(k), k drawn uniformly from the integers {1..t_max}, and b_i = −b_f. It overrides `forget_bias`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from trainers.cells.base import Cell
from trainers.params import ConfigError


@dataclass(frozen=True)
class LSTMConfig:
    init: Literal["keras", "plain", "mytorch"] = "keras"
    forget_bias: float | None = None  # b_f at init; None: the init's own (keras, mytorch 1; plain drawn)
    chrono_tmax: int | None = None  # chrono init b_f = log U{1..t_max}, b_i = −b_f; None: off


def check_chrono_tmax(t_max: int | None) -> None:
    if t_max is not None and t_max < 1:
        raise ConfigError(f"chrono_tmax = {t_max} must be at least 1 (or none to switch chrono off)")


def chrono_forget_bias(t_max: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """b_f [n] = log(k), k ~ U{1..t_max} (integers, as `np.random.randint(1, t_max + 1)` in myTorch)."""
    check_chrono_tmax(t_max)
    k = torch.randint(1, t_max + 1, (n,), generator=gen, dtype=torch.float64)
    return k.log().float()


class LSTMCell(Cell):
    name = "lstm"
    Config = LSTMConfig
    config: LSTMConfig

    def __init__(self, config: LSTMConfig, input_size: int, hidden_size: int, gen: torch.Generator) -> None:
        super().__init__(config, input_size, hidden_size)
        N, d = hidden_size, input_size
        self.weight_ih = nn.Parameter(torch.empty(4 * N, d))  # [W_ii; W_if; W_ig; W_io]
        self.weight_hh = nn.Parameter(torch.empty(4 * N, N))  # [W_hi; W_hf; W_hg; W_ho]
        self.bias = nn.Parameter(torch.zeros(4 * N))  # [b_i; b_f; b_g; b_o]
        with torch.no_grad():
            if config.init == "keras":
                nn.init.xavier_uniform_(self.weight_ih, generator=gen)  # U(±√(6/(d + 4N)))
                nn.init.orthogonal_(self.weight_hh, generator=gen)  # [4N, N], Wᵀ W = I_N
                self.bias[N : 2 * N] = 1.0
            elif config.init == "plain":
                k = 1.0 / math.sqrt(N)
                for p in (self.weight_ih, self.weight_hh, self.bias):
                    nn.init.uniform_(p, -k, k, generator=gen)
            elif config.init == "mytorch":  # myTorch's order: the four input blocks, then the four recurrent
                gates = [slice(k * N, (k + 1) * N) for k in range(4)]  # i, f, g, o
                for rows in gates:
                    nn.init.xavier_normal_(self.weight_ih[rows], generator=gen)  # [N, d], std √(2/(d + N))
                for rows in gates:
                    nn.init.orthogonal_(self.weight_hh[rows], generator=gen)  # [N, N]
                self.bias[N : 2 * N] = 1.0
            else:
                raise ConfigError(f"lstm: unknown init {config.init!r}; choose one of keras, plain, mytorch")
            if config.forget_bias is not None:
                self.bias[N : 2 * N] = config.forget_bias
            if config.chrono_tmax is not None:
                b_f = chrono_forget_bias(config.chrono_tmax, N, gen)
                self.bias[N : 2 * N] = b_f
                self.bias[:N] = -b_f

    @classmethod
    def resolve(cls, config: LSTMConfig, default_nonlinearity: str) -> LSTMConfig:
        check_chrono_tmax(config.chrono_tmax)  # fail at config time, not in the trial
        return config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h0 = x.new_zeros(1, x.shape[1], self.hidden_size)  # [layers=1, B, N]
        params = [self.weight_ih, self.weight_hh, self.bias, torch.zeros_like(self.bias)]  # b_hh ≡ 0
        # _VF.lstm(input, (h0, c0), params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
        out, _, _ = torch._VF.lstm(x, (h0, h0), params, True, 1, 0.0, torch.is_grad_enabled(), False, False)
        return out  # [T, B, N]
