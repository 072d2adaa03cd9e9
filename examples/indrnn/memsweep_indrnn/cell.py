"""IndRNN, the independently recurrent network (Li, Li, Cook, Zhu & Gao, "Independently Recurrent Neural
Network (IndRNN): Building A Longer and Deeper RNN", CVPR 2018, arXiv:1803.04831), as a memsweep cell.

    h_t = ReLU(W x_t + u ⊙ h_{t−1} + b),   h_0 = 0                         (paper eq. 2)

Each unit has one recurrent weight u_n: the units of a layer are independent, and |u_n| regulates how
far back its gradient reaches (§3.1). The paper constrains |u_n| ≤ (T−t)√γ for a horizon T − t and
the largest gradient γ that does not explode, and on the adding problem (§5.1) uses
|u_n| ∈ (0, 2^{1/T}) for sequences of length T: over T steps a unit's gradient then grows at most by 2.

Defaults: the paper's adding-problem experiments (§5.1) as the authors ran them, in their code
`Sunnydreamrain/IndRNN_Theano_Lasagne`, `adding/adding.py` (the repository the paper's PyTorch code,
`Sunnydreamrain/IndRNN_pytorch`, names for "all the experiments used in the paper"), and its README's
"Considerations in implementation":

- `T` = 500: the sequence length the bound and the initial range are computed for — `adding.py`'s
  default `--seq_len 500`, one of the paper's T ∈ {100, 500, 1000, 5000}. The cell cannot see the
  task's length when it is built (`Cell.resolve` is given only the task's nonlinearity), so set it to
  the task's: `cell_params: {T: 750}` on `orhan2020-addition750`. A T below the real length loosens
  the bound (the gradient may grow by 2^{length/T}), one above tightens it.
- `mag` = 2: `adding.py --MAG 2`; the bound is mag^{1/T} (§5.1's 2^{1/T}; the README: "MAG can be 2
  or 10 or others").
- the constraint, |u_n| ≤ mag^{1/T}: `adding.py` clips u to [−bound, bound] (np.clip) before every
  training step; here `after_step` clips it after every optimiser step, the same sequence of clips
  but for the last (the authors' final weights are unclipped).
- `recurrent_init` = "last_layer": u ~ U(mag^{−1/T}, mag^{1/T}), `adding.py`'s range for the last
  (readout) layer; "first_layer" is its range for the other layers, U(0, mag^{1/T}). memsweep's one
  layer is the one read out, and the README recommends, for tasks read at the last step only (adding,
  MNIST, action recognition), a last layer initialised near 1 "since only long-term memory is needed
  for the output of this layer".
- `input_std` = 0.001: W ~ N(0, 0.001²), `adding.py --in2hidW 0.001` (`lasagne.init.Normal(std)`).
- `bias`: one bias b, zero at the start (Lasagne's DenseLayer default `b=Constant(0.)`, the layer the
  authors' IndRNNLayer uses for W x + b).
- `nonlinearity` = relu: the paper's ("The proposed IndRNN was evaluated with relu activation
  function", §5.1); the only one offered (`adding.py`'s tanh variant needs another bound,
  (MAG / 0.9^{T/10})^{1/T}, and the paper does not report it).
The readout is memsweep's (Glorot-uniform weights, zero bias): Lasagne's DenseLayer default, as in
`adding.py`. The initial weights come from the trial's `gen` only: W first, then u (Lasagne's order).

Departures:
- one recurrent layer (memsweep's model is one cell and a linear readout); the paper stacks two on
  the adding problem (and deeper stacks elsewhere, up to 21 layers). Within one layer the units are
  independent and ReLU follows the sum, so a single layer cannot form the product "value × marker"
  before storing it: it learns the adding problem only in part (the paper's first layer does that,
  §5.1.1). For the same reason a unit whose state reaches 0 forgets everything before: with
  zero-mean inputs and the zero bias, a small layer may carry no gradient from the first step to the
  fortieth (memsweep's contract test "gradient reaches the first step" fails so on har2 and
  bigpsmnist at 12 units);
- no gradient clipping inside the recurrence (`adding.py` passes Lasagne `grad_clipping=10`, which
  clips ∂L/∂z_t elementwise at every step); memsweep clips the global gradient norm (`clip_norm`);
- the optimiser and learning rate are the study's (the paper: Adam, 2e-4, ÷10 every 20k steps).

`grid` is {}: the paper swept no hyperparameter of IndRNN on the adding problem (T is the task's
length; the learning rate, 2e-4 for ReLU models, and MAG = 2 were fixed).

Fused form: `fused` runs all K members' recurrences as one `FusedIndScan` (elementwise, like SRNN's
shift: each member's numbers are its solo run's, bit for bit, tested on the CPU); the input projections
W x + b run per member with the solo op, the constraint per member with the solo clip. Not yet marked
`graphable` (no GPU has checked a CUDA-graphed step of it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn
from trainers.cells.base import Cell
from trainers.fused.cells import FusedCell
from trainers.kernels import Workspace
from trainers.params import ConfigError

from memsweep_indrnn.scan import FusedIndScan, IndScan


@dataclass(frozen=True)
class IndRNNConfig:
    T: int = 500  # the length the bound is computed for (adding.py --seq_len); set it to the task's
    mag: float = 2.0  # |u| ≤ mag^{1/T} (adding.py --MAG 2; paper §5.1: 2^{1/T})
    recurrent_init: Literal["last_layer", "first_layer"] = "last_layer"  # U(mag^{−1/T}, ·) or U(0, ·)
    input_std: float = 0.001  # W ~ N(0, input_std²) (adding.py --in2hidW)
    nonlinearity: Literal["relu"] = "relu"  # the paper's; named for memsweep's analyses
    bias: bool = True  # one bias b, zero-initialised

    def __post_init__(self) -> None:
        if self.T < 1:
            raise ConfigError(f"indrnn: T = {self.T} must be a positive sequence length, e.g. T=750")
        if self.mag < 1.0:
            raise ConfigError(f"indrnn: mag = {self.mag} must be at least 1 (|u| ≤ mag^(1/T)), e.g. mag=2")
        if self.input_std < 0.0:
            raise ConfigError(f"indrnn: input_std = {self.input_std} must be non-negative, e.g. 0.001")

    @property
    def bound(self) -> float:
        """mag^{1/T}: the largest |u_n| allowed (paper §5.1)."""
        return float(self.mag ** (1.0 / self.T))


# ----- the fused form (trainers.fused.cells): all members' recurrences at once --------------------


def fused_states(
    cells: Sequence[Cell],
    p: Mapping[str, torch.Tensor],
    xs: Sequence[torch.Tensor],
    last: bool,
    ws: Workspace,
) -> Sequence[torch.Tensor]:
    """Member k's states from the stacked parameters: its drive by the solo op on its slices, then one
    `FusedIndScan` over all members."""
    weights = p["weight_ih"].unbind(0)
    biases = p["bias"].unbind(0) if "bias" in p else (None,) * len(xs)
    drives = [F.linear(x, w, b) for x, w, b in zip(xs, weights, biases, strict=True)]
    return FusedIndScan.apply(last, ws, p["weight_hh"], *drives)  # type: ignore[no-any-return]


def fused_after_step(cells: Sequence[Cell], p: Mapping[str, torch.Tensor]) -> None:
    """Each member's constraint, by its own cell's clip (members may differ in T and mag)."""
    for cell, u in zip(cells, p["weight_hh"].unbind(0), strict=True):
        if not isinstance(cell, IndRNNCell):
            raise TypeError(f"{type(cell).__name__} is not an IndRNNCell: it cannot share an indrnn bundle")
        cell.constrain_(u)


class IndRNNCell(Cell):
    name = "indrnn"
    Config = IndRNNConfig
    grid: ClassVar[Mapping[str, tuple[Any, ...]]] = {}  # the paper swept none of its own hyperparameters
    #: members must share `bias` (the parameters' shapes) and `nonlinearity`; T, mag, recurrent_init and
    #: input_std set only initial weights and each member's own bound, and may differ. Not `graphable`
    #: until a GPU has shown a graphed step bit-equal to the eager one (bit equality with solo runs is
    #: tested on the CPU only so far): a bundle's step runs eager on a GPU
    fused: ClassVar[FusedCell | None] = FusedCell(
        ("bias", "nonlinearity"), fused_states, fused_after_step, stores=2, graphable=False
    )
    config: IndRNNConfig

    def __init__(self, config: IndRNNConfig, input_size: int, hidden_size: int, gen: torch.Generator) -> None:
        super().__init__(config, input_size, hidden_size, gen)
        N, d, bound = hidden_size, input_size, config.bound
        # adding.py's U_lowbound = (1/MAG)^{1/T} for the last layer, 0 for the others
        low = (1.0 / config.mag) ** (1.0 / config.T) if config.recurrent_init == "last_layer" else 0.0
        w = torch.randn(N, d, generator=gen) * config.input_std
        u = low + (bound - low) * torch.rand(N, generator=gen)
        self.weight_ih = nn.Parameter(w)  # W [N, d]
        self.weight_hh = nn.Parameter(u)  # u [N], one recurrent weight per unit
        self.bias = nn.Parameter(torch.zeros(N)) if config.bias else None  # b [N]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [T, B, d] → [T, B, N]
        drive = F.linear(x, self.weight_ih, self.bias)  # W x_t + b, all steps at once
        return IndScan.apply(drive, self.weight_hh)  # type: ignore[no-any-return]

    def constrain_(self, u: torch.Tensor) -> None:
        """|u_n| ≤ mag^{1/T}, in place (`adding.py`: np.clip(u, −bound, bound))."""
        bound = self.config.bound
        u.clamp_(-bound, bound)

    @torch.no_grad()
    def after_step(self) -> None:
        self.constrain_(self.weight_hh)

    def recurrent_matrix(self) -> torch.Tensor:
        """diag(u) [N, N]: unit n's only recurrent weight is its own."""
        return torch.diag(self.weight_hh.detach())

    def input_matrix(self) -> torch.Tensor:
        return self.weight_ih.detach()
