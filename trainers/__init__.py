"""memsweep's trainers: tasks, cells and the training loop. Depends on torch only.

from trainers import train, TrainConfig
result = train({"task": "addition", "task_params": {"seq_len": 100}, "steps": 500})
"""

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
