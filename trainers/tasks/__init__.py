"""Tasks by name. A task is registered here, or installed as a plugin (`trainers.plugins`: the entry-point
group "memsweep.tasks"); the contract tests then cover it."""

from __future__ import annotations

from trainers.registry import Registry
from trainers.tasks.addition import AdditionTask
from trainers.tasks.base import Split, Task
from trainers.tasks.bigpsmnist import BigPSMNISTTask
from trainers.tasks.copy import CopyTask
from trainers.tasks.denoise import DenoiseTask
from trainers.tasks.har2 import HAR2Task
from trainers.tasks.psmnist import PSMNISTTask
from trainers.tasks.ptb import PTBTask
from trainers.tasks.smnist import SMNISTTask
from trainers.tasks.teacher import TeacherTask
from trainers.tasks.varcopy import VarCopyTask

TASKS: Registry[type[Task]] = Registry("task", plugins=Task)
for _task in (
    CopyTask,
    AdditionTask,
    PSMNISTTask,
    VarCopyTask,
    DenoiseTask,
    SMNISTTask,
    BigPSMNISTTask,
    TeacherTask,
    HAR2Task,
    PTBTask,
):
    TASKS.register(_task.name)(_task)


def get_task(name: str) -> type[Task]:
    return TASKS.get(name)


def list_tasks() -> list[str]:
    return TASKS.names()


__all__ = ["TASKS", "Split", "Task", "get_task", "list_tasks"]
