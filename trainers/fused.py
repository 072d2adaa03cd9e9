"""Fused trial bundles (issues 7, 17): K same-shape trials of one cell trained as one model in one process.

The cells that fuse, and how each runs its recurrence for all members at once, are listed in
`trainers.fused_cells.FUSED_CELLS` (rnn, urnn, crnn, vprnn, fastrnn, sgornn, srnn).

A bundle is K configs that agree on every shape and schedule field (`fusable_key`); members may
differ in seed (so data, permutation and weights), learning rate and the optimiser's constants,
clip norm, initialiser and its scale, and the early-stop / divergence / success thresholds. Their
weights are stacked [K, …] and the recurrence runs as batched matmuls (`FusedElmanScan`,
`FusedFastRNNScan`) or, for SRNN's shift, elementwise ops over all members; the optimiser (RMSprop or Adam) and the global-norm clip are written over the stacked tensors with
per-member constants.

Each member sees the very batches it would see alone (`training_batches` of its own task and seed;
members with the same seed share one stream), is evaluated on its own validation set batch by batch
as the loop's `evaluate` does, in fused forward passes, and returns its own `TrainResult` (same
config dict, hash, history, final loss, success and recurrent matrix). A member that diverges or
stops early leaves the bundle: its rows are removed from every stacked tensor, and the others go on
untouched.

Equivalence with `train`, bit for bit: every float32 operation a member's solo run performs is
performed on its slice with the same rounding — the input projection, readout, loss and their
gradients per member with the solo ops; the recurrence's batched GEMMs run per member the kernel
`addmm` runs; f splits each member's elements between torch's vectorised and scalar paths as a
solo call does; clip and optimiser repeat torch's arithmetic (`max_norm / total` is a reciprocal
then a product). A GEMM also rounds by its operands' memory layout, so each member's parameters
keep their solo layout: the orthogonal initialiser's W comes out of QR column-major, the others'
row-major, and a bundle that mixes them trains as one sub-bundle per layout, one after the other.
Bit for bit matters: a copy run at lr 3e-3 turned a 1e-7 difference into 40 % of its loss within
400 steps.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from trainers.cells import Cell
from trainers.config import Resolved, TrainConfig, resolve
from trainers.fused_cells import FUSED_CELLS, FusedCell
from trainers.graphs import GRAPH_WARMUP, Batch, GraphedStep, graphs_available
from trainers.kernels import Workspace
from trainers.model import SequenceModel, build_model, count_params
from trainers.optim import adam_, adam_factors, rmsprop_
from trainers.result import Evaluation, TrialResult
from trainers.runtime import (
    ValidationSums,
    configure_process,
    fail,
    keep_network,
    record_device,
    record_task,
    resolve_device,
    training_batches,
)
from trainers.schedule import Schedule, Watch
from trainers.tasks import Task
from trainers.tasks.base import Split, Tensors

log = logging.getLogger(__name__)

#: trial fields every member must share: shapes, budget, schedule, optimiser kind, execution
SHARED_FIELDS = (
    "task",
    "cell",
    "hidden",
    "batch_size",
    "optimizer",
    "eval_every",
    "eval_batch_size",
    "device",
    "threads",
    "numerics",
    "cuda_graphs",
)

FusedReport = Callable[[int, Evaluation], Any]


def fusable_key(resolved: Resolved) -> tuple[tuple[str, Any], ...] | None:
    """What a bundle's members must share, as (field, value) pairs; None when the config can't be fused.

    Configs with equal keys train together in `train_fused`. The budget enters as steps, or as
    epochs when no step budget is set.
    """
    cfg = resolved.config
    spec = FUSED_CELLS.get(cfg.cell)
    if spec is None or getattr(resolved.task_cls, "input_vocab", None) is not None:
        return None  # another cell, or a token task (an embedding before the cell)
    key: list[tuple[str, Any]] = [(name, getattr(cfg, name)) for name in SHARED_FIELDS]
    key.append(("budget", ("steps", cfg.steps) if cfg.steps is not None else ("epochs", cfg.epochs)))
    key.append(("task_params", json.dumps(dict(cfg.task_params), sort_keys=True, default=str)))
    key.extend((f"cell_params.{name}", getattr(resolved.cell_config, name)) for name in spec.shared)
    if resolved.task_cls.batch_length_varies:  # each seed's batches have lengths of their own
        key.append(("seed", cfg.seed))
    return tuple(key)


def check_fusable(resolved: Sequence[Resolved]) -> None:
    """Raise ValueError naming the first field on which a config differs from the first one."""
    keys = [fusable_key(r) for r in resolved]
    for i, (r, key) in enumerate(zip(resolved, keys, strict=True)):
        if key is None:
            raise ValueError(
                f"config {i} (cell {r.config.cell!r}, task {r.config.task!r}) can't be fused: the fused "
                f"trainer supports cells {', '.join(FUSED_CELLS)} on tasks with real-valued inputs; "
                "train it with trainers.train"
            )
    first = keys[0]
    assert first is not None
    for i, key in enumerate(keys[1:], start=1):
        assert key is not None
        for (name, a), (_, b) in zip(first, key, strict=True):
            if a != b:
                raise ValueError(
                    f"configs 0 and {i} differ in {name!r} ({a!r} vs {b!r}); a fused bundle shares "
                    "every shape and schedule field: group configs by trainers.fused.fusable_key"
                )


# ----- stacked tensors -----------------------------------------------------------------------------
# Member k's slice keeps the memory layout of the solo parameter (orthogonal W comes out of QR
# column-major): a GEMM's rounding depends on the operands' layout, and the gradient norm's on
# the order in which it reads memory.


def _stack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """[K, …] stack whose slices take the layout (strides) most of the tensors have."""
    dense = [t.stride() for t in tensors if t.is_contiguous() or (t.dim() == 2 and t.t().is_contiguous())]
    first = tensors[0]
    layout = max(dense, key=dense.count) if dense else torch.empty(first.shape).stride()
    out = torch.empty_strided(
        (len(tensors), *first.shape), (first.numel(), *layout), dtype=first.dtype, device=first.device
    )
    for k, t in enumerate(tensors):
        out[k].copy_(t)
    return out


def _take(stacked: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows `index` of a stacked tensor, keeping the slices' layout."""
    out = torch.empty_strided(
        (len(index), *stacked.shape[1:]), stacked.stride(), dtype=stacked.dtype, device=stacked.device
    )
    return out.copy_(stacked[index])


def _flat(stacked: torch.Tensor) -> torch.Tensor:
    """[K, numel] view of a stacked tensor with each row in memory order (no copy)."""
    dims = sorted(range(1, stacked.dim()), key=lambda d: -stacked.stride()[d])
    return stacked.permute(0, *dims).reshape(stacked.shape[0], -1)


# ----- the stacked model ---------------------------------------------------------------------------


class FusedModel:
    """K SequenceModels of one fusable cell as stacked leaf tensors [K, …], in the solo model's
    parameter order; the cell's recurrence runs as its `FusedCell` says, the readout per member."""

    def __init__(self, models: Sequence[SequenceModel], spec: FusedCell, output: str) -> None:
        named = [dict(m.named_parameters()) for m in models]
        self.names = list(named[0])
        if self.names[-2:] != ["readout.weight", "readout.bias"] or any(list(n) != self.names for n in named):
            raise ValueError(f"unexpected model parameters {self.names}: the members' models differ in shape")
        # e.g. rnn: W [K, N, N], V [K, N, d], b [K, N], readout [K, C, N] and [K, C]
        self.params = [_stack([p[n].detach() for p in named]).requires_grad_() for n in self.names]
        self.cells: list[Cell] = [m.cell for m in models]  # each member's own buffers (e.g. permutations)
        self.spec = spec
        self.output = output
        self.workspace = Workspace()  # the recurrence's big buffers, reused every step
        self.eval_workspace = Workspace()  # the validation passes' (other batch sizes)

    def cell_params(self, rows: slice = slice(None)) -> dict[str, torch.Tensor]:
        """The cell's stacked parameters (rows `rows`) by their name in the cell."""
        return {n[5:]: p[rows] for n, p in zip(self.names, self.params, strict=True) if n.startswith("cell.")}

    def forward(
        self, xs: Sequence[torch.Tensor], rows: slice = slice(None), workspace: Workspace | None = None
    ) -> list[torch.Tensor]:
        """Member k's output for its input xs[k] [T, B, d]: [B, C] or [T, B, C], as SequenceModel.

        `rows`: the members (rows of the stacked tensors) that xs feed, all by default; `workspace`:
        where the recurrence keeps its buffers (the training one by default)."""
        last = self.output == "last"
        ws = workspace if workspace is not None else self.workspace
        hs = self.spec.states(self.cells[rows], self.cell_params(rows), xs, last, ws)
        w_out, b_out = self.params[-2][rows], self.params[-1][rows]
        # member k's readout of its last state [B, N] or of every state [T, B, N]
        return [F.linear(h, w, b) for h, w, b in zip(hs, w_out.unbind(0), b_out.unbind(0), strict=True)]

    @torch.no_grad()
    def after_step(self) -> None:
        """Each member's `after_step` hook, as its solo run calls it after every optimiser step."""
        if self.spec.after_step is not None:
            self.spec.after_step(self.cells, self.cell_params())

    def keep(self, index: torch.Tensor) -> None:
        """Keep only the members at `index` (rows of every stacked tensor)."""
        self.params = [_take(p.detach(), index).requires_grad_() for p in self.params]
        self.cells = [self.cells[i] for i in index.tolist()]

    @torch.no_grad()
    def load_into(self, k: int, model: SequenceModel) -> None:
        """Copy member k's weights into its own SequenceModel (for evaluation and the result)."""
        for target, p in zip(model.parameters(), self.params, strict=True):
            target.copy_(p[k])


# ----- the stacked optimiser -----------------------------------------------------------------------


class FusedOptimizer:
    """RMSprop or Adam over stacked [K, …] tensors with per-member constants and global-norm clip.

    The updates are `trainers.optim`'s rules (torch's single-tensor RMSprop / Adam, with the portable
    mode's correctly rounded √ on the CPU) with the constants as [K, 1, …] columns; the clip repeats
    the float32 arithmetic of `clip_grad_norm_` per member.
    """

    def __init__(self, kind: str, configs: Sequence[TrainConfig], params: Sequence[torch.Tensor]) -> None:
        self.kind = kind
        self.step_count = 0
        device = params[0].device
        self.f64 = {  # per-member constants as Python floats (bias corrections are computed in double)
            "lr": [c.lr for c in configs],
            "beta1": [c.betas[0] for c in configs],
            "beta2": [c.betas[1] for c in configs],
        }

        def column(values: Sequence[float]) -> torch.Tensor:  # double → float32, as a Python scalar is
            return torch.tensor(values, dtype=torch.float64).to(device=device, dtype=torch.float32)

        self.consts = {
            "neg_lr": column([-c.lr for c in configs]),
            "rho": column([c.rho for c in configs]),
            "one_minus_rho": column([1 - c.rho for c in configs]),
            "eps": column([c.eps for c in configs]),
            "one_minus_beta1": column([1 - c.betas[0] for c in configs]),
            "beta2": column([c.betas[1] for c in configs]),
            "one_minus_beta2": column([1 - c.betas[1] for c in configs]),
            "clip": column([c.clip_norm if c.clip_norm else math.inf for c in configs]),
        }
        self.clipped = torch.tensor([bool(c.clip_norm) for c in configs], device=device)
        self.state = [[torch.zeros_like(p) for p in params] for _ in range(1 if kind == "rmsprop" else 2)]
        #: None (always, but under a CUDA graph): Adam's per-step factors are made from `step_count`
        #: by `adam_factors`; a captured step (`trainers.graphs`) reads them from these device buffers,
        #: which it fills with `adam_factors(n)` before each replay
        self.static_factors: tuple[torch.Tensor, torch.Tensor] | None = None

    def adam_factors(self, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Adam's per-member factors at step n, [K] float32 on `device`: −lr / (1 − β1ⁿ) and
        √(1 − β2ⁿ), computed in double as torch's Adam computes them, then rounded once."""
        f = self.f64
        factors = [adam_factors(*member, n) for member in zip(f["lr"], f["beta1"], f["beta2"], strict=True)]
        neg_step, bc2_sqrt = (
            torch.tensor(column, dtype=torch.float64).to(device, torch.float32)
            for column in zip(*factors, strict=True)
        )
        return neg_step, bc2_sqrt

    def keep(self, index: torch.Tensor) -> None:
        idx = index.tolist()
        self.f64 = {name: [values[i] for i in idx] for name, values in self.f64.items()}
        self.consts = {name: c[index] for name, c in self.consts.items()}
        self.clipped = self.clipped[index]
        self.state = [[s[index] for s in states] for states in self.state]
        self.static_factors = None  # a captured step's buffers were [K]: its next GraphedStep makes new ones

    @staticmethod
    def _col(c: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return c.view(-1, *([1] * (like.dim() - 1)))  # [K] → [K, 1, …]

    @torch.no_grad()
    def step(self, params: Sequence[torch.Tensor]) -> None:
        grads = [p.grad for p in params]
        assert all(g is not None for g in grads)
        gs: list[torch.Tensor] = [g for g in grads if g is not None]
        # clip_grad_norm_: total = ‖(‖g_1‖, …, ‖g_P‖)‖ per member; g ← g·min(clip / (total + 1e-6), 1)
        norms = torch.stack([torch.linalg.vector_norm(_flat(g), 2.0, dim=1) for g in gs], 1)
        total = torch.linalg.vector_norm(norms, 2.0, dim=1)  # [K]
        # max_norm / tensor is Tensor.__rtruediv__: reciprocal, then a product (two roundings)
        coef = torch.clamp(torch.reciprocal(total + 1e-6) * self.consts["clip"], max=1.0)
        coef = torch.where(self.clipped, coef, torch.ones_like(coef))
        for g in gs:
            g.mul_(self._col(coef, g))
        self.step_count += 1
        c = self.consts
        if self.kind == "rmsprop":
            for p, g, sq in zip(params, gs, self.state[0], strict=True):
                col = partial(self._col, like=g)
                rmsprop_(p, g, sq, rho=col(c["rho"]), one_minus_rho=col(c["one_minus_rho"]),
                         eps=col(c["eps"]), neg_lr=col(c["neg_lr"]))  # fmt: skip
            return
        if self.static_factors is not None:
            neg_step, bc2_sqrt = self.static_factors
        else:
            neg_step, bc2_sqrt = self.adam_factors(self.step_count, gs[0].device)
        for p, g, m, v in zip(params, gs, self.state[0], self.state[1], strict=True):
            col = partial(self._col, like=g)
            adam_(p, g, m, v, one_minus_beta1=col(c["one_minus_beta1"]), beta2=col(c["beta2"]),
                  one_minus_beta2=col(c["one_minus_beta2"]), eps=col(c["eps"]), neg_step=col(neg_step),
                  bc2_sqrt=col(bc2_sqrt))  # fmt: skip


# ----- the bundle's members ------------------------------------------------------------------------


@dataclass
class _Data:
    """One seed's task and validation set, shared by the members with that seed."""

    task: Task
    val_split: Split


@dataclass
class _Member:
    index: int  # position in the caller's list
    config: TrainConfig
    result: TrialResult
    data: _Data
    model: SequenceModel  # its own model: initial weights, then evaluation and the result
    watch: Watch  # its course under the schedule's rules, as its solo run's
    done: bool = False


def train_fused(
    configs: Sequence[TrainConfig | Mapping[str, Any] | Resolved],
    report: FusedReport | None = None,
) -> list[TrialResult]:
    """Train K fusable configs as one model; result k is what `train(configs[k])` returns.

    `report(k, evaluation)` is called for member k's every evaluation, once. Raises ValueError when the
    configs can't share a bundle (see `fusable_key`) and ConfigError for an invalid config; training
    problems of one member make that member's result `failed` and leave the others running.

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

    bundles = [list(range(len(resolved)))]  # members to train together, by index
    while bundles:
        index = bundles.pop(0)
        groups: list[list[_Member]] = []
        try:
            groups = _layout_groups(_members(resolved, results, report_once, index))
        except Exception as exc:  # a bundle never takes its caller down
            _fail_unfinished([results[i] for i in index], [], exc, started)
        for group in groups:
            again = _run_or_split(group, started)
            if again:  # ran out of memory: its unfinished members train again from their start, in halves
                for i in again:
                    results[i] = TrialResult()
                bundles[:0] = [again[: len(again) // 2], again[len(again) // 2 :]]
    return results


def _run_or_split(group: list[_Member], started: float) -> list[int]:
    """Train `group`; the indices of its unfinished members when it ran out of memory with more than
    one of them left (to train again in two halves), else none."""
    try:
        _run(group, started)
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
    for i, r in enumerate(results):
        if r.status == "done" and not (i < len(done) and done[i]):
            fail(r, exc)
            r.seconds = time.perf_counter() - started


def _layout_groups(members: list[_Member]) -> list[list[_Member]]:
    """Members by the memory layout of their recurrent matrix, each group trained as one bundle.

    A GEMM rounds differently when an operand is stored transposed, and the orthogonal
    initialiser's W comes out of QR column-major while the others' are row-major: a member keeps
    its solo run's numbers only in a bundle whose W slices are laid out as its own.
    """
    groups: dict[tuple[tuple[int, ...], ...], list[_Member]] = {}
    for m in members:
        groups.setdefault(tuple(p.stride() for p in m.model.parameters()), []).append(m)
    return list(groups.values())


def _members(
    resolved: list[Resolved], results: list[TrialResult], report: FusedReport | None, index: list[int]
) -> list[_Member]:
    """Members `index`: each one's task (one per seed), model and schedule watch, as `train` makes them."""
    cfg = resolved[0].config  # shared fields only
    device = resolve_device(cfg.device)
    configure_process(device, cfg.threads, cfg.numerics)
    data: dict[int, _Data] = {}
    members = []
    for i in index:
        r, result = resolved[i], results[i]
        c = r.config
        started = time.perf_counter()
        try:
            if c.seed not in data:
                task = r.make_task()  # may read data files: a missing file fails this member only
                data[c.seed] = _Data(task, task.val_split())
            task = data[c.seed].task
            record_task(result, task)
            record_device(result, device)
            model = build_model(r, task).to(device)
            result.param_count = count_params(model)
        except Exception as exc:
            fail(result, exc)
            result.seconds = time.perf_counter() - started
            continue
        member_report = None if report is None else _reporter(report, i)
        members.append(_Member(i, c, result, data[c.seed], model, Watch(c, result, member_report)))
    return members


def _reporter(report: FusedReport, k: int) -> Callable[[Evaluation], Any]:
    return lambda evaluation: report(k, evaluation)


def trains_graphed(config: TrainConfig) -> bool:
    """Whether a bundle of this config replays its step as a CUDA graph (`cuda_graphs`, a graphable
    fused cell, a CUDA device that can capture)."""
    spec = FUSED_CELLS.get(config.cell)
    return (
        config.cuda_graphs
        and spec is not None
        and spec.graphable
        and graphs_available(resolve_device(config.device)) is None
    )


def steps_to_pace(config: TrainConfig) -> int:
    """Steps a bundle of this config takes before it trains at its steady pace: the first (its
    allocations), or, graphed, the eager warm-ups and the step that captures. A calibration times
    the steps after these (`service.planning.calibration`)."""
    return GRAPH_WARMUP + 1 if trains_graphed(config) else 1


def forward_backward(
    model: FusedModel, optimizer: FusedOptimizer, members: Sequence[tuple[int, Task]], batch: Batch
) -> torch.Tensor:
    """A bundle's training step but the cells' `after_step` hook: each member's forward (member k:
    (its seed, its task); `batch` holds each seed's (x, y)), its loss (the mean over its batch), the
    backward of their sum and the optimiser. The part of a step a CUDA graph captures
    (`trainers.graphs`). Returns the losses [K]."""
    outs = model.forward([batch[seed][0] for seed, _ in members])
    losses = torch.stack(
        [task.loss(o, batch[seed][1]) for (seed, task), o in zip(members, outs, strict=True)]
    )
    for p in model.params:
        p.grad = None
    losses.sum().backward()  # type: ignore[no-untyped-call]
    optimizer.step(model.params)
    return losses


class BundleSteps:
    """A bundle's training steps: each seed's next batch (`members`: member k's (seed, task), in the
    order of the stacked tensors' rows; members with one seed share its batches), then the step,
    eager or replayed as a CUDA graph (`graphed`: `trainers.graphs.GraphedStep`, the same numbers on
    an H100, docs/gpu.md). `train_fused` makes one again when members leave (the stacked tensors
    change shape); `trainers.bundle.Bundle` steps one for the benchmarks."""

    def __init__(
        self,
        model: FusedModel,
        optimizer: FusedOptimizer,
        members: Sequence[tuple[int, Task]],
        streams: Mapping[int, Iterator[Tensors]],
        cell: str,
        graphed: bool,
    ) -> None:
        self.model, self.optimizer = model, optimizer
        self.device = model.params[0].device
        self.members = list(members)
        self.tasks = dict(self.members)  # seed → task, in the order of first appearance
        self.streams = streams
        self.cell = cell
        self.size = len(self.members)
        self.graph = GraphedStep(self, warmup=GRAPH_WARMUP, fallback=True) if graphed else None
        self.captured = 0  # CUDA graphs captured by the graphs this stepper has closed

    def close(self) -> None:
        """Let a graph's memory go now (it and this object refer to each other)."""
        if self.graph is not None:
            self.captured += self.graph.captures
            self.graph.close()
            self.graph = None

    def next_batch(self) -> Batch:
        """Each seed's next training batch, encoded on the bundle's device."""
        return {seed: task.encode(next(self.streams[seed]), self.device) for seed, task in self.tasks.items()}

    def forward_backward(self, batch: Batch) -> torch.Tensor:
        return forward_backward(self.model, self.optimizer, self.members, batch)

    def step(self, batch: Batch | None = None) -> torch.Tensor:
        """One training step (on `batch`, else each seed's next); the losses [K]."""
        batch = batch if batch is not None else self.next_batch()
        if self.graph is not None:
            return self.graph.step(batch)
        losses = self.forward_backward(batch)
        self.model.after_step()
        return losses


def _steps(
    model: FusedModel,
    optimizer: FusedOptimizer,
    active: list[_Member],
    streams: Mapping[int, Iterator[Tensors]],
    graphed: bool,
) -> BundleSteps:
    members = [(m.config.seed, m.data.task) for m in active]
    return BundleSteps(model, optimizer, members, streams, active[0].config.cell, graphed)


def _run(members: list[_Member], started: float) -> None:
    """Train one bundle to the end of its schedule; its members' results record how it ran
    (`_record_execution`)."""
    if not members:
        return
    cfg = members[0].config  # shared fields only
    task = members[0].data.task
    device = next(members[0].model.parameters()).device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model = FusedModel([m.model for m in members], FUSED_CELLS[cfg.cell], task.output)
    optimizer = FusedOptimizer(cfg.optimizer, [m.config for m in members], model.params)
    schedule = Schedule.of(cfg, task.train_size)
    for m in members:
        m.result.budget_steps = schedule.budget

    # each seed's batch stream, as `train` draws it; members with one seed share its batches
    streams = {m.config.seed: training_batches(m.data.task, cfg.batch_size, m.config.seed) for m in members}
    active = members  # in the order of the stacked tensors' rows
    graphed = trains_graphed(cfg)
    stepper = _steps(model, optimizer, active, streams, graphed)
    captured = 0  # CUDA graphs captured by the steppers closed so far
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
            for m, train_loss in zip(active, train_losses, strict=True):
                m.done = not m.watch.check_training(step, train_loss)
            if due == "eval":
                scores = _validate(model, active)  # every row (one that just failed is ignored)
                running.zero_()
                n_running = 0
                for k, (m, train_loss, (val_loss, metric)) in enumerate(
                    zip(active, train_losses, scores, strict=True)
                ):
                    if m.done:
                        continue
                    evaluation = Evaluation.at(
                        step, schedule.steps_per_epoch, train_loss, val_loss, metric, started
                    )
                    if m.watch.evaluated(evaluation):
                        _leave(m, k, model)
            if any(m.done for m in active):  # members that failed or stopped early leave the bundle
                now = time.perf_counter() - started
                for m in active:
                    if m.done:
                        m.result.seconds = now
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
        _record_execution(members, device, captured + stepper.captured)


def _record_execution(members: list[_Member], device: torch.device, captured: int) -> None:
    """How a bundle ran, in each member's `provenance` (the same numbers either way; what a GPU run
    is checked by, docs/gpu.md): its members at the start, and on CUDA the graphs it captured and
    the peak memory the bundle's process allocated while it trained."""
    facts = {"bundle_members": str(len(members))}
    if device.type == "cuda":
        facts["cuda_graph_captures"] = str(captured)
        facts["cuda_peak_bytes"] = str(torch.cuda.max_memory_allocated(device))
    for m in members:
        if m.result.provenance is not None:
            m.result.provenance.update(facts)


#: bytes of recurrence buffers one validation pass may use (members are evaluated in chunks that fit)
EVAL_BUFFER_BYTES = 256 * 2**20


@torch.no_grad()
def _validate(model: FusedModel, members: list[_Member]) -> list[tuple[float, float | None]]:
    """Each member's (mean validation loss, mean metric) as the loop's `evaluate` computes it alone.

    The same batches of its own validation set go through the fused forward (each member's outputs
    are its solo model's, bit for bit), and its loss and metric are summed batch by batch in the same
    order. Members go in chunks whose buffers fit `EVAL_BUFFER_BYTES` (a large validation batch may
    leave one member per pass: then it costs what a solo evaluation costs).
    """
    cfg = members[0].config  # shared fields only
    device = model.params[0].device
    N = cfg.hidden
    n_val, batch_size = len(members[0].data.val_split), cfg.eval_batch_size
    sums = [ValidationSums() for _ in members]
    for start in range(0, n_val, batch_size):
        batch = {}  # per seed: members with one seed share a validation set
        for m in members:
            if m.config.seed not in batch:
                batch[m.config.seed] = m.data.task.encode(
                    m.data.val_split.take(slice(start, start + batch_size)), device
                )
        xs = [batch[m.config.seed][0] for m in members]
        T, b = xs[0].shape[0], xs[0].shape[1]
        stores = model.spec.stores  # e.g. xp and hs
        chunk = max(1, EVAL_BUFFER_BYTES // (stores * (T + 1) * b * N * xs[0].element_size()))
        for first in range(0, len(members), chunk):
            rows = slice(first, min(first + chunk, len(members)))
            outs = model.forward(xs[rows], rows, model.eval_workspace)
            for m, member_sums, out in zip(members[rows], sums[rows], outs, strict=True):
                member_sums.add(m.data.task, out, batch[m.config.seed][1], b)
    return [member_sums.means(m.data.task) for m, member_sums in zip(members, sums, strict=True)]


def _leave(m: _Member, k: int, model: FusedModel) -> None:
    """Member k leaves the bundle; one that is still `done` takes its trained weights (and their
    analyses) into its result, as its solo run does."""
    if m.result.status == "done":
        model.load_into(k, m.model)
        keep_network(m.result, m.model, m.config.cell_params.get("nonlinearity"))
    m.done = True
