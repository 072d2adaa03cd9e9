"""The projection: each full Orhan task grid's wall time at the paper's budget (no early stops), its
bundles one after another, eager and graphed, against one run at a time."""

from __future__ import annotations

import math
from typing import Any

from benchmarks.gpu_check.report import Report, Row
from benchmarks.gpu_check.shapes import Shape


def step_seconds(rows: list[Row], shape: str, mode: str, K: int) -> tuple[float | None, str]:
    """Seconds per step of a K-member bundle: measured, or per-member time of the largest measured
    bundle × K (a bundle's time per member falls as it grows, so this errs long)."""
    measured = [
        r for r in rows if r.shape == shape and r.cell == "rnn" and r.mode == mode and r.ms_step is not None
    ]
    exact = [r for r in measured if r.K == K]
    if exact:
        return exact[0].ms_step / 1e3, "measured"  # type: ignore[operator]
    if not measured:
        return None, "not measured"
    big = max(measured, key=lambda r: r.K)
    return big.ms_step / big.K * K / 1e3, f"from K={big.K}"  # type: ignore[operator]


def project(report: Report, shape_list: list[Shape]) -> None:
    """One entry per rnn shape (one bundle per model of the grid) into `report.projection`."""
    for shape in shape_list:
        if shape.cell != "rnn":
            continue
        sizes = list(shape.space.size_per_model().values())
        entry: dict[str, Any] = {
            "task": shape.name,
            "runs": sum(sizes),
            "bundles": sizes,
            "budget_steps": shape.budget,
        }
        for mode in ("eager", "graph"):
            total, sources = 0.0, set()
            for K in sizes:
                sec, src = step_seconds(report.rows, shape.name, mode, K)
                sources.add(src)
                if sec is None:
                    total = math.nan
                    break
                total += sec
            entry[f"{mode}_hours"] = total * shape.budget / 3600
            entry[f"{mode}_from"] = ", ".join(sorted(sources))
        solo = [
            r for r in report.rows if r.shape == shape.name and r.mode == "solo" and r.ms_step is not None
        ]
        entry["solo_hours"] = solo[0].ms_step / 1e3 * shape.budget * sum(sizes) / 3600 if solo else math.nan  # type: ignore[operator]
        report.projection.append(entry)
