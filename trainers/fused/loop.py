"""The fused loop: `train_fused(configs, report)` trains K fusable trials as one model, each member's
result what `train(configs[k])` returns.

Each member sees the very batches it would see alone (`training_batches` of its own task and seed;
members with the same seed share one stream), is evaluated on its own validation set batch by batch as
the solo loop's `evaluate` does (`trainers.fused.validation`), and returns its own `TrialResult`. A
member that fails or stops early leaves the bundle: its rows are removed from every stacked tensor, and
the others go on untouched. A bundle that runs out of memory trains again in halves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from trainers.config import Resolved, TrainConfig, resolve
from trainers.fused.cells import FUSED_CELLS
from trainers.fused.keys import check_fusable
from trainers.fused.members import Member, layout_groups, make_members
from trainers.fused.model import FusedModel
from trainers.fused.optim import FusedOptimizer
from trainers.fused.steps import BundleSteps, trains_graphed
from trainers.fused.validation import validate
from trainers.result import Evaluation, MemberReport, MembersFinished, TrialResult
from trainers.runtime import device_fault, fail, keep_network, training_batches
from trainers.schedule import Schedule
from trainers.tasks.base import Tensors

log = logging.getLogger(__name__)

#: hands members whose results are final to `train_fused`'s caller (`finished`), each once
Settle = Callable[[Iterable[int]], None]


def train_fused(
    configs: Sequence[TrainConfig | Mapping[str, Any] | Resolved],
    report: MemberReport | None = None,
    finished: MembersFinished | None = None,
) -> list[TrialResult]:
    """Train K fusable configs as one model; result k is what `train(configs[k])` returns.

    `report(k, evaluation)` is called for member k's every evaluation, once, and `finished([(k, result),
    …])` with each member's result once, as soon as it is final: when the member leaves the bundle (it
    stopped early or failed), else when its bundle ends (those final together in one call), so that a
    caller keeps it even if the bundle's process dies later.
    Raises ValueError when the configs can't share a bundle (see `fusable_key`) and ConfigError for an
    invalid config; training problems of one member make that member's result `failed` and leave the
    others running.

    A bundle that runs out of memory (its device's: CUDA's allocator, or the CPU's) is not a result of
    its members: its unfinished members train again from their start as two bundles of half the size,
    and halves again, down to one member, whose running out of memory is its failure. A member's
    numbers do not depend on its bundle's size (bit for bit on the CPU; on a GPU within its batched
    GEMM's rounding, docs/gpu.md); an evaluation reported before the split is not reported again.
    """
    resolved = [c if isinstance(c, Resolved) else resolve(c) for c in configs]
    if not resolved:
        return []
    check_fusable(resolved)
    started = time.perf_counter()
    results = [TrialResult() for _ in resolved]
    reported: set[tuple[int, int]] = set()  # (member, step) handed to `report`

    def report_once(k: int, evaluation: Evaluation) -> None:
        if report is not None and (k, evaluation.step) not in reported:
            reported.add((k, evaluation.step))
            report(k, evaluation)

    settled: set[int] = set()  # members handed to `finished`

    def settle(members: Iterable[int]) -> None:
        final = [k for k in dict.fromkeys(members) if k not in settled]
        settled.update(final)
        if final and finished is not None:
            finished([(k, results[k]) for k in final])

    bundles = [list(range(len(resolved)))]  # members to train together, by index
    while bundles:
        index = bundles.pop(0)
        groups: list[list[Member]] = []
        try:
            groups = layout_groups(make_members(resolved, results, report_once, index))
        except Exception as exc:  # a bundle never takes its caller down
            _fail_unfinished([results[i] for i in index], [], exc, started)
        built = {m.index for group in groups for m in group}
        settle(i for i in index if i not in built)  # failed as they were made (their data, their model)
        for group in groups:
            members = [m.index for m in group]
            again = _run_or_split(group, started, settle)
            if again:  # ran out of memory: its unfinished members train again from their start, in halves
                for i in again:
                    results[i] = TrialResult()
                bundles[:0] = [again[: len(again) // 2], again[len(again) // 2 :]]
            settle(i for i in members if i not in again)
    return results


def _run_or_split(group: list[Member], started: float, settle: Settle) -> list[int]:
    """Train `group`; the indices of its unfinished members when it ran out of memory with more than
    one of them left (to train again in two halves), else none."""
    try:
        _run(group, started, settle)
        return []
    except Exception as exc:  # this group's unfinished members fail; the next group still runs
        unfinished = [m.index for m in group if not m.done]
        if not (out_of_memory(exc) and len(unfinished) > 1):
            _fail_unfinished([m.result for m in group], [m.done for m in group], exc, started)
            return []
        log.warning(
            "a bundle of %d members ran out of memory (%s); it trains again as two of %d and %d",
            len(unfinished), str(exc).strip().splitlines()[0][:200],
            len(unfinished) // 2, len(unfinished) - len(unfinished) // 2,
        )  # fmt: skip
    del group[:]  # the failed bundle's tensors (and the exception's frames) go before the halves start
    release_memory()
    return unfinished


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is an allocation that found no memory: CUDA's allocator (torch.OutOfMemoryError)
    or the CPU's (a RuntimeError from DefaultCPUAllocator)."""
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)
    )


def release_memory() -> None:
    """Hand what a failed bundle held back: its unreachable tensors, and CUDA's cached blocks."""
    import gc

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.empty_cache()


def _fail_unfinished(
    results: list[TrialResult], done: list[bool], exc: BaseException, started: float
) -> None:
    """The members `exc` ended fail with it, but for a device fault (`runtime.device_fault`), which is
    no result of theirs: it is raised, for the service to run them again in a new process."""
    if device_fault(exc):
        raise exc
    for i, r in enumerate(results):
        if r.status == "done" and not (i < len(done) and done[i]):
            fail(r, exc)
            r.seconds = time.perf_counter() - started


def _steps(
    model: FusedModel,
    optimizer: FusedOptimizer,
    active: list[Member],
    streams: Mapping[int, Iterator[Tensors]],
    graphed: bool,
) -> BundleSteps:
    members = [(m.config.seed, m.data.task) for m in active]
    return BundleSteps(model, optimizer, members, streams, active[0].config.cell, graphed)


def _run(members: list[Member], started: float, settle: Settle) -> None:
    """Train one bundle to the end of its schedule; its members' results record how it ran
    (`_record_execution`), and those that leave it early are settled (`train_fused`'s `finished`) as
    they leave."""
    if not members:
        return
    cfg = members[0].config  # shared fields only
    task = members[0].data.task
    device = next(members[0].model.parameters()).device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model = FusedModel([m.model for m in members], FUSED_CELLS[cfg.cell], task.output)
    schedule = Schedule.of(cfg, task.train_size)
    optimizer = FusedOptimizer(
        cfg.optimizer, [m.config for m in members], model.params, schedule.steps_per_epoch
    )
    for m in members:
        m.result.budget_steps = schedule.budget

    # each seed's batch stream, as `train` draws it; members with one seed share its batches
    streams = {m.config.seed: training_batches(m.data.task, cfg.batch_size, m.config.seed) for m in members}
    active = members  # in the order of the stacked tensors' rows
    graphed = trains_graphed(cfg)
    stepper = _steps(model, optimizer, active, streams, graphed)
    captured = 0  # CUDA graphs captured by the steppers closed so far
    recorded: set[int] = set()  # members whose results say how the bundle ran (those that left early)
    try:
        # [K] training loss summed since the last evaluation
        running = torch.zeros(len(active), device=device)
        n_running = 0
        for step in range(1, schedule.budget + 1):
            losses = stepper.step()  # [K]: member k's loss, the mean over its batch
            running += losses.detach()
            n_running += 1
            for m in active:
                m.result.steps = step

            due = schedule.at(step)
            if due is None:
                continue
            train_losses = [v / n_running for v in running.tolist()]
            _watch(model, optimizer, active, step, due == "eval", schedule, train_losses, started)
            if due == "eval":
                running.zero_()
                n_running = 0
            if any(m.done for m in active):  # members that failed or stopped early leave the bundle
                now = time.perf_counter() - started
                leaving = [m for m in active if m.done]
                for m in leaving:
                    m.result.seconds = now
                _record_execution(leaving, len(members), device, captured + stepper.captured)
                recorded.update(m.index for m in leaving)
                settle(m.index for m in leaving)
                keep = torch.tensor([k for k, m in enumerate(active) if not m.done], device=device)
                active = [m for m in active if not m.done]
                if not active:
                    return
                model.keep(keep)
                optimizer.keep(keep)
                stepper.close()  # a graph holds the old shapes: its memory goes before the next is captured
                captured += stepper.captured
                stepper = _steps(model, optimizer, active, streams, graphed)
                running = running[keep]
        now = time.perf_counter() - started
        for k, m in enumerate(active):
            _leave(m, k, model)
            m.result.seconds = now
    finally:  # the last graph's memory goes now, not at a garbage collection
        stepper.close()
        rest = [m for m in members if m.index not in recorded]
        _record_execution(rest, len(members), device, captured + stepper.captured)


def _watch(
    model: FusedModel,
    optimizer: FusedOptimizer,
    active: list[Member],
    step: int,
    evaluate: bool,
    schedule: Schedule,
    train_losses: list[float],
    started: float,
) -> None:
    """Each member's schedule watch at a step that reports, as its solo run's: its training loss, and
    with `evaluate` its validation. A member that fails or stops early is marked `done` (one that stops
    early takes its trained weights with it: `_leave`)."""
    for m, train_loss in zip(active, train_losses, strict=True):
        m.done = not m.watch.check_training(step, train_loss)
    if not evaluate:
        return
    scores = validate(model, active)  # every row (one that just failed is ignored)
    rates = optimizer.rates  # member k's, in the stacked rows' order as `active`
    for k, (m, train_loss, (val_loss, metric)) in enumerate(zip(active, train_losses, scores, strict=True)):
        if m.done:
            continue
        lr = None if rates[k].constant else rates[k].at(step)
        evaluation = Evaluation.at(step, schedule.steps_per_epoch, train_loss, val_loss, metric, started, lr)
        if m.watch.evaluated(evaluation):
            _leave(m, k, model)


def _record_execution(members: list[Member], size: int, device: torch.device, captured: int) -> None:
    """How a bundle of `size` members ran, in these members' `provenance` (the same numbers either way;
    what a GPU run is checked by, docs/gpu.md): its members at the start, and on CUDA the graphs it
    captured and the peak memory the bundle's process allocated while it trained, up to when each
    member left it."""
    facts = {"bundle_members": str(size)}
    if device.type == "cuda":
        facts["cuda_graph_captures"] = str(captured)
        facts["cuda_peak_bytes"] = str(torch.cuda.max_memory_allocated(device))
    for m in members:
        if m.result.provenance is not None:
            m.result.provenance.update(facts)


def _leave(m: Member, k: int, model: FusedModel) -> None:
    """Member k leaves the bundle; one that is still `done` takes its trained weights (and their
    analyses) into its result, as its solo run does."""
    if m.result.status == "done":
        model.load_into(k, m.model)
        keep_network(m.result, m.model, m.config.cell_params.get("nonlinearity"))
    m.done = True
