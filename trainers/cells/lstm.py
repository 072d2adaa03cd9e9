"""LSTM, one bias per gate (Keras `LSTM`), on torch's native kernel; with peepholes on request.

    i_t = σ(W_ii x_t + W_hi h_{t−1} + b_i)        input gate
    f_t = σ(W_if x_t + W_hf h_{t−1} + b_f)        forget gate
    g_t = tanh(W_ig x_t + W_hg h_{t−1} + b_g)     candidate
    o_t = σ(W_io x_t + W_ho h_{t−1} + b_o)        output gate
    c_t = f_t ⊙ c_{t−1} + i_t ⊙ g_t,   h_t = o_t ⊙ tanh(c_t),   h_0 = c_0 = 0

Parameters: weight_ih [4N, d], weight_hh [4N, N], ONE bias [4N] (gate order i, f, g, o; torch's and
Keras' order alike). `nn.LSTM` trains two biases (b_ih + b_hh); Keras has one, and the SGORNN
paper's LSTM counts need one: h=128, d=2 plus a 1-unit readout = 67,201; h=64, d=9 = 19,009
(docs/protocol.md §5). `bias_hh` adds nn.LSTM's second, `bias_hh` [4N] (zero, or drawn as `bias` with
the inits that draw it, right after it: nn.LSTM's order), for the papers whose LSTM was `nn.LSTM`
(Rotman & Wolf's; awd-lstm-lm's). The kernel is `torch._VF.lstm` (what `nn.LSTM` calls; cuDNN on GPU)
with our parameters and b_hh (a constant zero without `bias_hh`), as `trainers.kernels` does for the
Elman RNN.

Initialisers (`init`):
- keras    Keras 2.3.1 `LSTM` defaults (the SGORNN code, `sgornn/models.py`): Glorot-uniform input kernel
           over all four gates (fan_in d, fan_out 4N), an orthogonal recurrent kernel over the whole
           [N, 4N] matrix (rows orthonormal in Keras' x·K convention, so weight_hh [4N, N] has
           orthonormal columns), zero biases, b_f = 1 (`unit_forget_bias=True`). Keras ≥ 2.3 uses the
           sigmoid as recurrent activation, as here (2.2.x used hard_sigmoid).
- plain    PyTorch's `nn.LSTM` default: every weight and the bias ~ U(−1/√N, 1/√N). (nn.LSTM's
           effective bias b_ih + b_hh is a sum of two such draws: with `bias_hh`, ours too.)
- mytorch  the NRU authors' LSTM (`apsarath/myTorch:myTorch/memory/LSTMCell.py`): Xavier-normal input
           weights and an orthogonal N×N recurrent matrix per gate, b_f = 1, other biases 0; their
           peepholes are `peepholes` (below).
Orhan & Pitkow's Table 3 initialisers (§3.3: "we treated the input, forget, output, and update gates of the
LSTM architecture as analogous to vanilla RNNs and initialized the recurrent and input matrices inside these
gates in the same way as in the chain or the orthogonal initialization of vanilla RNNs"). Each gate's block
comes from `trainers.initializers` (W_ij from unit j to unit i, the chain on the sub-diagonal, docs/protocol.md §1.4):
- orthogonal  every gate: W = λ Q (its own Haar-random Q), V ~ N(0, std 0.9/√N); λ = `scale` (default 1).
- chain       every gate: W_ij = α δ_{j,i−1}, V = 0.9·I_{N×d} (the same block four times, as the authors'
              `NonnormalInit_torchlstm.py:chain_init` / `nonnormal_source_init`); α = `scale` (default 1.02,
              their default).
- mixed       "a chain initializer for the update gate and a monotonically increasing recurrent weight
              profile for the other gates" (§3.3, Table 3): g gets the chain (α = `scale`, default 1.02);
              i, f, o get the ramp W_ij = ε (i − j)/(N − 1), ε = 0.01 (the authors' `ramp_init`, a Toeplitz
              matrix from −ε to ε, there built for their reversed torch orientation; we mirror it with the
              chain, so the profile rises along the chain's direction); V = 0.9·I_{N×d} for every gate.
The paper gives no bias for these; its LSTMs ran in PyTorch (awd-lstm-lm), whose nn.LSTM keeps its default
biases when only the weight matrices are replaced, so b ~ U(−1/√N, 1/√N) as in `plain` (`forget_bias` and
`chrono_tmax` override it as for every init).

`forget_bias` sets b_f after the init (None: the init's own value); with `bias_hh`, b_hh keeps its draw,
so the forget gate's bias is `forget_bias` plus b_hh's share, as setting nn.LSTM's b_ih alone gives. `chrono_tmax` applies the chrono
initialisation as the NRU authors' code does it (`LSTMCell.py:138-142`; docs/protocol.md §4):
b_f = log(k), k drawn uniformly from the integers {1..t_max}, and b_i = −b_f. It overrides `forget_bias`.

`peepholes` (Graves 2013, the NRU authors' myTorch LSTM, §3.4): diagonal weights from the cell state to
the gates, p_i, p_f on c_{t−1} and p_o on c_t,

    i_t = σ(… + p_i ⊙ c_{t−1}),   f_t = σ(… + p_f ⊙ c_{t−1}),   o_t = σ(… + p_o ⊙ c_t),

`peephole` [3, N] (rows i, f, o), drawn from U(0, 1) as myTorch draws them (`nn.init.uniform_`), after
every other weight. torch's kernel has none: the cell then trains through plain autograd, step by step
(`trainers.kernels_gated.lstm_peepholes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from trainers import numerics
from trainers.cells.base import Cell
from trainers.initializers import chain, orthogonal, source_input
from trainers.kernels_gated import lstm_peepholes
from trainers.params import UNHASHED_DEFAULT, ConfigError

INITS = ("keras", "plain", "mytorch", "orthogonal", "chain", "mixed")
CHAIN_ALPHA = 1.02  # the authors' LSTM chain weight (`chain_init` offdiag_gain, `ramp_init` diag_gain)
RAMP_END = 0.01  # the authors' `ramp_init` end_gain ε: the sigmoid gates' W_ij = ε (i − j)/(N − 1)
INPUT_GAIN = 0.9  # V = 0.9·I (chain, mixed) or std 0.9/√N (orthogonal), as for the vanilla RNN


@dataclass(frozen=True)
class LSTMConfig:
    init: Literal["keras", "plain", "mytorch", "orthogonal", "chain", "mixed"] = "keras"
    forget_bias: float | None = None  # b_f at init; None: the init's own (keras, mytorch 1; plain drawn)
    chrono_tmax: int | None = None  # chrono init b_f = log U{1..t_max}, b_i = −b_f; None: off
    scale: float | None = None  # orthogonal λ (default 1.0); chain, mixed: the chain's α (default 1.02)
    peepholes: bool = field(default=False, metadata=UNHASHED_DEFAULT)  # myTorch's p_i, p_f, p_o (above)
    bias_hh: bool = field(default=False, metadata=UNHASHED_DEFAULT)  # nn.LSTM's second bias (above)


def ramp(n: int, end: float = RAMP_END) -> torch.Tensor:
    """W [n, n] with W_ij = end·(i − j)/(n − 1): a weight profile rising linearly in i − j from −end to end."""
    idx = torch.arange(n, dtype=torch.float64)
    return (end * (idx[:, None] - idx[None, :]) / max(n - 1, 1)).float()


def gate_blocks(
    init: str, n: int, d: int, scale: float | None, gen: torch.Generator
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Orhan & Pitkow's per-gate (W [n, n], V [n, d]) blocks in gate order i, f, g, o (Table 3)."""
    if init == "orthogonal":
        lam = 1.0 if scale is None else scale
        pairs = [orthogonal(n, d, lam, 0.0, INPUT_GAIN, gen) for _ in range(4)]  # each gate its own Q
        return [w for w, _ in pairs], [v for _, v in pairs]
    alpha = CHAIN_ALPHA if scale is None else scale
    w_chain, v_source = chain(n, d, alpha, 0.0, INPUT_GAIN, gen)  # W_ij = α δ_{j,i−1}, V = 0.9·I
    if init == "chain":
        return [w_chain] * 4, [v_source] * 4
    w_ramp = ramp(n)
    return [w_ramp, w_ramp, w_chain, w_ramp], [source_input(n, d, INPUT_GAIN)] * 4  # mixed: chain in g only


def check_chrono_tmax(t_max: int | None) -> None:
    if t_max is not None and t_max < 1:
        raise ConfigError(f"chrono_tmax = {t_max} must be at least 1 (or none to switch chrono off)")


def chrono_forget_bias(t_max: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """b_f [n] = log(k), k ~ U{1..t_max} (integers, as `np.random.randint(1, t_max + 1)` in myTorch)."""
    check_chrono_tmax(t_max)
    k = torch.randint(1, t_max + 1, (n,), generator=gen, dtype=torch.float64)
    return numerics.log(k).float()


class LSTMCell(Cell):
    name = "lstm"
    Config = LSTMConfig
    config: LSTMConfig

    def __init__(self, config: LSTMConfig, input_size: int, hidden_size: int, gen: torch.Generator) -> None:
        super().__init__(config, input_size, hidden_size, gen)
        N, d = hidden_size, input_size
        self.weight_ih = nn.Parameter(torch.empty(4 * N, d))  # [W_ii; W_if; W_ig; W_io]
        self.weight_hh = nn.Parameter(torch.empty(4 * N, N))  # [W_hi; W_hf; W_hg; W_ho]
        self.bias = nn.Parameter(torch.zeros(4 * N))  # [b_i; b_f; b_g; b_o]
        self.bias_hh = nn.Parameter(torch.zeros(4 * N)) if config.bias_hh else None  # nn.LSTM's b_hh
        drawn = [b for b in (self.bias, self.bias_hh) if b is not None]  # nn.LSTM's order: b_ih, b_hh
        with torch.no_grad():
            if config.init == "keras":
                nn.init.xavier_uniform_(self.weight_ih, generator=gen)  # U(±√(6/(d + 4N)))
                nn.init.orthogonal_(self.weight_hh, generator=gen)  # [4N, N], Wᵀ W = I_N
                self.bias[N : 2 * N] = 1.0
            elif config.init == "plain":
                k = 1.0 / math.sqrt(N)
                for p in (self.weight_ih, self.weight_hh, *drawn):
                    nn.init.uniform_(p, -k, k, generator=gen)
            elif config.init == "mytorch":  # myTorch's order: the four input blocks, then the four recurrent
                gates = [slice(k * N, (k + 1) * N) for k in range(4)]  # i, f, g, o
                for rows in gates:
                    nn.init.xavier_normal_(self.weight_ih[rows], generator=gen)  # [N, d], std √(2/(d + N))
                for rows in gates:
                    nn.init.orthogonal_(self.weight_hh[rows], generator=gen)  # [N, N]
                self.bias[N : 2 * N] = 1.0
            elif config.init in ("orthogonal", "chain", "mixed"):  # Orhan & Pitkow Table 3
                k = 1.0 / math.sqrt(N)
                for b in drawn:
                    nn.init.uniform_(b, -k, k, generator=gen)  # nn.LSTM's default biases (see above)
                ws, vs = gate_blocks(config.init, N, d, config.scale, gen)
                self.weight_hh.copy_(torch.cat(ws))  # [4N, N]
                self.weight_ih.copy_(torch.cat(vs))  # [4N, d]
            else:
                raise ConfigError(f"lstm: unknown init {config.init!r}; choose one of {', '.join(INITS)}")
            if config.forget_bias is not None:
                self.bias[N : 2 * N] = config.forget_bias
            if config.chrono_tmax is not None:
                b_f = chrono_forget_bias(config.chrono_tmax, N, gen)
                self.bias[N : 2 * N] = b_f
                self.bias[:N] = -b_f
        #: [p_i; p_f; p_o], the diagonal peephole weights (`peepholes`), else None
        self.peephole = nn.Parameter(torch.empty(3, N)) if config.peepholes else None
        if self.peephole is not None:
            with torch.no_grad():
                nn.init.uniform_(self.peephole, 0.0, 1.0, generator=gen)  # myTorch: nn.init.uniform_

    @classmethod
    def resolve(cls, config: LSTMConfig, default_nonlinearity: str) -> LSTMConfig:
        check_chrono_tmax(config.chrono_tmax)  # fail at config time, not in the trial
        if config.scale is not None and config.init not in ("orthogonal", "chain", "mixed"):
            raise ConfigError(
                f"lstm: scale = {config.scale} has no effect with init {config.init!r}; it is λ of "
                "init=orthogonal and α of init=chain / mixed (or leave scale unset)"
            )
        return config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.peephole is not None:
            zeros = x.new_zeros(x.shape[1], self.hidden_size)  # h_0 = c_0 = 0   [B, N]
            bias = self.bias if self.bias_hh is None else self.bias + self.bias_hh
            return lstm_peepholes(x, zeros, self.weight_ih, self.weight_hh, bias, self.peephole)
        h0 = x.new_zeros(1, x.shape[1], self.hidden_size)  # [layers=1, B, N]
        b_hh = torch.zeros_like(self.bias) if self.bias_hh is None else self.bias_hh  # b_hh ≡ 0 by default
        params = [self.weight_ih, self.weight_hh, self.bias, b_hh]
        # _VF.lstm(input, (h0, c0), params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
        out, _, _ = torch._VF.lstm(x, (h0, h0), params, True, 1, 0.0, torch.is_grad_enabled(), False, False)
        return out  # [T, B, N]
