"""GRU with PyTorch's semantics (Cho et al. 2014, as `nn.GRU`).

    r_t = σ(W_ir x_t + b_ir + W_hr h_{t−1} + b_hr)              reset gate
    z_t = σ(W_iz x_t + b_iz + W_hz h_{t−1} + b_hz)              update gate
    n_t = tanh(W_in x_t + b_in + r_t ⊙ (W_hn h_{t−1} + b_hn))   candidate
    h_t = (1 − z_t) ⊙ n_t + z_t ⊙ h_{t−1},   h_0 = 0

Parameters: weight_ih [3N, d], weight_hh [3N, N], bias_ih [3N], bias_hh [3N] (gate order r, z, n).
Both biases are kept and trained, as in `nn.GRU`: they are redundant for r and z but not for the
candidate, where the reset gate multiplies W_hn h + b_hn. (The NRU authors' GRU baseline,
`apsarath/myTorch:myTorch/memory/GRUCell.py`, has one bias per gate, r ⊙ (W_hn h) with no b_hn, and
draws every weight from U(0, 1); we keep PyTorch's cell.) `backend` (as the `rnn` cell's): `scan`,
our whole-sequence autograd function (`trainers.kernels_gated.GRUScan`, faster than torch's kernel
on the CPU); `native`, `torch._VF.gru`, what `nn.GRU` calls (cuDNN on GPU); `auto` (default), the
scan on the CPU and native elsewhere. Either way the parameters are our own, drawn from the trial's
generator.

Initialisers (`init`; a Literal meant to grow):
- plain  PyTorch's `nn.GRU` default: every weight and both biases ~ U(−1/√N, 1/√N).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from trainers.cells.base import Cell
from trainers.kernels_gated import gru


@dataclass(frozen=True)
class GRUConfig:
    init: Literal["plain"] = "plain"
    backend: Literal["auto", "scan", "native"] = "auto"  # see trainers.kernels_gated.gru


class GRUCell(Cell):
    name = "gru"
    Config = GRUConfig
    config: GRUConfig

    def __init__(self, config: GRUConfig, input_size: int, hidden_size: int, gen: torch.Generator) -> None:
        super().__init__(config, input_size, hidden_size, gen)
        N, d = hidden_size, input_size
        self.weight_ih = nn.Parameter(torch.empty(3 * N, d))  # [W_ir; W_iz; W_in]
        self.weight_hh = nn.Parameter(torch.empty(3 * N, N))  # [W_hr; W_hz; W_hn]
        self.bias_ih = nn.Parameter(torch.empty(3 * N))  # [b_ir; b_iz; b_in]
        self.bias_hh = nn.Parameter(torch.empty(3 * N))  # [b_hr; b_hz; b_hn]
        k = 1.0 / math.sqrt(N)
        with torch.no_grad():
            for p in (self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh):  # nn.GRU's order
                nn.init.uniform_(p, -k, k, generator=gen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h0 = x.new_zeros(x.shape[1], self.hidden_size)  # [B, N]
        return gru(x, h0, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh, self.config.backend)
