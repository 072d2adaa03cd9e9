"""The report: the timed rows, the checks and the notes as the run makes them, and the two files it
writes (gpu_check.md, the tables; gpu_check.json, every number), whose layout the kept results share."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.gpu_check.judge import Check

STATUSES = ("pass", "chaotic", "refused", "skipped", "FAIL")


@dataclass
class Row:
    shape: str
    cell: str
    mode: str  # solo | native | eager | graph | loop-eager | loop-graph
    K: int
    dims: str = ""
    ms_step: float | None = None  # median ms per bundle step (None: not measured)
    ms_min: float | None = None
    steps: int = 0
    note: str = ""
    peak_gib: float | None = None  # the device's peak allocated memory over the bundle's set-up and steps

    @property
    def ms_member(self) -> float | None:
        return None if self.ms_step is None else self.ms_step / self.K

    @property
    def member_steps_per_s(self) -> float | None:
        return None if self.ms_step is None else 1000.0 * self.K / self.ms_step


@dataclass
class Report:
    env: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    projection: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, check: Check) -> None:
        self.checks.append(check)
        dev = ""
        if check.max_abs is not None:
            dev = f"  max abs {check.max_abs:.3g}, max rel {check.max_rel:.3g}"
            dev += f" (tol {check.tol:g})" if check.tol is not None else ""
        print(
            f"  [{check.status:>7}] {check.section}: {check.name}{dev}{'  ' + check.note if check.note else ''}"
        )

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"  note: {text}")

    @property
    def passed(self) -> bool:
        return all(c.ok for c in self.checks)


def fmt(v: float | None, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return f"{v:,.{digits}f}"


def tables(report: Report) -> str:
    """gpu_check.md: the header, then the timing, projection and correctness tables."""
    lines = header(report.env, report.notes) + timing_table(report.rows)
    lines += projection_table(report.projection, report.env) + correctness_table(report.checks)
    return "\n".join(lines) + "\n"


def header(env: dict[str, Any], notes: list[str]) -> list[str]:
    lines = ["## memsweep GPU check (benchmarks/gpu_check)", ""]
    card = env.get("card", env.get("cpu"))
    lines.append(
        f"Device: {env.get('device')} — {card}; driver {env.get('driver', '–')}; CUDA {env.get('cuda', '–')}; "
        f"cuDNN {env.get('cudnn', '–')}; torch {env.get('torch')}; Python {env.get('python')}; "
        f"TF32 matmul {env.get('tf32_matmul', '–')}, cuDNN {env.get('tf32_cudnn', '–')}; {env.get('date')}"
    )
    lines.append(f"Settings: {env.get('settings')}")
    return lines + [f"Note: {n}" for n in notes]


def timing_table(rows: list[Row]) -> list[str]:
    lines = ["", "### Timing: ms per training step (median of the timed steps)", ""]
    lines.append(
        "| shape | dims | cell | mode | K | ms / bundle step | ms / member-step | member-steps / s | peak GiB | note |"
    )
    lines.append("|---|---|---|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        lines.append(
            f"| {r.shape} | {r.dims} | {r.cell} | {r.mode} | {r.K} | {fmt(r.ms_step)} | {fmt(r.ms_member, 3)} | "
            f"{fmt(r.member_steps_per_s, 0)} | {fmt(r.peak_gib, 2)} | {r.note} |"
        )
    return lines


def projection_table(projection: list[dict[str, Any]], env: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"### Projection: each full Orhan task grid at the paper's budget, one {env.get('device')}",
        "",
    ]
    if (env.get("settings") or {}).get("quick"):
        lines += ["Quick run: the timed shapes are tiny, so these hours are no projection of the grids.", ""]
    lines.append(
        "| task | runs | bundles | steps a run | eager (h) | graphed (h) | one run at a time (h) | from |"
    )
    lines.append("|---|---:|---|---:|---:|---:|---:|---|")
    totals = {"eager": 0.0, "graph": 0.0, "solo": 0.0}
    for p in projection:
        for k in totals:
            totals[k] += p[f"{k}_hours"]
        lines.append(
            f"| {p['task']} | {p['runs']:,} | {' + '.join(map(str, p['bundles']))} | {p['budget_steps']:,} | "
            f"{fmt(p['eager_hours'], 1)} | {fmt(p['graph_hours'], 1)} | {fmt(p['solo_hours'], 0)} | "
            f"eager {p['eager_from']}; graph {p['graph_from']} |"
        )
    lines.append(
        f"| all three | {sum(p['runs'] for p in projection):,} | | | {fmt(totals['eager'], 1)} | "
        f"{fmt(totals['graph'], 1)} | {fmt(totals['solo'], 0)} | goal: ≤ 12 h |"
    )
    return [
        *lines,
        "",
        "Projection: the bundle's measured step time × the paper's budget (no early stops: an upper bound"
        " for the grid), bundles one after another; a bundle size not measured takes the per-member time of"
        " the largest measured bundle (which errs long).",
    ]


def correctness_table(checks: list[Check]) -> list[str]:
    lines = [
        "",
        "### Correctness",
        "",
        "| section | check | status | max abs | max rel | tol | note |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for c in checks:
        max_abs = (
            fmt(c.max_abs, 0) if c.max_abs == 0 else (f"{c.max_abs:.2e}" if c.max_abs is not None else "–")
        )
        max_rel = f"{c.max_rel:.2e}" if c.max_rel is not None else "–"
        lines.append(
            f"| {c.section} | {c.name} | {c.status} | {max_abs} | {max_rel} | {c.tol if c.tol is not None else '–'} | {c.note} |"
        )
    counts = {s: sum(c.status == s for c in checks) for s in STATUSES}
    return [
        *lines,
        "",
        f"Correctness: {counts['pass']} passed, {counts['chaotic']} chaotic (float32 rounding amplified by the "
        f"point's training, on the CPU as here), {counts['refused']} refused, {counts['skipped']} skipped, "
        f"{counts['FAIL']} FAILED.",
    ]


def write(report: Report, out: Path | None, text: str) -> None:
    """gpu_check.json and gpu_check.md into `out` (nothing when None)."""
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "env": report.env,
        "checks": [{**asdict(c), "ok": c.ok} for c in report.checks],
        "rows": [
            {**asdict(r), "ms_member": r.ms_member, "member_steps_per_s": r.member_steps_per_s}
            for r in report.rows
        ],
        "projection": report.projection,
        "notes": report.notes,
        "passed": report.passed,
    }
    (out / "gpu_check.json").write_text(json.dumps(data, indent=1, default=str, allow_nan=True))
    (out / "gpu_check.md").write_text(text)
