"""JANET: the forget-gate-only LSTM (van der Westhuizen & Lasenby 2018), as the NRU authors' code has it.

    f_t = σ(W_f [x_t, h_{t−1}] + b_f)                          forget gate
    c_t = f_t ⊙ h_{t−1} + (1 − f_t) ⊙ tanh(W_c [x_t, h_{t−1}] + b_c)
    h_t = c_t,   h_0 = 0

Following `apsarath/myTorch:myTorch/memory/JANETCell.py` (docs/protocol.md §4): the candidate is
weighted by 1 − f_t, with no β shift (the JANET paper weights it by 1 − σ(s_t − β), s_t the forget
gate's pre-activation), and there is no separate cell state, h_t = c_t. Initialisation as there:
Xavier-normal input weights, an orthogonal N×N recurrent matrix per gate, b_c = 0, b_f = `forget_bias`
(1), or chrono when `chrono_tmax` is set: b_f = log(k), k drawn uniformly from the integers {1..t_max}
(the code's `randint(1, t_max + 1)`; docs/protocol.md §4). myTorch's optional LayerNorm on the
candidate is not implemented.

Parameters: weight_ih [2N, d] = [W_xf; W_xc], weight_hh [2N, N] = [W_hf; W_hc], bias [2N] = [b_f; b_c]
(torch's h·Wᵀ convention; myTorch stores the transposes). The recurrence runs as one autograd function
for the whole sequence (`trainers.kernels_gated.JANETScan`): both input projections are one matmul
over all T steps before the loop, both gates' recurrent parts one addmm per step, and the backward
is written by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from trainers.cells.base import Cell
from trainers.cells.lstm import check_chrono_tmax, chrono_forget_bias
from trainers.kernels_gated import janet_scan


@dataclass(frozen=True)
class JANETConfig:
    forget_bias: float = 1.0  # b_f at init (myTorch: 1)
    chrono_tmax: int | None = None  # chrono init b_f = log U{1..t_max} (overrides forget_bias); None: off


class JANETCell(Cell):
    name = "janet"
    Config = JANETConfig
    config: JANETConfig

    def __init__(self, config: JANETConfig, input_size: int, hidden_size: int, gen: torch.Generator) -> None:
        super().__init__(config, input_size, hidden_size, gen)
        N, d = hidden_size, input_size
        self.weight_ih = nn.Parameter(torch.empty(2 * N, d))  # [W_xf; W_xc]
        self.weight_hh = nn.Parameter(torch.empty(2 * N, N))  # [W_hf; W_hc]
        self.bias = nn.Parameter(torch.zeros(2 * N))  # [b_f; b_c]
        with torch.no_grad():  # myTorch's _reset_parameters order: W_x2f, W_x2c, W_h2f, W_h2c
            nn.init.xavier_normal_(self.weight_ih[:N], generator=gen)  # std √(2/(d + N))
            nn.init.xavier_normal_(self.weight_ih[N:], generator=gen)
            nn.init.orthogonal_(self.weight_hh[:N], generator=gen)
            nn.init.orthogonal_(self.weight_hh[N:], generator=gen)
            if config.chrono_tmax is not None:
                self.bias[:N] = chrono_forget_bias(config.chrono_tmax, N, gen)
            else:
                self.bias[:N] = config.forget_bias

    @classmethod
    def resolve(cls, config: JANETConfig, default_nonlinearity: str) -> JANETConfig:
        check_chrono_tmax(config.chrono_tmax)  # fail at config time, not in the trial
        return config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h0 = x.new_zeros(x.shape[1], self.hidden_size)  # [B, N]
        return janet_scan(x, h0, self.weight_ih, self.weight_hh, self.bias)  # [T, B, N]
