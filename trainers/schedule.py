"""When a trial evaluates, checks its loss and stops: the one schedule of the solo and fused loops.

The loops own their arithmetic; this module decides when things happen, so a fused member follows
exactly the course its solo run follows:

- the budget: `steps` optimiser steps, or `epochs` passes over the training set;
- an evaluation every `eval_every` steps (default once per epoch, Keras `fit`) and always at the
  end of the budget;
- the running training loss is checked at every evaluation and every `CHECK_EVERY` steps;
- the failure rule: a loss that is not finite ends the trial as `failed` with its reason (Keras
  trains on whatever the loss does, and a non-finite loss makes every later one non-finite); the
  opt-in `divergence_guard`, not the papers' protocol, also fails a finite loss above guard × baseline;
- early stop once a validation loss is below `early_stop_loss` (Orhan's EarlyStoppingByLossVal);
- the final validation loss is the last evaluation's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from trainers.config import Resolved, TrainConfig
from trainers.result import Evaluation, TrialResult

#: steps between checks of the running training loss when no evaluation falls due
CHECK_EVERY = 50


@dataclass(frozen=True)
class Schedule:
    """A trial's budget and evaluation cadence, in optimiser steps."""

    steps_per_epoch: int
    budget: int
    eval_every: int

    @classmethod
    def of(cls, cfg: TrainConfig, train_size: int) -> Schedule:
        steps_per_epoch = math.ceil(train_size / cfg.batch_size)
        budget = cfg.steps if cfg.steps is not None else cfg.epochs * steps_per_epoch
        return cls(steps_per_epoch, budget, cfg.eval_every or steps_per_epoch)

    @classmethod
    def of_trial(cls, resolved: Resolved) -> Schedule:
        """The trial's schedule, from its task's training-set size (the task is built: cheap, its data are
        made or read lazily; a file-backed task without its files raises)."""
        return cls.of(resolved.config, resolved.make_task().train_size)

    @property
    def evaluations(self) -> int:
        """Evaluations over the whole budget (`at`: every `eval_every` steps, and at the budget's end)."""
        return math.ceil(self.budget / self.eval_every)

    def at(self, step: int) -> Literal["eval", "check"] | None:
        """What falls due after optimiser step `step`: an evaluation, a loss check, or nothing."""
        if step % self.eval_every == 0 or step == self.budget:
            return "eval"
        if step % CHECK_EVERY == 0:
            return "check"
        return None


class Watch:
    """One trial's course under the schedule's rules: its failure rule, its early stop, its record."""

    def __init__(
        self, cfg: TrainConfig, result: TrialResult, report: Callable[[Evaluation], Any] | None
    ) -> None:
        self.result = result
        self.report = report
        baseline = result.baseline_loss if result.baseline_loss is not None else math.nan
        self.guard = cfg.divergence_guard
        self.limit = math.inf if cfg.divergence_guard is None else cfg.divergence_guard * baseline
        self.early_stop_loss = cfg.early_stop_loss
        self.since = 1  # the first step of the running training loss (the loops reset it at each evaluation)
        self.finite = 0  # the last step up to which every training loss is known finite (a check passed)

    def check_training(self, step: int, train_loss: float) -> bool:
        """False (and the trial failed, with its reason) when the running training loss — the mean over
        the steps since the last evaluation — breaks the rule. The loss is checked only where the schedule
        says (a check, an evaluation), so the reason names the steps the broken loss lies in: for a loss
        that is not finite, those since the last check it passed (a finite mean has only finite terms);
        for one above the divergence guard, those of the mean."""
        if math.isfinite(train_loss):
            reason = self._broken("training", train_loss, self._steps(self.since, step, "their mean, "))
        else:
            reason = self._broken("training", train_loss, self._steps(max(self.since, self.finite + 1), step))
        if reason is not None:
            self.result.status, self.result.reason = "failed", reason
            return False
        self.finite = step
        return True

    @staticmethod
    def _steps(first: int, last: int, what: str = "") -> str:
        """Where a loss checked after step `last` lies: `at step 5`, or `in steps 401–420 (checked at 420)`."""
        return f"at step {last}" if first == last else f"in steps {first}–{last} ({what}checked at {last})"

    def _broken(self, which: str, loss: float, where: str) -> str | None:
        """Why this loss ends the trial, or None; `where`: the step, or steps, it is of ("at step 5")."""
        if not math.isfinite(loss):
            return f"{which} loss is not finite ({loss}) {where}"
        if loss > self.limit:
            return (
                f"{which} loss {loss:.4g} {where} is above the divergence guard "
                f"({self.guard:g} × baseline; an opt-in, not the papers' protocol)"
            )
        return None

    def evaluated(self, evaluation: Evaluation) -> bool:
        """Record an evaluation (history, final loss, report); True when the trial ends with it:
        failed (`result.status`), or stopped early."""
        r = self.result
        r.history.append(evaluation)
        r.final_val_loss, r.final_metric = evaluation.val_loss, evaluation.metric
        if self.report is not None:
            self.report(evaluation)
        val_loss, step = evaluation.val_loss, evaluation.step
        self.since = step + 1
        reason = self._broken("validation", val_loss, f"at step {step}")
        if reason is not None:
            r.status, r.reason = "failed", reason
            return True
        if self.early_stop_loss is not None and val_loss < self.early_stop_loss:
            r.early_stopped = step < r.budget_steps
            return True
        return False


class Ending:
    """Whether a trial's course ends with an evaluation, known as the evaluation is reported, before
    the trial's result comes back: at the end of its budget, with a loss that breaks the failure rule,
    or at its early stop — `Watch.evaluated`'s own rules, run on a scratch result. A caller that
    reports evaluations on as they come (a worker under an early-stopping scheduler) sends a trial's
    last evaluation together with its result, so the scheduler never stops a trial that has ended."""

    def __init__(self, cfg: TrainConfig, budget: int, baseline: float | None) -> None:
        self.cfg, self.budget, self.baseline = cfg, budget, baseline

    @classmethod
    def of(cls, resolved: Resolved) -> Ending:
        """The trial's ending rules, from its task's size and baseline (the task is built: cheap, its
        data are made or read lazily)."""
        task = resolved.make_task()
        return cls(resolved.config, Schedule.of(resolved.config, task.train_size).budget, task.baseline_loss)

    def at(self, evaluation: Evaluation) -> bool:
        """Whether the trial ends with `evaluation`."""
        if evaluation.step >= self.budget:
            return True
        return Watch(self.cfg, TrialResult(baseline_loss=self.baseline), None).evaluated(evaluation)
