"""What a study found: success counts with Wilson intervals, best configurations, curves.

Success is judged here, from each trial's stored final validation loss and baseline, under the
study's criterion (`trainers.Criterion`, the one rule): never taken from a worker, never stored per
trial, so a study judged under another criterion is recounted without training anything. Counts are
over every trial of the study (Orhan & Pitkow Fig. 3d-f count runs, failed ones included).

A count can also be taken *at a budget*: what a run's final validation loss would have been had it
been trained for `step` optimiser steps is its last evaluation at or before that step (a run that
failed at or before it, or was pruned before it, has none). So a study run on a short budget is
comparable with the paper at the same budget, and the counts against budget show whether more steps
would change them.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from service.core.states import FINISHED
from service.core.trial import PointKey, point_key
from service.core.values import repr_value, value_sort_key
from trainers.criterion import HALF_BASELINE, Criterion


class TrialLike(Protocol):
    model: str
    params: dict[str, Any]
    status: str
    steps: int | None
    final_val_loss: float | None
    baseline_loss: float | None
    reference_baselines: dict[str, float] | None
    history: list[dict[str, Any]] | None
    config_hash: str


# ----- what the functions below answer (the REST API serves these types as they are) --------------


class CriterionPublic(BaseModel):
    """A success criterion: final validation loss below `fraction` × a baseline, or below `threshold`."""

    name: str
    fraction: float | None
    threshold: float | None
    baseline: str = Field(description="'task' (the task's random baseline) or a reference baseline's name")

    @classmethod
    def of(cls, criterion: Criterion) -> CriterionPublic:
        return cls.model_validate(criterion.to_dict())


class SuccessCell(BaseModel):
    trials: int = Field(
        description="the trials that are not in error (pending, running and cancelled ones too)"
    )
    finished: int = Field(description="runs with a result (done, failed, pruned; at a budget, one there)")
    failed: int
    # (its place: beside `failed`, of which it counts a part, as the CSV's columns had it before they were
    # read off these fields: `service.reports.tables.CELL_FIELDS`)
    raised: int = Field(
        default=0,
        description="of the failed runs, those an exception ended (a traceback kept: a bug in a cell or a "
        "task, or a numerical error), not the protocol's failure (a loss not finite); the rate counts them "
        "as runs that did not succeed: read their tracebacks before it",
    )
    pruned: int = Field(
        default=0, description="stopped early by the scheduler (asha): runs that did not succeed"
    )
    errors: int = Field(description="trials whose worker, node or process died: no run, never counted as one")
    succeeded: int
    rate: float | None = Field(description="succeeded / finished; null when none finished (no estimate)")
    ci95: tuple[float, float] = Field(
        description="95 % Wilson score interval of the rate, over the finished runs"
    )


_CELL_EXAMPLE: dict[str, Any] = {"trials": 2, "finished": 2, "failed": 0, "raised": 0, "pruned": 0, "errors": 0, "succeeded": 2, "rate": 1.0,
                 "ci95": [0.34, 1.0]}  # fmt: skip


class Difference(BaseModel):
    """A rate minus another's, with its 95 % interval (Newcombe's hybrid score, from the two Wilson ones)
    and Fisher's exact p; none while either has no finished run, and none for the reference itself
    (`is_reference`: a model set against itself has no difference to estimate, and 0.0 [0, 0] read as a
    measured one)."""

    difference: float | None
    ci95: tuple[float, float] | None
    p: float | None = Field(
        default=None,
        description="two-sided p of Fisher's exact test of the two rates: with few runs the interval is "
        "approximate (2/2 against 0/2: an interval clear of 0, p = 0.33)",
    )
    is_reference: bool = Field(
        default=False, description="this row is the reference model itself: no difference, none to estimate"
    )


class SuccessTable(BaseModel):
    """Successful runs (final validation loss < threshold), counted over every trial of the study."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "criterion": {
                        "name": "0.5 × baseline",
                        "fraction": 0.5,
                        "threshold": None,
                        "baseline": "task",
                    },
                    "at_step": None,
                    "total": {
                        "trials": 4,
                        "finished": 4,
                        "failed": 0,
                        "raised": 0,
                        "pruned": 0,
                        "errors": 0,
                        "succeeded": 2,
                        "rate": 0.5,
                        "ci95": [0.15, 0.85],
                    },
                    "by_model": {"chain": _CELL_EXAMPLE},
                    "by_value": {"chain": {"lr": {"0.0003": _CELL_EXAMPLE}}},
                }
            ]
        }
    )
    criterion: CriterionPublic = Field(description="what counted as a success")
    at_step: int | None = Field(description="the budget the counts are taken at; null: each run's end")
    total: SuccessCell
    by_model: dict[str, SuccessCell]
    by_value: dict[str, dict[str, dict[str, SuccessCell]]] = Field(
        description="model → hyperparameter → value → counts"
    )
    reference: str | None = Field(
        default=None, description="the model each model's rate is set against (`?reference=`); null: none"
    )
    differences: dict[str, Difference] | None = Field(
        default=None,
        description="model → its rate minus the reference model's, with Newcombe's 95 % interval (the "
        "models' trials are disjoint runs of one study); the reference's own row is `is_reference`, with "
        "no difference; null without a reference",
    )
    notes: list[str] = Field(
        default_factory=list,
        description="what the counts cannot say themselves: an `at_step` past the end of every run that "
        "ended, which counts each at its end (the table without `at_step`); the models with runs that "
        "raised an exception (`raised`), counted as runs that did not succeed",
    )


class BudgetCell(BaseModel):
    step: int
    succeeded: int
    trials: int
    finished: int = Field(default=0, description="runs with a result at this budget: the rate's denominator")
    rate: float | None = Field(description="succeeded / finished at this budget; null when none finished")
    ci95: tuple[float, float]


class SuccessBudget(BaseModel):
    """Successful runs per model against training steps: a run's loss at a budget of `step` steps is
    its last evaluation at or before it."""

    criterion: CriterionPublic
    steps: list[int]
    by_model: dict[str, list[BudgetCell]]


class BestConfig(BaseModel):
    """One point of the space, its seeds pooled, ranked by mean final validation loss."""

    model: str
    params: dict[str, Any]
    mean_final_val_loss: float
    sem: float = Field(description="standard error of the mean over the finished seeds")
    seeds: list[int] = Field(description="the seeds in the mean: those that trained to their end (`done`)")
    succeeded: int
    trials: int
    config_hashes: list[str]
    missing_seeds: dict[str, int] = Field(
        default_factory=dict,
        description="the point's seeds left out of the mean, by their status: `pruned` (stopped early by "
        "asha), `failed`, `pending`, `running`, `cancelled`, `error`; empty when every seed trained to its "
        "end. A point with missing seeds is ranked after every point without (its mean is over the "
        "seeds that survived, which would put it first on luck)",
    )
    settings: dict[str, Any] = Field(
        default_factory=dict,
        description="a point with no varied values (`params` empty: its model fixes every setting, as "
        "nru2019-copy100's do): the trial settings that tell it from the study's other points, those that "
        "points which both have them hold at different values (`hidden`, `optimizer` …); empty for a point "
        "with `params`, and where nothing tells it apart (a study of one point)",
    )


# ----- counting ------------------------------------------------------------------------------------


def wilson_interval(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95 % Wilson score interval of a binomial proportion k/n (sensible at k = 0 and k = n)."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if k == 0 else max(0.0, centre - half)  # exact bounds at the ends (no rounding past them)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return (lo, hi)


def newcombe_interval(k1: int, n1: int, k2: int, n2: int) -> tuple[float, float]:
    """95 % interval of the difference k1/n1 − k2/n2 of two independent proportions: Newcombe's hybrid
    score interval (Stat. Med. 17:873, 1998, method 10), built from the two Wilson intervals above.
    Unlike the Wald interval it stays inside [−1, 1] and keeps near-nominal coverage at 0/n and n/n."""
    if n1 == 0 or n2 == 0:
        return (-1.0, 1.0)
    p1, p2 = k1 / n1, k2 / n2
    (l1, u1), (l2, u2) = wilson_interval(k1, n1), wilson_interval(k2, n2)
    d = p1 - p2
    lo = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    hi = d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return (max(-1.0, lo), min(1.0, hi))


def fisher_exact_p(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided p of Fisher's exact test of k1/n1 against k2/n2: the probability, with the margins fixed
    (k1 + k2 successes among n1 + n2 runs), of a table no more likely than the one seen (the usual
    two-sided rule, as R's fisher.test and scipy's fisher_exact compute it, with their relative tolerance)."""
    k, n = k1 + k2, n1 + n2
    lo, hi = max(0, k - n2), min(k, n1)
    total = math.comb(n, k)
    probs = {x: math.comb(n1, x) * math.comb(n2, k - x) / total for x in range(lo, hi + 1)}
    seen = probs[k1] * (1 + 1e-7)
    return min(1.0, sum(p for p in probs.values() if p <= seen))


def is_success(t: TrialLike, criterion: Criterion = HALF_BASELINE, at_step: int | None = None) -> bool:
    """Whether the trial succeeded under `criterion`, at the end of its run or at a budget of `at_step`."""
    status, loss = state_of(t, at_step)
    return criterion.judge(status, loss, t.baseline_loss, t.reference_baselines)


def state_of(t: TrialLike, at_step: int | None) -> tuple[str, float | None]:
    """(status, final validation loss) of the trial at the end of its run, or at a budget of `at_step`."""
    return (t.status, t.final_val_loss) if at_step is None else state_at(t, at_step)


def state_at(t: TrialLike, step: int) -> tuple[str, float | None]:
    """(status, final validation loss) the trial would have had with a budget of `step` steps."""
    # a failed run has no result at or after its failure; a pruned one has its evaluations up to where
    # the scheduler stopped it (at that budget the run would have ended with them)
    if t.status == "failed" and t.steps is not None and failed_at(t) <= step:
        return t.status, t.final_val_loss
    if t.status == "pruned" and t.steps is not None and t.steps < step:
        return t.status, t.final_val_loss
    history = t.history or []
    seen = [e for e in history if int(e["step"]) <= step]
    if not seen:  # no evaluation yet at that budget: no final loss
        return "pending", None
    if t.status not in FINISHED and int(history[-1]["step"]) < step:  # running, cancelled: not there yet
        return "pending", None
    return "done", float(seen[-1]["val_loss"])


def failed_at(t: TrialLike) -> int:
    """The step a failed run failed at: its `steps`, the last step it trained, where the failure rule
    judged that step (a loss not finite, or above an opted-in divergence guard), or an exception came
    before an evaluation there; the step after, where an exception came after its evaluation at
    `steps` (a budget of `steps` would have ended the run there, with that evaluation), unless the run
    ended there anyway (its budget, its early stop: it failed in what follows the last evaluation, as
    the end-of-run table counts it). An exception leaves its traceback."""
    assert t.steps is not None
    last = t.history[-1] if t.history else None
    ended_there = getattr(t, "early_stopped", None) or t.steps == getattr(t, "budget_steps", None)
    raised_after = (
        getattr(t, "traceback", None)
        and last is not None
        and int(last["step"]) == t.steps
        and not ended_there
    )
    return t.steps + 1 if raised_after else t.steps


def judgeable(
    t: TrialLike, status: str, loss: float | None, criterion: Criterion
) -> tuple[str, float | None]:
    """A trial's state at a budget, as a run only if `criterion` can judge it there: a trial that has not
    ended (running, or cancelled before this version kept its baselines) reached the budget with a
    loss, but a fraction of a baseline needs the baselines its task records with its result."""
    unjudged = criterion.threshold_for(t.baseline_loss, t.reference_baselines) is None
    if t.status not in FINISHED and status == "done" and unjudged:
        return "pending", None
    return status, loss


def success_cell(
    trials: Sequence[TrialLike], criterion: Criterion = HALF_BASELINE, at_step: int | None = None
) -> SuccessCell:
    """One table cell: the trials, finished, failed, pruned, errors and successes among these trials under
    `criterion` (at a budget of `at_step`), with the rate's 95 % Wilson interval. The rate is over the
    finished runs, those with a result (done, failed, pruned; at a budget, those with one there): a
    trial still pending or running, or cancelled, is no run yet, and counting it as one that did not
    succeed gave a study under way, or cancelled, a rate too low and an interval too narrow (0/12 for
    a model none of whose runs had ended). A trial in `error` (its worker, node or process died: an
    infrastructure fault) is no run either: it is counted apart."""
    runs = [t for t in trials if t.status != "error"]
    states = [(t, *judgeable(t, *state_of(t, at_step), criterion)) for t in runs]
    ended = [(t, status, loss) for t, status, loss in states if status in FINISHED]
    n = len(ended)
    k = sum(
        criterion.judge(status, loss, t.baseline_loss, t.reference_baselines) for t, status, loss in ended
    )
    return SuccessCell(
        trials=len(runs),
        finished=n,
        failed=sum(status == "failed" for _, status, _ in ended),
        pruned=sum(status == "pruned" for _, status, _ in ended),
        errors=len(trials) - len(runs),
        raised=sum(
            status == "failed" and getattr(t, "traceback", None) is not None for t, status, _ in ended
        ),
        succeeded=k,
        rate=k / n if n else None,
        ci95=wilson_interval(k, n),
    )


def success_table(
    trials: Iterable[TrialLike],
    criterion: Criterion = HALF_BASELINE,
    at_step: int | None = None,
    reference: str | None = None,
) -> SuccessTable:
    """Successes under `criterion`, at the end of each run or at a budget of `at_step`: in total, by
    model, and by model, field and value; with a `reference` model, each model's rate minus its own
    (a researcher's cell against a paper's, under one protocol). ValueError: no such model."""
    trials = list(trials)
    by_model: dict[str, list[TrialLike]] = defaultdict(list)
    for t in trials:
        by_model[t.model].append(t)
    by_value: dict[str, dict[str, dict[str, SuccessCell]]] = {}
    for model, ts in by_model.items():
        fields: dict[str, dict[str, list[TrialLike]]] = defaultdict(lambda: defaultdict(list))
        for t in ts:
            for key, value in t.params.items():
                if key != "seed":
                    fields[key][repr_value(value)].append(t)
        by_value[model] = {
            key: {
                v: success_cell(vs, criterion, at_step)
                for v, vs in sorted(values.items(), key=lambda kv: value_sort_key(kv[0]))
            }
            for key, values in fields.items()
        }
    models = {m: success_cell(ts, criterion, at_step) for m, ts in sorted(by_model.items())}
    differences = None
    if reference is not None:
        if reference not in models:
            raise ValueError(
                f"reference = {reference!r} is no model of this study; its models: {', '.join(models) or 'none yet'}"
            )
        ref = models[reference]
        differences = {
            m: Difference(difference=None, ci95=None, is_reference=m == reference)
            if m == reference or c.rate is None or ref.rate is None  # itself, or no finished run yet
            else Difference(
                difference=c.rate - ref.rate,
                ci95=newcombe_interval(c.succeeded, c.finished, ref.succeeded, ref.finished),
                p=fisher_exact_p(c.succeeded, c.finished, ref.succeeded, ref.finished),
            )
            for m, c in models.items()
        }
    total = success_cell(trials, criterion, at_step)
    return SuccessTable(
        criterion=CriterionPublic.of(criterion),
        at_step=at_step,
        total=total,
        by_model=models,
        by_value=by_value,
        reference=reference,
        differences=differences,
        notes=budget_notes(trials, at_step) + raised_notes(models),
    )


def raised_notes(by_model: Mapping[str, SuccessCell]) -> list[str]:
    """The models some of whose failed runs raised an exception: their rates count those runs as runs that
    did not succeed, which a cell that crashes (a 0 % rate, a tight interval) would otherwise hide."""
    raised = {m: c for m, c in by_model.items() if c.raised}
    if not raised:
        return []
    which = ", ".join(f"{m} {c.raised} of {c.finished}" for m, c in raised.items())
    return [
        f"runs that raised an exception, not the protocol's failure (a loss not finite), counted as runs that "
        f"did not succeed: {which}; read their tracebacks before the rates (`memsweep trials ID --status "
        "failed --json --history`; REST: trials?status=failed&history=true)"
    ]


def budget_notes(trials: Sequence[TrialLike], at_step: int | None) -> list[str]:
    """What a count at a budget says of itself: one past the end of every run that ended (99,999 steps
    of 1,500-step runs) counts each run at its end, which its title alone does not tell."""
    ended = [t.steps for t in trials if t.status in FINISHED and t.steps is not None]
    if at_step is None or not ended or max(ended) >= at_step:
        return []
    return [
        f"at_step {at_step:,} is past the end of every run that ended (the longest trained {max(ended):,} "
        "steps): each is counted at its end, as without at_step"
    ]


def success_vs_budget(
    trials: Iterable[TrialLike], criterion: Criterion = HALF_BASELINE, steps: Sequence[int] | None = None
) -> SuccessBudget:
    """Successes per model against training steps, with 95 % Wilson intervals. The steps are every
    step at which some trial evaluated, and the budget of each run that ended, unless given: where no
    run evaluated at its budget (each stopped early, or was pruned), the curve still ends at the count
    the study's table gives (before, it ended at the last evaluation, where a run pruned there counts
    by its loss, and said 4 successes where the table said 2)."""
    trials = list(trials)
    if steps is None:
        budgets = {b for t in trials if t.status in FINISHED and (b := getattr(t, "budget_steps", None))}
        steps = sorted({int(e["step"]) for t in trials for e in t.history or []} | budgets)
    by_model: dict[str, list[TrialLike]] = defaultdict(list)
    for t in trials:
        by_model[t.model].append(t)
    rows: dict[str, list[BudgetCell]] = {}
    for model, ts in sorted(by_model.items()):
        rows[model] = []
        for step in steps:
            cell = success_cell(ts, criterion, step)
            rows[model].append(
                BudgetCell(
                    step=step,
                    succeeded=cell.succeeded,
                    trials=cell.trials,
                    finished=cell.finished,
                    rate=cell.rate,
                    ci95=cell.ci95,
                )
            )
    return SuccessBudget(criterion=CriterionPublic.of(criterion), steps=list(steps), by_model=rows)


def best_configs(
    trials: Iterable[TrialLike], k: int = 5, model: str | None = None, criterion: Criterion = HALF_BASELINE
) -> list[BestConfig]:
    """Points (seeds pooled) ranked by mean final validation loss over the seeds that trained to their
    end (`done`): first the points whose every seed did, then those some seed of which failed, was
    pruned or has not ended (a point ranked on its surviving seeds alone would come first on luck);
    `seeds` are the seeds in the mean, `missing_seeds` the others by status, so a row says why it is
    ranked where it is."""
    groups: dict[PointKey, list[TrialLike]] = defaultdict(list)
    for t in trials:
        groups[point_key(t.model, t.params)].append(t)
    # told apart from every point of the trials, not only `model`'s: a row reads the same either way
    apart = settings_apart(groups) if any(not params for _, params in groups) else {}
    ranked: list[tuple[bool, BestConfig]] = []  # (some seed did not end, the row)
    for (m, params), ts in groups.items():
        if model is not None and m != model:
            continue
        finished = [t for t in ts if t.status == "done" and t.final_val_loss is not None]
        losses = [float(t.final_val_loss or 0.0) for t in finished]  # never None: filtered above
        if not losses:
            continue
        missing = Counter(t.status for t in ts if t.status != "done" or t.final_val_loss is None)
        row = BestConfig(
            model=m,
            params={key: v for key, v in ts[0].params.items() if key != "seed"},
            mean_final_val_loss=statistics.fmean(losses),
            sem=standard_error(losses),
            seeds=sorted(int(t.params.get("seed", 0)) for t in finished),
            succeeded=sum(is_success(t, criterion) for t in ts),
            trials=len(ts),
            config_hashes=[t.config_hash for t in ts],
            missing_seeds=dict(sorted(missing.items())),
            settings=apart.get((m, params), {}),
        )
        ranked.append((bool(missing), row))
    ranked.sort(key=lambda pair: (pair[0], pair[1].mean_final_val_loss))
    return [row for _, row in ranked[:k]]


def settings_apart(
    points: Mapping[PointKey, Sequence[TrialLike]],
) -> dict[PointKey, dict[str, Any]]:
    """Each point with no varied values (`point_key`'s params empty) → the settings of its trials'
    config (flat, as a spec names them: `hidden`, `seq_len`, `memory_size`) that tell points apart: those
    that two points which both have them hold differently. A setting one point alone has (nru's
    `memory_size` beside LSTMs) tells nothing the model's name does not."""
    configs = {key: flat_settings(ts[0]) for key, ts in points.items()}
    held: dict[str, set[str]] = defaultdict(set)
    for config in configs.values():
        for name, value in config.items():
            held[name].add(repr_value(value))
    telling = {name for name, values in held.items() if len(values) > 1}
    return {
        key: {name: v for name, v in config.items() if name in telling}
        for key, config in configs.items()
        if not key[1]
    }


def flat_settings(t: TrialLike) -> dict[str, Any]:
    """A trial's settings from its stored config, the task's and the cell's beside the others, its seed
    aside; {} for a trial without a config."""
    config: Mapping[str, Any] = getattr(t, "config", None) or {}
    flat = {k: v for k, v in config.items() if k not in ("seed", "task_params", "cell_params")}
    for nested in ("task_params", "cell_params"):
        flat.update(config.get(nested) or {})
    return flat


def standard_error(values: Sequence[float]) -> float:
    """The s.e.m. of `values` (0 for one value; NaN when one is not finite: a failed seed's last
    evaluation can be NaN or infinite, and `statistics.stdev` raises on those instead)."""
    if len(values) < 2:
        return 0.0
    if not all(math.isfinite(v) for v in values):
        return math.nan
    return statistics.stdev(values) / math.sqrt(len(values))


def mean_curve(trials: Sequence[TrialLike]) -> list[dict[str, float]]:
    """Validation loss per evaluation step: mean and s.e.m. over the given trials (seeds)."""
    per_step: dict[int, list[float]] = defaultdict(list)
    for t in trials:
        for e in t.history or []:
            per_step[int(e["step"])].append(float(e["val_loss"]))
    out = []
    for step in sorted(per_step):
        vals = per_step[step]
        sem = standard_error(vals)
        out.append({"step": step, "mean": statistics.fmean(vals), "sem": sem, "n": len(vals)})
    return out


def _mean_sem(values: Sequence[float]) -> dict[str, float | int]:
    mean = statistics.fmean(values)
    sem = standard_error(values)
    return {"mean": mean, "sem": sem, "n": len(values)}


def henrici_table(
    trials: Iterable[Any], criterion: Criterion = HALF_BASELINE
) -> dict[str, dict[str, float | int]]:
    """Henrici index d(W) of the successful trials' trained matrices, mean ± s.e.m. per model (Orhan Table 2)."""
    per_model: dict[str, list[float]] = defaultdict(list)
    for t in trials:
        if is_success(t, criterion) and t.henrici_index is not None:
            per_model[t.model].append(float(t.henrici_index))
    return {m: _mean_sem(v) for m, v in sorted(per_model.items())}


def profile_table(trials: Iterable[Any], criterion: Criterion = HALF_BASELINE) -> dict[str, dict[str, Any]]:
    """Weight profiles (Orhan Figs. 5-6) of the successful trials, mean ± s.e.m. over trials per model."""
    per_model: dict[str, list[list[float]]] = defaultdict(list)
    for t in trials:
        if is_success(t, criterion) and t.profile:
            per_model[t.model].append(list(t.profile))
    out: dict[str, dict[str, Any]] = {}
    for model, profiles in sorted(per_model.items()):
        if len({len(p) for p in profiles}) != 1:
            continue  # networks of different sizes are not averaged
        n_units = (len(profiles[0]) + 1) // 2
        columns = list(zip(*profiles, strict=True))
        stats = [_mean_sem(col) for col in columns]
        out[model] = {
            "offsets": list(range(-(n_units - 1), n_units)),
            "mean": [s["mean"] for s in stats],
            "sem": [s["sem"] for s in stats],
            "n": len(profiles),
        }
    return out


def loss_by_scale(trials: Iterable[Any], below: float | None = None) -> dict[str, list[dict[str, float]]]:
    """Final validation loss against the initialiser's scale (α, β, λ) per model, mean ± s.e.m. over the
    other dimensions and seeds (Orhan Fig. 9 for fbchain's β), over trials whose loss is below `below`
    (the paper keeps those under the random baseline)."""
    per: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for t in trials:
        scale = t.params.get("scale")
        if t.status != "done" or t.final_val_loss is None or scale is None:
            continue
        if below is not None and t.final_val_loss >= below:
            continue
        per[t.model][float(scale)].append(float(t.final_val_loss))
    return {m: [{"scale": s, **_mean_sem(v)} for s, v in sorted(by.items())] for m, by in sorted(per.items())}
