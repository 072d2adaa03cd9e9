"""A bundle's model: K SequenceModels of one fusable cell as stacked leaf tensors [K, …]
(`trainers.fused.stacked`); the cell's recurrence runs for all members at once as its `FusedCell`
says (`trainers.fused.cells`), the readout per member with the solo ops on member k's slice.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from trainers.cells import Cell
from trainers.fused.cells import FusedCell
from trainers.fused.stacked import stack, take
from trainers.kernels import Workspace
from trainers.model import SequenceModel


class FusedModel:
    """K SequenceModels of one fusable cell as stacked leaf tensors [K, …], in the solo model's
    parameter order; the cell's recurrence runs as its `FusedCell` says, the readout per member."""

    def __init__(self, models: Sequence[SequenceModel], spec: FusedCell, output: str) -> None:
        named = [dict(m.named_parameters()) for m in models]
        self.names = list(named[0])
        if self.names[-2:] != ["readout.weight", "readout.bias"] or any(list(n) != self.names for n in named):
            raise ValueError(f"unexpected model parameters {self.names}: the members' models differ in shape")
        # e.g. rnn: W [K, N, N], V [K, N, d], b [K, N], readout [K, C, N] and [K, C]
        self.params = [stack([p[n].detach() for p in named]).requires_grad_() for n in self.names]
        self.cells: list[Cell] = [m.cell for m in models]  # each member's own buffers (e.g. permutations)
        self.spec = spec
        self.output = output
        self.workspace = Workspace()  # the recurrence's big buffers, reused every step
        self.eval_workspace = Workspace()  # the validation passes' (other batch sizes)

    def cell_params(self, rows: slice = slice(None)) -> dict[str, torch.Tensor]:
        """The cell's stacked parameters (rows `rows`) by their name in the cell."""
        return {n[5:]: p[rows] for n, p in zip(self.names, self.params, strict=True) if n.startswith("cell.")}

    def forward(
        self, xs: Sequence[torch.Tensor], rows: slice = slice(None), workspace: Workspace | None = None
    ) -> list[torch.Tensor]:
        """Member k's output for its input xs[k] [T, B, d]: [B, C] or [T, B, C], as SequenceModel.

        `rows`: the members (rows of the stacked tensors) that xs feed, all by default; `workspace`:
        where the recurrence keeps its buffers (the training one by default)."""
        last = self.output == "last"
        ws = workspace if workspace is not None else self.workspace
        hs = self.spec.states(self.cells[rows], self.cell_params(rows), xs, last, ws)
        w_out, b_out = self.params[-2][rows], self.params[-1][rows]
        # member k's readout of its last state [B, N] or of every state [T, B, N]
        return [F.linear(h, w, b) for h, w, b in zip(hs, w_out.unbind(0), b_out.unbind(0), strict=True)]

    @torch.no_grad()
    def after_step(self) -> None:
        """Each member's `after_step` hook, as its solo run calls it after every optimiser step."""
        if self.spec.after_step is not None:
            self.spec.after_step(self.cells, self.cell_params())

    def keep(self, index: torch.Tensor) -> None:
        """Keep only the members at `index` (rows of every stacked tensor)."""
        self.params = [take(p.detach(), index).requires_grad_() for p in self.params]
        self.cells = [self.cells[i] for i in index.tolist()]

    @torch.no_grad()
    def load_into(self, k: int, model: SequenceModel) -> None:
        """Copy member k's weights into its own SequenceModel (for evaluation and the result)."""
        for target, p in zip(model.parameters(), self.params, strict=True):
            target.copy_(p[k])
