"""Cells by name. A cell is registered here, or installed as a plugin (`trainers.plugins`: the entry-point
group "memsweep.cells"); the contract tests then cover it on every task."""

from __future__ import annotations

from trainers.cells.arjovsky_urnn import ArjovskyURNNCell
from trainers.cells.base import Cell
from trainers.cells.crnn import CRNNCell
from trainers.cells.fastrnn import FastRNNCell
from trainers.cells.gru import GRUCell
from trainers.cells.janet import JANETCell
from trainers.cells.lstm import LSTMCell
from trainers.cells.nru import NRUCell
from trainers.cells.rnn import RNNCell
from trainers.cells.sgornn import SGORNNCell
from trainers.cells.srnn import SRNNCell
from trainers.cells.urnn import URNNCell
from trainers.cells.vprnn import VPRNNCell
from trainers.registry import Registry

CELLS: Registry[type[Cell]] = Registry("cell", plugins=Cell)
for _cell in (
    RNNCell,
    LSTMCell,
    GRUCell,
    JANETCell,
    VPRNNCell,
    FastRNNCell,
    SGORNNCell,
    URNNCell,
    ArjovskyURNNCell,
    CRNNCell,
    SRNNCell,
    NRUCell,
):
    CELLS.register(_cell.name)(_cell)


def get_cell(name: str) -> type[Cell]:
    return CELLS.get(name)


def list_cells() -> list[str]:
    return CELLS.names()


__all__ = ["CELLS", "Cell", "get_cell", "list_cells"]
