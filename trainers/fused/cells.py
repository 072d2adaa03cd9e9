"""Which cells a fused bundle can train, and how: one `FusedCell` per cell name (issue 17).

A fused bundle (`trainers.fused`) stacks its members' parameters [K, …]. A cell fuses when its
recurrence, the part with one small op per timestep, can run for all K members at once with each
member's numbers its solo run's; everything else — input projections, the rotations that make
VPRNN's W, FastRNN's gates, SRNN's MLP — runs per member with the solo cell's own ops on member k's
slice of the stacked parameters, once per sequence. Each entry says:

- `shared`: the cell fields every member must share (shapes and the graph; the others only set
  initial weights and may differ);
- `states`: member k's hidden states [T, B, N] (or [B, N] with `last`) from the stacked
  parameters, named as in the cell (`weight_hh`, `rotations.theta`, …), and its inputs xs[k];
- `after_step`: the cell's `after_step` hook on the stacked parameters (URNN's projection);
- `stores`: [K, T, B, N] buffers the recurrence keeps per pass (to size validation chunks).

The scans: `FusedElmanScan` (rnn, urnn, crnn, vprnn; the persistent kernel of `trainers.kernels_persistent`
where their `backend` is "persistent"), `FusedFastRNNScan` (fastrnn, sgornn) and
`FusedShiftScan` (srnn: SRNN's shift is elementwise, so each step runs once over every member's rows;
the persistent shift kernel where its `backend` is "persistent").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainers.cells import Cell
from trainers.cells.fastrnn import fused_fast_rnn, scalar_gates
from trainers.cells.srnn import FusedShiftScan
from trainers.cells.urnn import URNNCell, project_
from trainers.cells.vprnn import rotation_matrix
from trainers.kernels import Workspace, fused_elman_rnn
from trainers.persistent import persistent_kernel

Params = Mapping[str, torch.Tensor]  # the cell's parameters, stacked [K, …], by their name in the cell
States = Callable[[Sequence[Cell], Params, Sequence[torch.Tensor], bool, Workspace], Sequence[torch.Tensor]]


@dataclass(frozen=True)
class FusedCell:
    shared: tuple[str, ...]
    states: States
    after_step: Callable[[Sequence[Cell], Params], None] | None = None
    stores: int = 2
    #: whether a CUDA graph can hold the bundle's step (`trainers.fused.graphs`): its step reads no value on
    #: the host (tested on the CPU for every cell); every member bit-equal to its eager run measured on an
    #: H100 for the Elman cells and srnn (fastrnn and sgornn since they stopped reading their gates on
    #: the host: `benchmarks/gpu_check` measures them on the next lent card). A plugin's cell that must
    #: read a value on the host says False.
    graphable: bool = True
    #: whether a config of the cell (resolved) runs another recurrence than `states` does, and so trains
    #: alone (the rnn's `layer_norm`); None: every config fuses
    alone: Callable[[Any], bool] | None = None


def _members(stacked: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Member k's slice of a stacked parameter, as K views (autograd stacks their gradients back)."""
    return stacked.unbind(0)


def _rotation_matrices(cells: Sequence[Cell], p: Params) -> torch.Tensor:
    """[K, N, N]: member k's W = φ(Θ_k) with its own fixed permutations, all at once (`rotation_matrix`)."""
    perms = torch.stack([cell.get_buffer("rotations.perms") for cell in cells])  # [K, k, N]
    return rotation_matrix(p["rotations.theta"], perms)


def _elman(
    cells: Sequence[Cell], p: Params, xs: Sequence[torch.Tensor], last: bool, ws: Workspace
) -> Sequence[torch.Tensor]:
    """rnn, urnn, crnn (W a parameter) and vprnn (W from rotations): `FusedElmanScan`, or the persistent
    kernel (`trainers.kernels_persistent`) for members whose `backend` asks it (members share it)."""
    w = p["weight_hh"] if "weight_hh" in p else _rotation_matrices(cells, p)
    h0 = xs[0].new_zeros(len(xs), xs[0].shape[1], w.shape[1])  # [K, B, N]
    nonlinearity = cells[0].config.nonlinearity or "tanh"  # as RNNCell.forward
    bias = p.get("bias")
    if bias is not None and "bias_hh" in p:  # nn.RNN's two biases, summed as RNNCell.forward sums them
        bias = bias + p["bias_hh"]
    scan = (
        persistent_kernel().persistent_elman_rnn
        if cells[0].config.backend == "persistent"
        else fused_elman_rnn
    )
    return scan(xs, h0, p["weight_ih"], w, bias, nonlinearity, last, ws)


def _fastrnn(
    cells: Sequence[Cell], p: Params, xs: Sequence[torch.Tensor], last: bool, ws: Workspace
) -> Sequence[torch.Tensor]:
    """fastrnn (W a parameter) and sgornn (W from rotations): `FusedFastRNNScan`."""
    w = p["weight_hh"] if "weight_hh" in p else _rotation_matrices(cells, p)
    clip = cells[0].config.clip_scalar
    gates = [
        scalar_gates(a, b, clip)
        for a, b in zip(_members(p["gates.alpha_raw"]), _members(p["gates.beta_raw"]), strict=True)
    ]
    a = torch.stack([g[0] for g in gates])  # [K, 1]
    b = torch.stack([g[1] for g in gates])
    nonlinearity = cells[0].config.nonlinearity
    return fused_fast_rnn(xs, p["weight_ih"], p.get("bias"), w, a, b, nonlinearity, last, ws)


def _srnn(
    cells: Sequence[Cell], p: Params, xs: Sequence[torch.Tensor], last: bool, ws: Workspace
) -> Sequence[torch.Tensor]:
    """srnn: member k's drive b_k(x) by its own MLP, then one `FusedShiftScan` over all members, or the
    persistent shift kernel (`trainers.kernels_persistent`) for members whose `backend` asks it."""
    members = {n: _members(t) for n, t in p.items()}
    f_r: nn.Sequential = cells[0].f_r  # type: ignore[assignment]
    drives = []
    for k, x in enumerate(xs):
        b = x
        for i, layer in enumerate(f_r):  # Linear (member k's weights) or ReLU, as nn.Sequential runs them
            b = (
                F.linear(b, members[f"f_r.{i}.weight"][k], members[f"f_r.{i}.bias"][k])
                if isinstance(layer, nn.Linear)
                else layer(b)
            )
        if "gate.weight" in members:  # eq. 5: f_r(x) ⊙ σ(W_s x + b_s)
            b = b * torch.sigmoid(F.linear(x, members["gate.weight"][k], members["gate.bias"][k]))
        drives.append(b)  # [T, B, N], as SRNNCell.forward
    if cells[0].config.backend == "persistent":
        return persistent_kernel().persistent_shift_scan(drives, last, ws)  # type: ignore[no-any-return]
    return FusedShiftScan.apply(last, ws, *drives)  # type: ignore[no-any-return]


def _project(cells: Sequence[Cell], p: Params) -> None:
    """urnn / crnn: every member's W projected by the solo hook's code (one batched SVD on the CPU)."""
    if not isinstance(cells[0], URNNCell):
        raise TypeError(f"{type(cells[0]).__name__} has no projection: fuse it without `_project`")
    project_(p["weight_hh"].detach(), cells[0].projection)


def _layer_norm(config: Any) -> bool:
    """rnn, urnn, crnn: `layer_norm` normalises each step's pre-activation, which `_elman`'s scans do not."""
    return bool(config.layer_norm)


ELMAN_FIELDS = ("nonlinearity", "bias", "backend")
RNN_FIELDS = ("bias_hh", *ELMAN_FIELDS)  # rnn, urnn, crnn: their parameters' names
FASTRNN_FIELDS = ("nonlinearity", "bias", "clip_scalar")


class FusedCells(Mapping[str, FusedCell]):
    """Cell name → its fused form: the built-ins' (below), and each plugin cell's own `fused` (read from the
    registry, whose first look-up loads the plugins: a process that got its configs resolved elsewhere, a
    Ray worker unpickling them, finds a plugin's form all the same)."""

    def __init__(self, builtins: Mapping[str, FusedCell]) -> None:
        self._builtins = dict(builtins)

    def _plugins(self) -> dict[str, FusedCell]:
        from trainers.cells import CELLS

        forms = {name: getattr(CELLS.get(name), "fused", None) for name in CELLS.names()}
        return {n: f for n, f in forms.items() if f is not None and n not in self._builtins}

    def __getitem__(self, name: str) -> FusedCell:
        if name in self._builtins:
            return self._builtins[name]
        return self._plugins()[name]

    def __iter__(self) -> Iterator[str]:
        return iter({**self._builtins, **self._plugins()})

    def __len__(self) -> int:
        return len(self._builtins) + len(self._plugins())


#: cell name → how its bundles run; a cell not listed here trains one trial per process
FUSED_CELLS: FusedCells = FusedCells(
    {
        "rnn": FusedCell(RNN_FIELDS, _elman, alone=_layer_norm),
        "urnn": FusedCell(RNN_FIELDS, _elman, _project, alone=_layer_norm),
        "crnn": FusedCell(RNN_FIELDS, _elman, _project, alone=_layer_norm),
        "vprnn": FusedCell(("rotations", *ELMAN_FIELDS), _elman),
        "fastrnn": FusedCell(FASTRNN_FIELDS, _fastrnn, stores=4),
        "sgornn": FusedCell(("rotations", *FASTRNN_FIELDS), _fastrnn, stores=4),
        "srnn": FusedCell(("hyper_size", "n_layers", "no_gate", "backend"), _srnn, stores=2),
    }
)
