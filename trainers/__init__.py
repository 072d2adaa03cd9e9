"""memsweep's trainers: tasks, cells and the training loop. Depends on torch only.

from trainers import train, TrainConfig
result = train({"task": "addition", "task_params": {"seq_len": 100}, "steps": 500})

The names below load on first use (PEP 562), so the leaves that need no torch (`trainers.criterion`,
`trainers.result`, `trainers.config`, `trainers.params`) import without it: the service reads its
ledger (judges, tabulates and prints results) without loading torch. One thing is done at import: the
registries are handed what loads their plugins at their first look-up (`trainers.plugins.load`, which
needs no torch), as they cannot import it themselves (it imports them).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Any

from trainers import plugins as _plugins
from trainers import registry as _registry

if TYPE_CHECKING:
    from trainers.cells import get_cell, list_cells
    from trainers.config import TRAINER_VERSION, Resolved, TrainConfig, apply_overrides, config_hash, resolve
    from trainers.criterion import HALF_BASELINE, Criterion
    from trainers.loop import train, train_lockstep
    from trainers.params import ConfigError
    from trainers.registry import UnknownNameError
    from trainers.result import Evaluation, TrialResult
    from trainers.tasks import get_task, list_tasks

__all__ = [
    "HALF_BASELINE",
    "TRAINER_VERSION",
    "ConfigError",
    "Criterion",
    "Evaluation",
    "Resolved",
    "TrainConfig",
    "TrialResult",
    "UnknownNameError",
    "apply_overrides",
    "config_hash",
    "get_cell",
    "get_task",
    "list_cells",
    "list_tasks",
    "resolve",
    "train",
    "train_lockstep",
]

#: the module each name of `__all__` comes from
_HOMES = {
    "trainers.cells": ("get_cell", "list_cells"),
    "trainers.config": ("TRAINER_VERSION", "Resolved", "TrainConfig", "apply_overrides", "config_hash", "resolve"),
    "trainers.criterion": ("HALF_BASELINE", "Criterion"),
    "trainers.loop": ("train", "train_lockstep"),
    "trainers.params": ("ConfigError",),
    "trainers.registry": ("UnknownNameError",),
    "trainers.result": ("Evaluation", "TrialResult"),
    "trainers.tasks": ("get_task", "list_tasks"),
}  # fmt: skip
_HOME = {name: module for module, names in _HOMES.items() for name in names}

_registry.load_plugins_with(_plugins.load)


def __getattr__(name: str) -> Any:
    """A name of `__all__` from its module, or a submodule (`trainers.fused`), imported on first use."""
    if name in _HOME:
        value = getattr(importlib.import_module(_HOME[name]), name)
    elif name in _submodules():  # never `__main__`, which would run the trainers' CLI
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # looked up once
    return value


def _submodules() -> set[str]:
    """The package's own modules and packages, by name (but `__main__`)."""
    return {m.name for m in pkgutil.iter_modules(__path__)} - {"__main__"}


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
