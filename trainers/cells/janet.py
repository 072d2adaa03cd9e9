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
(torch's h·Wᵀ convention; myTorch stores the transposes). Both input projections are one matmul over
all T steps before the loop, and both gates' recurrent parts are one addmm per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from trainers.cells.base import Cell
from trainers.cells.lstm import check_chrono_tmax, chrono_forget_bias


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
        T, B, d = x.shape
        N = self.hidden_size
        # both gates' input parts and biases for all steps at once: [T·B, d] × [d, 2N] → [T, B, 2N]
        xp = torch.addmm(self.bias, x.reshape(T * B, d), self.weight_ih.t()).view(T, B, 2 * N)
        w_hh = self.weight_hh.t()  # [N, 2N]
        h = x.new_zeros(B, N)  # h_0
        hs = []
        for xp_t in xp.unbind(0):
            a = torch.addmm(xp_t, h, w_hh)  # [B, 2N] = [W_f; W_c][x_t, h_{t−1}] + [b_f; b_c]
            f = torch.sigmoid(a[:, :N])  # f_t
            c = torch.tanh(a[:, N:])  # candidate
            h = torch.lerp(c, h, f)  # f ⊙ h_{t−1} + (1 − f) ⊙ candidate
            hs.append(h)
        return torch.stack(hs)  # [T, B, N]
