"""The seam between the engine and what runs its units: the request of one run and the executor's
protocol. The engine passes its own values across (a `RunRequest`, its `TrialBook`); only the
executor builds its framework's objects (Ray Tune's: `service.study.ray_tune.RayTune`, the default)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from service.core.spec import Asha
from service.core.trial import Unit
from service.study.book import TrialBook
from service.study.search import Sampling


@dataclass(frozen=True)
class RunRequest:
    """One run of an executor: a round of packed `units` (a grid's, or what a fault sent back), or a
    sampler's draws (`sampling`), each unit on `resources` (`{"cpu": …, "gpu": …}`), at most
    `concurrency` at once, until `cancel` is set; `asha`: the ASHA scheduler's settings, when it may
    stop units (a point's seeds each) early on their reported objectives, and `asha_history` the
    study's points finished before this run, each its objective by evaluations (`rung_means`), which
    its rungs start with. `dispatch`: a grid's unit as it leaves the queue, holding only the members it
    reserved (another study finished the others, or holds them running: `service.study.elsewhere`),
    None when none is left; `tick`: called as the run goes (each turn of the executor's loop), to take
    meanwhile the results of the trials dispatch left to other studies."""

    name: str
    resources: Mapping[str, float]
    concurrency: int
    cancel: threading.Event
    asha: Asha | None = None
    asha_history: Sequence[Mapping[int, float]] = ()
    units: Sequence[Unit] = ()
    sampling: Sampling | None = None
    dispatch: Callable[[Unit], Unit | None] | None = None
    tick: Callable[[], None] | None = None


@dataclass(frozen=True)
class Task:
    """One call `fn(*args)` on a node that gives a unit's resources, `env` set in its worker process
    (a calibration's probe, or the question of which node type runs a study's units)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskResult:
    """What a `Task` gave: its `value`, or the `error` it (its worker, its node) died of."""

    value: Any = None
    error: BaseException | None = None


class Executor(Protocol):
    """What runs a study's units: Ray Tune (`service.study.ray_tune.RayTune`, the default) or, in
    tests, an in-process executor.

    Lifecycle: `start` before anything else (idempotent: it may be called again, e.g. by each run);
    `unplaceable` and `resources` any time, before `start` too; `node_plugins`, `node_memory` and
    `run_tasks` any time after; `stop` once nothing runs (a later `start` starts anew); `run` once per
    round, the engine calling it again for the members a fault sent back and the run did not train
    again itself (with the same `TrialBook`, after `TrialBook.begin_round`; `TrialBook.failed` returns
    those members, and `RayTune` runs a grid's again in the same run). A run hands each of a grid's units to
    `RunRequest.dispatch` as it takes it from its queue to start it (not before: another study may take
    up a member meanwhile; the members dispatch keeps are reserved for it while it waits for a slot),
    tells the book every executor trial's start, reports and end in the order
    `TrialBook` states, and closes what is left open (`TrialBook.close_unfinished`) before it returns."""

    def start(self) -> None:
        """Start (or join) the cluster that runs the units."""

    def stop(self) -> None:
        """Shut down what `start` started (an embedded cluster, and its record: nothing is left to reap)."""

    def unplaceable(self, resources: Mapping[str, float]) -> str | None:
        """Why no node can place a unit of these resources, or None. Before `start`: this machine's
        answer for an embedded cluster, None for one not joined yet (asked again when a study starts)."""

    def resources(self) -> Mapping[str, float] | None:
        """The CPUs and GPUs of the whole cluster (`{"cpu": …, "gpu": …}`) once `start` brought it up
        here, else None; raises when it no longer answers (the server's readiness check)."""

    def node_plugins(self) -> Mapping[str, Mapping[str, str]] | None:
        """Each node's plugins ("kind:name" → identity: `trainers.plugins`), or None when every node
        shares this process's installation (one machine)."""

    def node_memory(self, resources: Mapping[str, float]) -> tuple[str, int] | None:
        """(device kind, bytes) a unit of these resources may use on a node that would run it,
        which sizes its bundles; None when not known."""

    def run_tasks(
        self,
        tasks: Sequence[Task],
        resources: Mapping[str, float],
        slots: int,
        timeout: float,
        cancel: threading.Event | None = None,
    ) -> list[TaskResult | None]:
        """Each task run once (no retry) on a node with these resources, at most `slots` at once,
        until all ended, `timeout` seconds passed or `cancel` was set; in the tasks' order, each one's
        result, None for those that did not finish (stopped or out of time)."""

    def run(self, request: RunRequest, book: TrialBook) -> None:
        """Run the request's units (or its sampler's draws) to the end or to its cancel, telling
        `book` what happens."""
