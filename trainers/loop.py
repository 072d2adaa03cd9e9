"""The training loop: `train(config, report)`. It knows nothing about cells, Ray, MLflow or the server.

Protocol (Orhan & Pitkow; seed-code-facts §0a item 4, §2.1), every part a config field:
RMSprop (ρ 0.9, ε 1e-7) or Adam; global gradient-norm clip; batches from the task's fixed training
set reshuffled every epoch (Keras `fit`) or fresh batches; validation on the task's fixed validation
set once per epoch (or every `eval_every` steps, and always at the end of the budget); early stop once
validation loss < `early_stop_loss`; the final validation loss is the last evaluation.
A NaN / infinite / diverging loss, or any exception while training, ends the run as `failed` with its
reason: a trial never raises past `train` once its config has resolved.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch

from trainers.config import Resolved, TrainConfig, resolve
from trainers.model import SequenceModel, build_model, count_params
from trainers.seeding import derive_seed, generator
from trainers.tasks import Task
from trainers.tasks.base import Tensors


@dataclass(frozen=True)
class Evaluation:
    """One validation pass, as handed to `report`."""

    step: int
    epoch: float  # steps / steps-per-epoch
    train_loss: float  # mean training loss since the previous evaluation
    val_loss: float
    metric: float | None  # the task's metric on the validation set (e.g. accuracy)
    seconds: float  # since the start of training

    @classmethod
    def at(
        cls,
        step: int,
        steps_per_epoch: int,
        train_loss: float,
        val_loss: float,
        metric: float | None,
        started: float,
    ) -> Evaluation:
        """The evaluation at `step`, timed now from `started` (a perf_counter reading)."""
        return cls(step, step / steps_per_epoch, train_loss, val_loss, metric, time.perf_counter() - started)


@dataclass
class TrainResult:
    status: Literal["ok", "failed"]
    reason: str | None
    final_val_loss: float | None
    final_metric: float | None
    metric_name: str | None
    success: bool
    baseline_loss: float
    success_threshold: float
    steps: int  # optimiser steps taken
    budget_steps: int
    early_stopped: bool
    seconds: float
    params: int
    config: dict[str, Any]
    config_hash: str
    history: list[Evaluation] = field(default_factory=list)
    recurrent_matrix: torch.Tensor | None = None  # the trained W [N, N], for analysis
    input_matrix: torch.Tensor | None = None  # the trained V [N, d] (the weight profile's input pulse)

    @classmethod
    def pending(cls, resolved: Resolved) -> TrainResult:
        """The result of a trial that has not run yet (filled in as it trains)."""
        return cls(
            status="ok", reason=None, final_val_loss=None, final_metric=None, metric_name=None, success=False,
            baseline_loss=math.nan, success_threshold=math.nan, steps=0, budget_steps=0, early_stopped=False,
            seconds=0.0, params=0, config=resolved.to_dict(), config_hash=resolved.config_hash(),
        )  # fmt: skip

    def summary(self, with_history: bool = False) -> dict[str, Any]:
        """JSON-ready result (no tensors)."""
        out = {
            k: v
            for k, v in asdict(self).items()
            if k not in ("history", "recurrent_matrix", "input_matrix", "config")
        }
        if with_history:
            out["history"] = [asdict(e) for e in self.history]
        out["config"] = self.config
        return out


Report = Callable[[Evaluation], Any]


def failure_reason(exc: Exception) -> str:
    """A failed trial's reason: the exception and the last frames of its traceback."""
    return f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_exc(limit=-3))


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} was requested but CUDA is not available; use device=cpu or auto")
    return device


def training_batches(task: Task, batch_size: int, seed: int) -> Iterator[Tensors]:
    """The trial's training batches, a pure function of (task, batch size, seed)."""
    if task.data_regime == "fresh":
        gen = generator(seed, "batches")
        while True:
            yield task.sample(batch_size, gen)
    split = task.train_split()
    gen = generator(seed, "shuffle")
    while True:  # one pass over a fresh permutation per epoch, last partial batch kept (Keras)
        order = torch.randperm(len(split), generator=gen)
        for start in range(0, len(split), batch_size):
            yield split.take(order[start : start + batch_size])


@dataclass
class ValidationSums:
    """A validation pass's running sums, batch by batch (the solo loop and fused bundles both use it)."""

    loss: float = 0.0
    metric: float = 0.0
    n: int = 0

    def add(self, task: Task, out: torch.Tensor, y: torch.Tensor, b: int) -> None:
        self.loss += float(task.loss(out, y)) * b
        self.metric += task.metric_sum(out, y)
        self.n += b

    def means(self, task: Task) -> tuple[float, float | None]:
        """(mean validation loss, mean metric or None for a task without one)."""
        return self.loss / self.n, (self.metric / self.n if task.metric_name else None)


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


def make_optimizer(cfg: TrainConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    # Keras RMSprop: a ← ρa + (1−ρ)g²;  p ← p − lr·g/(√a + ε) — torch's RMSprop with alpha = ρ
    return torch.optim.RMSprop(params, lr=cfg.lr, alpha=cfg.rho, eps=cfg.eps)


def train(config: TrainConfig | Mapping[str, Any] | Resolved, report: Report | None = None) -> TrainResult:
    """Train one trial. Raises only for an invalid config; training problems return status `failed`."""
    resolved = config if isinstance(config, Resolved) else resolve(config)
    cfg = resolved.config
    started = time.perf_counter()
    result = TrainResult.pending(resolved)
    try:
        task = resolved.make_task()  # may read data files: a missing file is a failed trial, with its fix
        result.metric_name = task.metric_name
        result.baseline_loss = task.baseline_loss
        result.success_threshold = task.success_threshold(cfg.success_fraction)
        _run(resolved, task, result, report, started)
    except Exception as exc:  # a trial never takes its caller down
        result.status, result.reason = "failed", failure_reason(exc)
    result.seconds = time.perf_counter() - started
    result.success = (
        result.status == "ok"
        and result.final_val_loss is not None
        and result.final_val_loss < result.success_threshold
    )
    return result


def _run(resolved: Resolved, task: Task, result: TrainResult, report: Report | None, started: float) -> None:
    cfg = resolved.config
    device = resolve_device(cfg.device)
    torch.set_num_threads(cfg.threads)
    if device.type == "cpu":
        torch.set_flush_denormal(True)  # denormals in decaying states cost 5–25× on CPU
    torch.manual_seed(derive_seed(cfg.seed, "torch"))  # anything that still uses the global RNG

    model = build_model(resolved, task).to(device)
    result.params = count_params(model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(cfg, params)
    val_split = task.val_split()
    batches = training_batches(task, cfg.batch_size, cfg.seed)

    steps_per_epoch = math.ceil(task.train_size / cfg.batch_size)
    budget = cfg.steps if cfg.steps is not None else cfg.epochs * steps_per_epoch
    eval_every = cfg.eval_every or steps_per_epoch
    result.budget_steps = budget
    limit = math.inf if cfg.divergence_factor is None else cfg.divergence_factor * task.baseline_loss

    running = torch.zeros((), device=device)
    n_running = 0
    for step in range(1, budget + 1):
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

        is_eval = step % eval_every == 0 or step == budget
        if not is_eval and step % 50:
            continue
        train_loss = float(running) / n_running
        if not math.isfinite(train_loss) or train_loss > limit:
            result.status = "failed"
            result.reason = f"training loss diverged ({train_loss:.4g}) at step {step}"
            return
        if not is_eval:
            continue
        val_loss, metric = evaluate(model, task, val_split, cfg.eval_batch_size, device)
        evaluation = Evaluation.at(step, steps_per_epoch, train_loss, val_loss, metric, started)
        result.history.append(evaluation)
        result.final_val_loss, result.final_metric = val_loss, metric
        if report is not None:
            report(evaluation)
        running.zero_()
        n_running = 0
        if not math.isfinite(val_loss) or val_loss > limit:
            result.status = "failed"
            result.reason = f"validation loss diverged ({val_loss:.4g}) at step {step}"
            return
        if cfg.early_stop_loss is not None and val_loss < cfg.early_stop_loss:
            result.early_stopped = step < budget
            break
    matrix, inputs = model.cell.recurrent_matrix(), model.cell.input_matrix()
    result.recurrent_matrix = matrix.cpu() if matrix is not None else None
    result.input_matrix = inputs.cpu() if inputs is not None else None
