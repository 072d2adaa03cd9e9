"""A bundle's members, each set up as `train` sets up a solo run: its task (one per seed, shared by the
members with that seed), its own model (initial weights; then its trained weights for evaluation and
its result), its result and its schedule's watch; and the groups of members that train as one bundle.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from trainers.config import Resolved, TrainConfig
from trainers.model import SequenceModel, build_model, count_params
from trainers.result import MemberReport, TrialResult, member_reporter
from trainers.runtime import configure_process, device_fault, fail, record_device, record_task, resolve_device
from trainers.schedule import Watch
from trainers.tasks import Task
from trainers.tasks.base import Split


@dataclass
class SeedData:
    """One seed's task and validation set, shared by the members with that seed."""

    task: Task
    val_split: Split


@dataclass
class Member:
    index: int  # position in the caller's list
    config: TrainConfig
    result: TrialResult
    data: SeedData
    model: SequenceModel  # its own model: initial weights, then evaluation and the result
    watch: Watch  # its course under the schedule's rules, as its solo run's
    done: bool = False


def layout_groups(members: list[Member]) -> list[list[Member]]:
    """Members by the memory layout of their recurrent matrix, each group trained as one bundle.

    A GEMM rounds differently when an operand is stored transposed, and the orthogonal
    initialiser's W comes out of QR column-major while the others' are row-major: a member keeps
    its solo run's numbers only in a bundle whose W slices are laid out as its own.
    """
    groups: dict[tuple[tuple[int, ...], ...], list[Member]] = {}
    for m in members:
        groups.setdefault(tuple(p.stride() for p in m.model.parameters()), []).append(m)
    return list(groups.values())


def make_members(
    resolved: list[Resolved], results: list[TrialResult], report: MemberReport | None, index: list[int]
) -> list[Member]:
    """Members `index`: each one's task (one per seed), model and schedule watch, as `train` makes them."""
    cfg = resolved[0].config  # shared fields only
    device = resolve_device(cfg.device)
    configure_process(device, cfg.threads, cfg.numerics)
    data: dict[int, SeedData] = {}
    members = []
    for i in index:
        r, result = resolved[i], results[i]
        c = r.config
        started = time.perf_counter()
        try:
            if c.seed not in data:
                task = r.make_task()  # may read data files: a missing file fails this member only
                data[c.seed] = SeedData(task, task.val_split())
            task = data[c.seed].task
            record_task(result, task)
            record_device(result, device, c)
            model = build_model(r, task).to(device)
            result.param_count = count_params(model)
        except Exception as exc:
            if device_fault(exc):
                raise
            fail(result, exc)
            result.seconds = time.perf_counter() - started
            continue
        member_report = member_reporter(report, i)
        members.append(Member(i, c, result, data[c.seed], model, Watch(c, result, member_report)))
    return members
