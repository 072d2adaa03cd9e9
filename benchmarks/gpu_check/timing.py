"""Timing 2: ms per training step of a solo run and of bundles of K of a grid's points, eagerly and as
CUDA graphs, each synchronised (median of the timed steps); the graphed and eager runs of one bundle
take the same steps from the same start, so they are compared too, as is member 0 with the solo run."""

from __future__ import annotations

import itertools
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.gpu_check.budget import CostModel, Plan
from benchmarks.gpu_check.device import free, run_steps, sync
from benchmarks.gpu_check.judge import GRAPH_RTOL, MEMBER_RTOL, judged
from benchmarks.gpu_check.report import Report, Row, fmt
from benchmarks.gpu_check.shapes import Shape
from trainers.config import resolve
from trainers.fused import Bundle, train_fused
from trainers.fused.graphs import GRAPH_WARMUP, GraphedStep, GraphUnsupported, graphs_available
from trainers.loop import Solo


def solo_step(config: dict[str, Any]) -> tuple[Callable[[], torch.Tensor], list[torch.Tensor]]:
    """A solo run's training step as `train` runs it (`trainers.loop.Solo`, the loop's own); its parameters."""
    solo = Solo.of(config)
    steps = itertools.count(1)

    def step() -> torch.Tensor:
        return solo.step(next(steps)).reshape(1)

    return step, list(solo.model.parameters())


@dataclass
class Stepped:
    """What a timed run leaves to compare: its configs, losses [steps, K] and final parameters."""

    configs: list[dict[str, Any]]
    losses: torch.Tensor
    params: list[torch.Tensor]


@dataclass
class ShapeTiming:
    """One shape's rows and comparisons, as `time_shape` runs them."""

    report: Report
    shape: Shape
    plan: Plan
    device: torch.device

    @property
    def label(self) -> str:
        return f"{self.shape.name} {self.shape.cell}"

    def add_row(self, mode: str, K: int, **fields: Any) -> Row:
        row = Row(self.shape.name, self.shape.cell, mode, K, self.shape.dims, **fields)
        self.report.rows.append(row)
        return row

    def record(self, mode: str, K: int, times: list[float], note: str = "") -> Row:
        timed = [t * 1e3 for t in times[self.plan.warm :]]
        row = self.add_row(
            mode, K, ms_step=statistics.median(timed), ms_min=min(timed), steps=len(timed), note=note
        )
        print(
            f"  {self.label:<20}{mode:<6} K={K:<4} {fmt(row.ms_step):>9} ms/step  {fmt(row.ms_member, 3):>8} ms/member-step"
        )
        return row

    def solo(self) -> Stepped | None:
        """The solo run of the shape's first point; then cuDNN's RNN solo where its nonlinearity has one."""
        config = self.shape.configs(1)[0]
        ran = None
        try:
            step, params = solo_step(config)
            times, losses = run_steps(step, self.plan.total, self.device)
            self.record("solo", 1, times)
            ran = Stepped([config], losses, params)
        except Exception as exc:
            self.add_row("solo", 1, note=f"failed: {type(exc).__name__}: {str(exc)[:200]}")
        free(self.device)
        if resolve(config).config.cell_params.get("nonlinearity") in ("relu", "tanh"):
            native = {**config, "cell_params": {**config["cell_params"], "backend": "native"}}
            try:  # cuDNN's RNN: an option (backend=native), not the default (trainers/kernels.py)
                times = run_steps(solo_step(native)[0], self.plan.total, self.device)[0]
                self.record("native", 1, times, note="torch's RNN kernel")
            except Exception as exc:
                self.add_row("native", 1, note=f"failed: {type(exc).__name__}: {str(exc)[:200]}")
            free(self.device)
        return ran

    def bundle(self, mode: str, K: int, cost: CostModel) -> Stepped | None:
        """K members stepped eagerly or graphed: a row (and the cost model told), or a row saying why not."""
        bundle: Bundle | None = None
        runner: Callable[[], torch.Tensor] | None = None
        try:
            started = time.perf_counter()
            configs = self.shape.configs(K)
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
            bundle = Bundle.of(configs)
            cost.set_up(K, time.perf_counter() - started)
            warmup = min(GRAPH_WARMUP, self.plan.warm - 1) or 1
            runner = bundle.step if mode == "eager" else GraphedStep(bundle, warmup=warmup).step
            times, losses = run_steps(runner, self.plan.total, self.device)
            row = self.record(mode, K, times)
            if self.device.type == "cuda":  # what packing's `member_bytes` model is to be checked against
                row.peak_gib = torch.cuda.max_memory_allocated(self.device) / 2**30
            cost.stepped(mode, row.ms_member)
            return Stepped(configs, losses, [p.detach().clone() for p in bundle.model.params])
        except GraphUnsupported as exc:
            self.add_row(mode, K, note=f"refused: {str(exc)[:200]}")
        except torch.cuda.OutOfMemoryError as exc:
            self.add_row(mode, K, note=f"out of memory: {str(exc)[:120]}")
        except Exception as exc:
            traceback.print_exc()
            self.add_row(mode, K, note=f"failed: {type(exc).__name__}: {str(exc)[:200]}")
        finally:
            bundle = runner = None  # the bundle's buffers and the graph's pool go back
            free(self.device)
        return None

    def member_vs_solo(self, K: int, eager: Stepped, solo: Stepped) -> None:
        pairs = [(eager.losses[:, 0], solo.losses[:, 0])]
        pairs += [(p[0], q) for p, q in zip(eager.params, solo.params, strict=True)]
        name = f"{self.label} K={K} member 0, {self.plan.total} steps"
        self.report.add(judged("bundle member vs solo run (Orhan shape)", name, pairs, MEMBER_RTOL))

    def graph_vs_eager(self, K: int, graph: Stepped, eager: Stepped) -> None:
        pairs = [(graph.losses, eager.losses), *zip(graph.params, eager.params, strict=True)]
        name = f"{self.label} K={K}, every member, {self.plan.total} steps"
        self.report.add(judged("graphed step vs eager step (Orhan shape)", name, pairs, GRAPH_RTOL))


def time_shape(report: Report, shape: Shape, plan: Plan, device: torch.device, deadline: float) -> None:
    """Solo, then each K eagerly and graphed, while the predicted cost fits before `deadline`."""
    timing = ShapeTiming(report, shape, plan, device)
    solo = timing.solo() if shape.cell == "rnn" else None
    cost = CostModel()
    graph_reason = graphs_available(device)
    for K in plan.ks:
        eager: Stepped | None = None
        for mode in ("eager", "graph"):
            if mode == "graph" and graph_reason is not None:
                timing.add_row(mode, K, note=f"n/a: {graph_reason.split(';')[0]}")
                continue
            predicted = cost.predict(mode, K, plan.total)
            left = deadline - time.perf_counter()
            if predicted >= left:
                timing.add_row(
                    mode, K, note=f"skipped: ~{predicted:.0f} s predicted, {max(left, 0):.0f} s left"
                )
                continue
            ran = timing.bundle(mode, K, cost)
            if ran is None:
                continue
            if mode == "eager":
                eager = ran
                if solo is not None and ran.configs[0] == solo.configs[0]:  # member 0 ran solo
                    timing.member_vs_solo(K, ran, solo)
            elif eager is not None:
                timing.graph_vs_eager(K, ran, eager)


def time_fused_loop(report: Report, shape: Shape, K: int, device: torch.device) -> None:
    """The whole `train_fused` loop (batches, step, after_step, bookkeeping), eager against graphed:
    ms a step from two runs of different lengths (their difference cancels the set-up)."""
    configs = shape.configs(K)
    short, long = 8, 24
    for graphed in (False, True):
        mode = "loop-graph" if graphed else "loop-eager"
        seconds = []
        try:
            for steps in (short, long):
                run = [{**c, "steps": steps, "eval_every": steps, "cuda_graphs": graphed} for c in configs]
                sync(device)
                started = time.perf_counter()
                results = train_fused(run)
                sync(device)
                seconds.append(time.perf_counter() - started)
                if any(r.status != "done" or r.steps != steps for r in results):
                    raise RuntimeError(f"a member ended early: {results[0].status} {results[0].reason}")
            ms = (seconds[1] - seconds[0]) / (long - short) * 1e3
            row = Row(shape.name, shape.cell, mode, K, shape.dims, ms_step=ms, ms_min=ms, steps=long - short)
            row.note = f"train_fused, {long} − {short} steps"
            report.rows.append(row)
            print(f"  {shape.name:<12}{mode:<11} K={K:<4} {fmt(ms):>9} ms/step (train_fused)")
        except Exception as exc:
            report.rows.append(Row(shape.name, shape.cell, mode, K, shape.dims, note=f"failed: {exc}"[:200]))
        free(device)
