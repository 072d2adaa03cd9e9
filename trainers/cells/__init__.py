"""Cells by name. A cell is registered here; the contract tests then cover it on every task."""

from __future__ import annotations

from trainers.cells.base import Cell
from trainers.cells.rnn import RNNCell
from trainers.registry import Registry

CELLS: Registry[type[Cell]] = Registry("cell")
for _cell in (RNNCell,):
    CELLS.register(_cell.name)(_cell)


def get_cell(name: str) -> type[Cell]:
    return CELLS.get(name)


def list_cells() -> list[str]:
    return CELLS.names()


__all__ = ["CELLS", "Cell", "get_cell", "list_cells"]
