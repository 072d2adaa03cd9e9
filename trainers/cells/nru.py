"""Non-saturating Recurrent Unit (Chandar et al. 2019), as the authors' code computes it
(`apsarath/NRU:nru_project/NRU.py`, = `myTorch/memnets/FlatMemoryCell.py`; docs/protocol.md §4).

    h_t   = ReLU(LN?(W [x_t, h_{t−1}, m_{t−1}] + b))                          (eq. 9)           [B, N]
    α, β  = ρ(W_α [h_t, m_{t−1}] + b_α), ρ(W_β [h_t, m_{t−1}] + b_β)          (eqs. 11-12)      [B, k]
    p, q  = split(W_u [h_t, m_{t−1}] + b_u),  one W_u for writing, one for erasing  (eqs. 15-16) [B, √(mk)]
    v     = L5-normalise(ρ((p qᵀ).view(k, m)))  along m, per head            (eqs. 13-14, 17)  [B, k, m]
    m_t   = m_{t−1} + reduce_i(α_i v^w_i − β_i v^e_i),  reduce = mean (code) or sum (eq. 10)  [B, m]

ρ is the identity, or ReLU when `use_relu` (the paper's default is linear heads). h_0 = m_0 = 0.
Where the paper and the code differ we follow the code: the heads see (h_t, m_{t−1}) only, not x_t
(the paper writes f(x_t, h_t, m_{t−1})), and the memory increment averages the k heads (eq. 10 sums
them: `head_reduction="sum"`). The outer-product trick produces all k heads' directions from one
pair of √(m·k)-vectors, so m·k must be a perfect square. The readout sees h_t. Every Linear layer
has PyTorch's default init, drawn in the code's order. The recurrence runs as one autograd function
for the whole sequence with a hand-written backward (`trainers.kernels_nru.NRUScan`); the former
eager step is its reference in the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from trainers.cells.base import Cell
from trainers.initializers import torch_default_linear
from trainers.kernels_nru import nru_scan
from trainers.params import ConfigError


@dataclass(frozen=True)
class NRUConfig:
    memory_size: int = 64  # m, the flat memory's width (the code's default; paper copy 64, psMNIST 256)
    heads: int = 4  # k writing heads and k erasing heads
    use_relu: bool = False  # ReLU on α, β and the directions (False: linear heads, the paper's default)
    layer_norm: bool = False  # LayerNorm on h's pre-activation (the paper uses it only for RNN-id/orth)
    head_reduction: Literal["mean", "sum"] = "mean"  # mean: the code; sum: the paper's eq. 10

    def __post_init__(self) -> None:
        for name in ("memory_size", "heads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"nru: {name} = {getattr(self, name)} must be at least 1")
        mk = self.memory_size * self.heads
        if math.isqrt(mk) ** 2 != mk:
            k = self.heads
            fix = next(
                m
                for m in range(self.memory_size + 1, k * (math.isqrt(self.memory_size) + 1) ** 2 + 1)
                if math.isqrt(m * k) ** 2 == m * k
            )
            raise ConfigError(
                f"nru: memory_size × heads = {self.memory_size} × {k} = {mk} must be a perfect square: the "
                f"outer-product trick builds the k·m direction entries from two √(m·k)-vectors; use e.g. "
                f"memory_size={fix} heads={k} (√(m·k) = {math.isqrt(fix * k)}); "
                "the paper's psMNIST uses memory_size=256 heads=4"
            )


class NRUCell(Cell):
    name = "nru"
    Config = NRUConfig
    config: NRUConfig

    def __init__(self, config: NRUConfig, input_size: int, hidden_size: int, gen: torch.Generator) -> None:
        super().__init__(config, input_size, hidden_size, gen)
        d, N, M, k = input_size, hidden_size, config.memory_size, config.heads
        s = math.isqrt(M * k)  # √(m·k)
        self.sqrt_mk = s
        # the authors' construction order (hence the order of draws from `gen`)
        # write direction factors p^w, q^w (eqs. 15-16)
        self.hm2v_alpha = torch_default_linear(N + M, 2 * s, gen)
        self.hm2v_beta = torch_default_linear(N + M, 2 * s, gen)  # erase direction factors p^e, q^e
        self.hm2alpha = torch_default_linear(N + M, k, gen)  # α (eq. 11)
        self.hm2beta = torch_default_linear(N + M, k, gen)  # β (eq. 12)
        self.ln = nn.LayerNorm(N) if config.layer_norm else None
        # W = [W_i | W_h | W_c] over [x_t, h_{t−1}, m_{t−1}] (eq. 9)
        self.hmi2h = torch_default_linear(d + N + M, N, gen)

    def head_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The four head layers over [h_t, m_{t−1}] stacked as one: W [2k + 4s, N+m], b [2k + 4s]."""
        layers = (self.hm2alpha, self.hm2beta, self.hm2v_alpha, self.hm2v_beta)
        return torch.cat([la.weight for la in layers]), torch.cat([la.bias for la in layers])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [T, B, d] → [T, B, N]
        return self.scan(x, keep_memory=False)[0]

    def scan(self, x: torch.Tensor, keep_memory: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """All hidden states h_t [T, B, N] and, if `keep_memory`, all memory states m_t [T, B, m]."""
        c = self.config
        w_heads, b_heads = self.head_weights()
        out = nru_scan(
            x, self.hmi2h.weight, self.hmi2h.bias, w_heads, b_heads, self.ln,
            c.heads, c.memory_size, c.use_relu, c.head_reduction, keep_memory,
        )  # fmt: skip
        return out[0], (out[1] if keep_memory else None)

    def recurrent_matrix(self) -> torch.Tensor:
        """W_h [N, N], the h_{t−1} → h_t block of eq. 9 (the memory path is not in it)."""
        d, N = self.input_size, self.hidden_size
        return self.hmi2h.weight[:, d : d + N].detach()
