"""GRU with PyTorch's semantics (Cho et al. 2014, as `nn.GRU`).

    r_t = σ(W_ir x_t + b_ir + W_hr h_{t−1} + b_hr)              reset gate
    z_t = σ(W_iz x_t + b_iz + W_hz h_{t−1} + b_hz)              update gate
    n_t = tanh(W_in x_t + b_in + r_t ⊙ (W_hn h_{t−1} + b_hn))   candidate
    h_t = (1 − z_t) ⊙ n_t + z_t ⊙ h_{t−1},   h_0 = 0

Parameters: weight_ih [3N, d], weight_hh [3N, N], bias_ih [3N], bias_hh [3N] (gate order r, z, n).
Both biases are kept and trained, as in `nn.GRU`: they are redundant for r and z but not for the
candidate, where the reset gate multiplies W_hn h + b_hn. `backend` (as the `rnn` cell's): `scan`,
our whole-sequence autograd function (`trainers.kernels_gated.GRUScan`, faster than torch's kernel
on the CPU); `native`, `torch._VF.gru`, what `nn.GRU` calls (cuDNN on GPU); `auto` (default), the
scan on the CPU and native elsewhere. Either way the parameters are our own, drawn from the trial's
generator.

`reset="before"`: the NRU authors' GRU (`apsarath/myTorch:myTorch/memory/GRUCell.py`, as of their
experiments, 2018; Chung et al. 2014's equations), the reset gate applied to h before the product and
one bias per gate:

    n_t = tanh(W_in x_t + W_hn (r_t ⊙ h_{t−1}) + b_n)

r_t and z_t as above with one bias each (`bias_ih`; there is no `bias_hh`). It trains through plain
autograd, step by step (`trainers.kernels_gated.gru_reset_before`): `backend` stays `auto`.

Initialisers (`init`):
- plain    PyTorch's `nn.GRU` default: every weight and every bias ~ U(−1/√N, 1/√N).
- mytorch  the NRU authors' GRUCell: Xavier-normal input weights and an orthogonal N×N recurrent matrix
           per gate, zero biases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from trainers.cells.base import Cell
from trainers.kernels_gated import gru, gru_reset_before
from trainers.params import UNHASHED_DEFAULT, ConfigError


@dataclass(frozen=True)
class GRUConfig:
    init: Literal["plain", "mytorch"] = "plain"
    backend: Literal["auto", "scan", "native"] = "auto"  # see trainers.kernels_gated.gru
    # where the reset gate acts: "after" the recurrent product, r ⊙ (W_hn h + b_hn) (nn.GRU, cuDNN);
    # "before" it, W_hn (r ⊙ h), one bias per gate (Chung et al. 2014; the NRU authors' myTorch GRU)
    reset: Literal["after", "before"] = field(default="after", metadata=UNHASHED_DEFAULT)


class GRUCell(Cell):
    name = "gru"
    Config = GRUConfig
    config: GRUConfig

    def __init__(self, config: GRUConfig, input_size: int, hidden_size: int, gen: torch.Generator) -> None:
        super().__init__(config, input_size, hidden_size, gen)
        N, d = hidden_size, input_size
        self.weight_ih = nn.Parameter(torch.empty(3 * N, d))  # [W_ir; W_iz; W_in]
        self.weight_hh = nn.Parameter(torch.empty(3 * N, N))  # [W_hr; W_hz; W_hn]
        self.bias_ih = nn.Parameter(torch.empty(3 * N))  # [b_ir; b_iz; b_in] (reset before: b_r, b_z, b_n)
        # [b_hr; b_hz; b_hn]; none with the reset before the product (one bias per gate)
        self.bias_hh = nn.Parameter(torch.empty(3 * N)) if config.reset == "after" else None
        biases = [b for b in (self.bias_ih, self.bias_hh) if b is not None]
        with torch.no_grad():
            if config.init == "plain":
                k = 1.0 / math.sqrt(N)
                for p in (self.weight_ih, self.weight_hh, *biases):  # nn.GRU's order
                    nn.init.uniform_(p, -k, k, generator=gen)
            else:  # mytorch's order: the three input blocks, then the three recurrent; zero biases
                gates = [slice(k * N, (k + 1) * N) for k in range(3)]  # r, z, n
                for rows in gates:
                    nn.init.xavier_normal_(self.weight_ih[rows], generator=gen)  # [N, d], std √(2/(d + N))
                for rows in gates:
                    nn.init.orthogonal_(self.weight_hh[rows], generator=gen)  # [N, N]
                for b in biases:
                    b.zero_()

    @classmethod
    def resolve(cls, config: GRUConfig, default_nonlinearity: str) -> GRUConfig:
        if config.reset == "before" and config.backend != "auto":
            raise ConfigError(
                f"gru: backend {config.backend!r} has no reset-before GRU (torch's and our scan apply the "
                "reset after the product); leave backend auto with reset=before"
            )
        return config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h0 = x.new_zeros(x.shape[1], self.hidden_size)  # [B, N]
        if self.bias_hh is None:
            return gru_reset_before(x, h0, self.weight_ih, self.weight_hh, self.bias_ih)
        return gru(x, h0, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh, self.config.backend)
