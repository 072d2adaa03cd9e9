"""The solo training loop: `train(config, report)`, one trial in one model. It knows nothing about cells,
bundles, Ray, MLflow or the server; what it shares with the fused loop (`trainers.fused`) is in
`trainers.runtime`.

Protocol (Orhan & Pitkow; docs/protocol.md §1.5), every part a config field:
RMSprop (ρ 0.9, ε 1e-7) or Adam; global gradient-norm clip; batches from the task's fixed training
set reshuffled every epoch (Keras `fit`) or fresh batches; validation on the task's fixed validation
set once per epoch (or every `eval_every` steps, and always at the end of the budget); early stop once
validation loss < `early_stop_loss`; the final validation loss is the last evaluation.
A NaN / infinite / diverging loss, or any exception while training, ends the run as `failed` with its
reason: a trial never raises past `train` once its config has resolved.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from trainers.config import Resolved, TrainConfig, resolve
from trainers.model import SequenceModel, build_model, count_params
from trainers.numerics import use as use_numerics
from trainers.optim import make_optimizer
from trainers.result import Evaluation, TrialResult
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
    resolved = config if isinstance(config, Resolved) else resolve(config)
    started = time.perf_counter()
    result = TrialResult()
    try:
        use_numerics(resolved.config.numerics)  # before anything computes: some tasks do as they are built
        task = resolved.make_task()  # may read data files: a missing file is a failed trial, with its fix
        record_task(result, task)
        _run(resolved, task, result, report, started)
    except Exception as exc:  # a trial never takes its caller down; a broken device does
        if device_fault(exc):
            raise
        fail(result, exc)
    result.seconds = time.perf_counter() - started
    return result


def _run(resolved: Resolved, task: Task, result: TrialResult, report: Report | None, started: float) -> None:
    cfg = resolved.config
    device = resolve_device(cfg.device)
    configure_process(device, cfg.threads, cfg.numerics)
    record_device(result, device, cfg)
    torch.manual_seed(derive_seed(cfg.seed, "torch"))  # anything that still uses the global RNG

    model = build_model(resolved, task).to(device)
    result.param_count = count_params(model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(cfg, params)
    val_split = task.val_split()
    batches = training_batches(task, cfg.batch_size, cfg.seed)
    schedule = Schedule.of(cfg, task.train_size)
    result.budget_steps = schedule.budget
    watch = Watch(cfg, result, report)

    running = torch.zeros((), device=device)
    n_running = 0
    for step in range(1, schedule.budget + 1):
        x, y = task.encode(next(batches), device)
        loss = task.loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        if cfg.clip_norm:
            torch.nn.utils.clip_grad_norm_(params, cfg.clip_norm)
        optimizer.step()
        model.cell.after_step()
        running += loss.detach()
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
        val_loss, metric = evaluate(model, task, val_split, cfg.eval_batch_size, device)
        running.zero_()
        n_running = 0
        evaluation = Evaluation.at(step, schedule.steps_per_epoch, train_loss, val_loss, metric, started)
        if watch.evaluated(evaluation):
            break
    if result.status == "done":
        keep_network(result, model, cfg.cell_params.get("nonlinearity"))
