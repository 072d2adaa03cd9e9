"""The cell contract: a recurrent layer that maps inputs [T, B, d] to hidden states [T, B, N].

A cell knows nothing about tasks, losses or optimisers. It owns its hyperparameters in a frozen
dataclass `Config` (registered beside it in `trainers.cells`), draws its initial weights from the
trial's `init` generator, and may expose its recurrent and input matrices for analysis and a hook
run after each optimiser step (projections, clipping of gates).
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
from torch import nn


class Cell(nn.Module, metaclass=ABCMeta):
    """Subclasses set `name` and `Config`, build their parameters in `__init__` from `gen` (the only
    source of randomness, so a seed fixes the weights) and implement `forward`."""

    name: ClassVar[str]
    Config: ClassVar[type]
    #: the values of its own hyperparameters an arm of this cell spans when a study adds the cell beside a
    #: preset's models (`models: [chain, orthogonal, <cell>]`), besides the preset's shared dimensions
    #: (its learning rates): field → values, as its paper swept them; {} spans only the shared ones
    grid: ClassVar[Mapping[str, tuple[Any, ...]]] = {}
    #: how a fused bundle runs this cell's recurrence for all its members: a `trainers.fused.cells.FusedCell`
    #: (not imported here: the fused trainer sits above the cells); the built-ins are listed in
    #: `FUSED_CELLS`, a plugin cell declares its own here; None: its trials train solo
    fused: ClassVar[Any] = None
    #: the settings of `Config` declared as floats that change what a step costs (a density, an operation
    #: that None turns off), each value a shape a plan calibrates apart; every other float setting is a
    #: number in the recurrence or the initial weights (a step size, a gain), one shape for all its values
    cost_settings: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, config: Any, input_size: int, hidden_size: int, gen: torch.Generator) -> None:
        """`config`: an instance of `Config`, resolved (`resolve`); `input_size` d and `hidden_size` N
        the layer's widths; `gen`: the generator every initial weight is drawn from."""
        super().__init__()
        self.config = config
        self.input_size = input_size
        self.hidden_size = hidden_size

    @abstractmethod
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, B, d] → hidden states [T, B, N]."""

    def recurrent_matrix(self) -> torch.Tensor | None:
        """W [N, N] with W_ij the weight from unit j to unit i, or None when the cell has none."""
        return None

    def input_matrix(self) -> torch.Tensor | None:
        """V [N, d] with V_ij the weight from input j to unit i, or None when the cell has none."""
        return None

    def after_step(self) -> None:
        """Called after every optimiser step (e.g. to project W back onto a constraint set)."""

    @contextmanager
    def state_draws_off(self) -> Iterator[None]:
        """Within it, the forward draws nothing at random. A cell whose forward draws its initial state at
        random at every call, as its authors' code did (`arjovsky_urnn`), starts from zero here instead:
        the contract checks each example's states are its own whatever the batch with the draws off, since
        with them on an example's initial state follows its place in the batch. Nothing by default."""
        yield

    @classmethod
    def resolve(cls, config: Any, default_nonlinearity: str) -> Any:
        """Fill task-dependent defaults (e.g. the nonlinearity) into the config; identity by default."""
        return config

    @classmethod
    def check_hidden(cls, config: Any, hidden: int) -> None:
        """Refuse (`trainers.params.ConfigError`) a hidden size N that the resolved `config` cannot train,
        at config time rather than in the trial (e.g. a kernel that holds W on chip); any N by default."""
