"""Checks 1e and 1f: each fused cell's step as a CUDA graph (`trainers.fused.GraphedStep`) against its
eager step, and whole `train_fused` runs with `cuda_graphs` against without. A cell whose step
synchronises with the host (FastRNN's backward read its gates there until issue 37; a plugin's cell may)
is reported as refused, not failed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from benchmarks.gpu_check.budget import Clock
from benchmarks.gpu_check.device import free, run_steps
from benchmarks.gpu_check.judge import GRAPH_RTOL, Check, failed, judged
from benchmarks.gpu_check.members import VARIANTS, course, member_configs
from benchmarks.gpu_check.report import Report
from trainers.fused import FUSED_CELLS, Bundle, train_fused
from trainers.fused.graphs import GraphedStep, GraphUnsupported, graphs_available


def check_graphs(report: Report, device: torch.device, quick: bool, clock: Clock) -> None:
    """Per fused cell, 12 steps eager and 12 graphed from the same start: every member's losses and
    parameters (GRAPH_RTOL). Off CUDA, the helper must refuse clearly."""
    section = "graphed step vs eager step"
    reason = graphs_available(device)
    if reason is not None:
        try:
            GraphedStep(Bundle.of(member_configs("rnn", "copy", device, quick)[:1]))
            report.add(Check(section, "refusal", "FAIL", note="GraphedStep did not refuse a bundle off CUDA"))
        except GraphUnsupported as exc:
            report.add(Check(section, "all cells", "refused", note=f"as expected here: {exc}"))
        return
    steps = 12
    for cell in sorted(FUSED_CELLS):
        for variant in VARIANTS:
            configs = member_configs(cell, variant, device, quick)
            if cell == "rnn":  # one layout per bundle (train_fused trains the orthogonal W's own bundle)
                configs = [c for c in configs if c["cell_params"].get("init") != "orthogonal"]
            name = f"{cell} {variant} ({len(configs)} members, {steps} steps)"
            if clock.left() < 0:
                report.add(Check(section, name, "skipped", note="over the time budget (--budget-s)"))
                continue
            try:
                eager = Bundle.of(configs)
                _, eager_losses = run_steps(eager.step, steps, device)
                graphed = GraphedStep(Bundle.of(configs))
                _, graph_losses = run_steps(graphed.step, steps, device)
                pairs = [(graph_losses, eager_losses)]
                pairs += list(zip(graphed.bundle.model.params, eager.model.params, strict=True))
                report.add(judged(section, name, pairs, GRAPH_RTOL))
            except GraphUnsupported as exc:
                report.add(Check(section, name, "refused", note=str(exc)[:300]))
            except Exception as exc:
                report.add(failed(section, name, exc, limit=300))
            finally:
                free(device)


def check_fused_graphs(report: Report, device: torch.device, quick: bool) -> None:
    """`train_fused` with `cuda_graphs` (a GPU's default) against `train_fused` without, per graphed
    cell: whole runs with evaluations, partial batches (copy: 10 of 12 and one of 8 an epoch; each
    starts the graph over), a member leaving at its first evaluation (the graph is made again for
    the others) and Adam's factors in device buffers. Every member's course, GRAPH_RTOL."""
    section = f"train_fused graphed vs eager ({device.type})"
    reason = graphs_available(device)
    if reason is not None:
        report.add(Check(section, "all graphed cells", "refused", note=f"as expected here: {reason}"))
        return
    with counted_captures() as captures:
        for cell in sorted(c for c, spec in FUSED_CELLS.items() if spec.graphable):
            for variant in VARIANTS:
                configs = member_configs(cell, variant, device, quick)
                configs[1] = {**configs[1], "early_stop_loss": 1e6}  # leaves at its first evaluation
                name = f"{cell} {variant} ({len(configs)} members, {configs[0]['steps']} steps, one leaves)"
                try:
                    report.add(graphed_against_eager(section, name, configs, captures))
                except Exception as exc:
                    report.add(failed(section, name, exc, limit=300))
                finally:
                    free(device)


def graphed_against_eager(
    section: str, name: str, configs: list[dict[str, Any]], captures: list[int]
) -> Check:
    """One bundle trained by `train_fused` eagerly, then graphed: every member's course, and that the
    graphed run captured at least one graph (`captures`: the bundle size of each capture)."""
    eager = train_fused([{**c, "cuda_graphs": False} for c in configs])
    del captures[:]
    graphed = train_fused([{**c, "cuda_graphs": True} for c in configs])
    pairs, bad = [], []
    for e, g in zip(eager, graphed, strict=True):
        if (e.status, e.steps, len(e.history)) != (g.status, g.steps, len(g.history)):
            bad.append(f"{g.status}/{e.status} after {g.steps}/{e.steps} steps {g.reason or ''}"[:120])
        else:
            pairs += list(zip(course(g), course(e), strict=True))
    check = judged(section, name, pairs, GRAPH_RTOL)
    if bad:
        check.status, check.note = "FAIL", "; ".join(bad)
    elif not captures:
        check.status, check.note = "FAIL", "no graph was captured: the loop ran eagerly"
    else:
        check.note = f"{check.note} {len(captures)} captures (bundle sizes {sorted(set(captures))})".strip()
    return check


@contextmanager
def counted_captures() -> Iterator[list[int]]:
    """Every `GraphedStep` capture while inside, as the bundle size it captured."""
    captures: list[int] = []
    real_capture = GraphedStep._capture

    def counting(self: GraphedStep, inputs: Any) -> None:
        real_capture(self, inputs)
        captures.append(self.bundle.size)

    GraphedStep._capture = counting  # type: ignore[method-assign]
    try:
        yield captures
    finally:
        GraphedStep._capture = real_capture  # type: ignore[method-assign]
