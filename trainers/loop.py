"""The solo training loop: `train(config, report)`, one trial in one model. It knows nothing about cells,
bundles, Ray, MLflow or the server; what it shares with the fused loop (`trainers.fused`) is in
`trainers.runtime`.

Protocol (Orhan & Pitkow; docs/protocol.md §1.5), every part a config field:
RMSprop (ρ 0.9, ε 1e-7) or Adam, at the trial's learning rate or its course (`LearningRate`); global
gradient-norm clip; batches from the task's fixed training
set reshuffled every epoch (Keras `fit`) or fresh batches; validation on the task's fixed validation
set once per epoch (or every `eval_every` steps, and always at the end of the budget); early stop once
validation loss < `early_stop_loss`; the final validation loss is the last evaluation.
A NaN / infinite / diverging loss, or any exception while training, ends the run as `failed` with its
reason: a trial never raises past `train` once its config has resolved.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any

import torch

from trainers.config import Resolved, TrainConfig, resolve
from trainers.model import SequenceModel, build_model, count_params
from trainers.numerics import use as use_numerics
from trainers.optim import LearningRate, make_optimizer, set_lr
from trainers.result import Evaluation, MemberReport, MembersFinished, TrialResult, member_reporter
from trainers.runtime import (
    ValidationSums,
    configure_process,
    device_fault,
    fail,
    keep_network,
    record_device,
    record_task,
    resolve_device,
    training_batches,
)
from trainers.schedule import Schedule, Watch
from trainers.seeding import derive_seed
from trainers.tasks import Task

Report = Callable[[Evaluation], Any]


@torch.no_grad()
def evaluate(
    model: SequenceModel, task: Task, split: Any, batch_size: int, device: torch.device
) -> tuple[float, float | None]:
    """(mean validation loss, mean metric) over the whole validation split."""
    model.eval()
    sums = ValidationSums()
    for start in range(0, len(split), batch_size):
        x, y = task.encode(split.take(slice(start, start + batch_size)), device)
        sums.add(task, model(x), y, x.shape[1])
    model.train()
    return sums.means(task)


def train(config: TrainConfig | Mapping[str, Any] | Resolved, report: Report | None = None) -> TrialResult:
    """Train one trial. Raises for an invalid config, and for a device fault (`runtime.device_fault`: no
    result of the trial); training problems return status `failed`."""
    run = training(config, report)
    while True:
        try:
            next(run)
        except StopIteration as end:
            result: TrialResult = end.value
            return result


Training = Generator[None, None, TrialResult]


def training(config: TrainConfig | Mapping[str, Any] | Resolved, report: Report | None = None) -> Training:
    """`train`, one evaluation at a time: each `next` trains up to the trial's next evaluation, reports
    it and pauses there, and the last one returns its result (`StopIteration.value`) instead. A trial
    pauses only after an evaluation that does not end it: the one it ends with comes with its result.
    Its time paused is not its own (`Evaluation.seconds`, `TrialResult.seconds`)."""
    resolved = config if isinstance(config, Resolved) else resolve(config)
    clock = OwnClock()
    result = TrialResult()
    try:
        use_numerics(resolved.config.numerics)  # before anything computes: some tasks do as they are built
        task = resolved.make_task()  # may read data files: a missing file is a failed trial, with its fix
        record_task(result, task)
        yield from _run(resolved, task, result, report, clock)
    except Exception as exc:  # a trial never takes its caller down; a broken device does
        if device_fault(exc):
            raise
        fail(result, exc)
    result.seconds = clock.elapsed()
    return result


class OwnClock:
    """A trial's own time since it started: what it spent paused (`training`) not counted."""

    def __init__(self) -> None:
        self.started = time.perf_counter()  # moved on by each pause's length

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        since = time.perf_counter()
        try:
            yield
        finally:
            self.started += time.perf_counter() - since


class Solo:
    """A solo run set up as `train` sets it up, and its training step: the loop's own (`_run` steps it) and
    the benchmarks' (`benchmarks/gpu_check`, `benchmarks/fused_floor.py`), so that what they time is what
    trains (`trainers.fused.Bundle` is a bundle's). Made once the process is configured and torch's global
    generator seeded (`of` does both, as `_run` does)."""

    def __init__(
        self, resolved: Resolved, task: Task, device: torch.device, model: SequenceModel | None = None
    ) -> None:
        """`model`: the trial's, built already (`_run` counts its parameters before the rest is set up, so
        that a trial that fails there records them)."""
        cfg = self.config = resolved.config
        self.task, self.device = task, device
        self.model = build_model(resolved, task).to(device) if model is None else model
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(cfg, self.params)
        self.val_split = task.val_split()
        self.batches = training_batches(task, cfg.batch_size, cfg.seed)
        self.schedule = Schedule.of(cfg, task.train_size)
        self.rate = LearningRate.of(cfg, self.schedule.steps_per_epoch)

    @classmethod
    def of(cls, config: TrainConfig | Mapping[str, Any] | Resolved) -> Solo:
        """A trial's run set up in a process of its own, as `training` and `_run` set it up."""
        resolved = config if isinstance(config, Resolved) else resolve(config)
        cfg = resolved.config
        use_numerics(cfg.numerics)
        task = resolved.make_task()
        device = resolve_device(cfg.device)
        configure_process(device, cfg.threads, cfg.numerics)
        torch.manual_seed(derive_seed(cfg.seed, "torch"))
        return cls(resolved, task, device)

    def step(self, step: int) -> torch.Tensor:
        """Optimiser step `step` (from 1): the next batch forward and backward, the clip, the learning
        rate's course, the update and the cell's hook; the batch's loss, detached."""
        cfg, model, optimizer = self.config, self.model, self.optimizer
        x, y = self.task.encode(next(self.batches), self.device)
        loss = self.task.loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        if cfg.clip_norm:
            torch.nn.utils.clip_grad_norm_(self.params, cfg.clip_norm)
        if not self.rate.constant:
            set_lr(optimizer, self.rate.at(step))
        optimizer.step()
        model.cell.after_step()
        return loss.detach()


def _run(
    resolved: Resolved, task: Task, result: TrialResult, report: Report | None, clock: OwnClock
) -> Generator[None, None, None]:
    cfg = resolved.config
    device = resolve_device(cfg.device)
    configure_process(device, cfg.threads, cfg.numerics)
    record_device(result, device, cfg)
    torch.manual_seed(derive_seed(cfg.seed, "torch"))  # anything that still uses the global RNG

    model = build_model(resolved, task).to(device)
    result.param_count = count_params(model)
    solo = Solo(resolved, task, device, model)
    schedule, rate = solo.schedule, solo.rate
    result.budget_steps = schedule.budget
    watch = Watch(cfg, result, report)

    running = torch.zeros((), device=device)
    n_running = 0
    for step in range(1, schedule.budget + 1):
        running += solo.step(step)
        n_running += 1
        result.steps = step

        due = schedule.at(step)
        if due is None:
            continue
        train_loss = float(running) / n_running
        if not watch.check_training(step, train_loss):
            return
        if due != "eval":
            continue
        val_loss, metric = evaluate(model, task, solo.val_split, cfg.eval_batch_size, device)
        running.zero_()
        n_running = 0
        evaluation = Evaluation.at(
            step, schedule.steps_per_epoch, train_loss, val_loss, metric, clock.started,
            None if rate.constant else rate.at(step),
        )  # fmt: skip
        if watch.evaluated(evaluation) or step == schedule.budget:  # it ends with this one: no pause
            break
        with clock.paused():
            yield
    if result.status == "done":
        keep_network(result, model, cfg.cell_params.get("nonlinearity"))


class _Paused:
    """One trial of `train_lockstep`, between its evaluations, with its own state of torch's global
    random generators (CPU and CUDA: a cell may draw from them, as `train` seeds them per trial)."""

    def __init__(self, run: Training) -> None:
        self.run = run
        self.rng: tuple[torch.Tensor, list[torch.Tensor] | None] | None = None

    def go_on(self) -> TrialResult | None:
        """Train to its next evaluation (None), or to its end (its result)."""
        if self.rng is not None:
            torch.set_rng_state(self.rng[0])
            if self.rng[1] is not None:
                torch.cuda.set_rng_state_all(self.rng[1])
        try:
            next(self.run)
            return None
        except StopIteration as end:
            result: TrialResult = end.value
            return result
        finally:
            cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None  # type: ignore[no-untyped-call]
            self.rng = (torch.get_rng_state(), cuda)


def train_lockstep(
    configs: Sequence[TrainConfig | Mapping[str, Any] | Resolved],
    report: MemberReport | None = None,
    finished: MembersFinished | None = None,
) -> list[TrialResult]:
    """Train solo trials side by side, one process, one after the other up to each one's next
    evaluation, round after round: what an early-stopping scheduler judges on their mean at each of its
    rungs, for trials that cannot train fused (`trainers.fused.fusable_key`). Result k is what
    `train(configs[k])` returns, bit for bit: each trial computes as it does alone, with its own
    random state. `report` and `finished` are called as `train_fused` calls them: each evaluation once,
    each result once, those final in the same round together (after the round's evaluations).
    Raises ConfigError for an invalid config before anything trains, and a device fault as `train`."""
    resolved = [c if isinstance(c, Resolved) else resolve(c) for c in configs]
    runs = {k: _Paused(training(r, member_reporter(report, k))) for k, r in enumerate(resolved)}
    results: dict[int, TrialResult] = {}
    while runs:
        ended = [(k, result) for k, run in runs.items() if (result := run.go_on()) is not None]
        for k, result in ended:
            del runs[k]
            results[k] = result
        if ended and finished is not None:
            finished(ended)
    return [results[k] for k in range(len(resolved))]
