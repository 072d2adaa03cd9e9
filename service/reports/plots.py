"""Figures for a study's parent run (matplotlib, Agg): success counts (Orhan Fig. 3d-f) and the best
configuration's validation curve with its standard error over seeds (Fig. 3a-c).

Each figure is its own `matplotlib.figure.Figure`, never pyplot's: studies and requests draw in
threads at once, and pyplot's figure manager and current figure are global and not thread-safe; nor
does importing this switch the process's backend."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure

from trainers.criterion import Criterion


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")  # Agg, as any Figure saved as png
    return buf.getvalue()


def success_bars(table: dict[str, Any], title: str) -> bytes:
    """Successful runs per model with their Wilson intervals, as a PNG (`success_figure`)."""
    return _png(success_figure(table, title))


def success_figure(table: dict[str, Any], title: str) -> Figure:
    """Successful runs per model, each bar's count of its finished runs written over its error bar (on
    the bar's top it sat under the bar, and a count of 0 on the axis)."""
    models = list(table["by_model"])
    counts = [table["by_model"][m]["succeeded"] for m in models]
    totals = [table["by_model"][m]["finished"] for m in models]  # the rate's runs
    # error bars from the Wilson interval; max(0, …) absorbs rounding at k = 0 and k = n
    lo = [
        max(0.0, c - n * table["by_model"][m]["ci95"][0])
        for m, c, n in zip(models, counts, totals, strict=True)
    ]
    hi = [
        max(0.0, n * table["by_model"][m]["ci95"][1] - c)
        for m, c, n in zip(models, counts, totals, strict=True)
    ]
    fig = Figure(figsize=(1.2 + 1.1 * len(models), 3.2))
    ax = fig.subplots()
    ax.bar(models, counts, yerr=[lo, hi], capsize=4, color="#4c72b0")
    for i, (c, n, top) in enumerate(zip(counts, totals, hi, strict=True)):  # above the error bar, not on it
        ax.annotate(f"{c}/{n}", (i, c + top), textcoords="offset points", xytext=(0, 3), ha="center",
                    va="bottom", fontsize=8)  # fmt: skip
    highest = max((c + top for c, top in zip(counts, hi, strict=True)), default=0.0)
    ax.set_ylim(0, max(1.0, highest) * 1.15)  # room for the labels over the highest bar
    ax.set_ylabel("successful runs (95 % Wilson CI)")
    ax.set_title(title, fontsize=9)
    return fig


def best_curves(
    curves: dict[str, list[dict[str, float]]], baseline: float | None, threshold: float | None, title: str
) -> bytes:
    fig = Figure(figsize=(5.5, 3.4))
    ax = fig.subplots()
    for label, curve in curves.items():
        if not curve:
            continue
        steps = [p["step"] for p in curve]
        mean = [p["mean"] for p in curve]
        sem = [p["sem"] for p in curve]
        ax.plot(steps, mean, label=label)
        ax.fill_between(
            steps,
            [m - s for m, s in zip(mean, sem, strict=True)],
            [m + s for m, s in zip(mean, sem, strict=True)],
            alpha=0.25,
        )
    if baseline is not None:
        ax.axhline(baseline, ls="--", color="gray", lw=1, label="random baseline")
    if threshold is not None:
        ax.axhline(threshold, ls=":", color="black", lw=1, label="success criterion")
    ax.set_xlabel("training step")
    ax.set_ylabel("validation loss (mean ± s.e.m. over seeds)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return _png(fig)


def weight_profiles(table: dict[str, dict[str, Any]], title: str) -> bytes:
    """Mean W_ij against i − j (units ordered by peak time) with s.e.m. bands, one line per model."""
    fig = Figure(figsize=(5.5, 3.4))
    ax = fig.subplots()
    for model, p in table.items():
        lo = [m - s for m, s in zip(p["mean"], p["sem"], strict=True)]
        hi = [m + s for m, s in zip(p["mean"], p["sem"], strict=True)]
        ax.plot(p["offsets"], p["mean"], label=f"{model} (n={p['n']})")
        ax.fill_between(p["offsets"], lo, hi, alpha=0.25)
    ax.axvline(0, color="gray", lw=0.5)
    ax.set_xlim(-20, 20)
    ax.set_xlabel("i − j (order by peak time)")
    ax.set_ylabel("mean recurrent weight W_ij")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return _png(fig)


def loss_vs_scale(table: dict[str, list[dict[str, float]]], title: str) -> bytes:
    """Final validation loss against the initialiser's scale, mean ± s.e.m., one panel line per model."""
    fig = Figure(figsize=(5.5, 3.4))
    ax = fig.subplots()
    for model, rows in table.items():
        ax.errorbar([r["scale"] for r in rows], [r["mean"] for r in rows], yerr=[r["sem"] for r in rows],
                    marker="o", capsize=3, label=model)  # fmt: skip
    ax.set_xlabel("initialiser scale (α, β or λ)")
    ax.set_ylabel("final validation loss")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return _png(fig)


def success_budget(table: dict[str, Any], title: str) -> bytes:
    """Successful runs per model against training steps, with 95 % Wilson bands."""
    fig = Figure(figsize=(5.5, 3.4))
    ax = fig.subplots()
    for model, rows in table["by_model"].items():
        steps = [r["step"] for r in rows]
        ax.plot(steps, [r["succeeded"] for r in rows], marker=".", label=model)
        ax.fill_between(
            steps,
            [r["ci95"][0] * r["finished"] for r in rows],
            [r["ci95"][1] * r["finished"] for r in rows],
            alpha=0.2,
        )
    ax.set_xlabel("training steps (budget)")
    ax.set_ylabel("successful runs (95 % Wilson CI)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return _png(fig)


def study_figures(trials: Sequence[Any], summary: dict[str, Any], criterion: Criterion) -> dict[str, bytes]:
    """The parent run's figures of a study (file name → PNG): successful runs per model (at the end and
    against budget), the best configuration's curve per model, the weight profiles of successful
    runs, loss against scale."""
    from service.reports.summary import loss_by_scale, mean_curve, profile_table

    figures = {
        "success_per_model.png": success_bars(
            summary["success"], f"study {summary['name']}: successful runs per model ({criterion.name})"
        )
    }
    if summary["success_vs_budget"]["steps"]:
        figures["success_vs_budget.png"] = success_budget(
            summary["success_vs_budget"], f"successful runs against budget ({criterion.name})"
        )
    curves = {}
    baseline = threshold = None
    for model, rows in summary["best_per_model"].items():
        if rows:
            members = [t for t in trials if t.config_hash in set(rows[0]["config_hashes"])]
            label = f"{model} " + " ".join(f"{k}={v}" for k, v in rows[0]["params"].items())
            curves[label] = mean_curve(members)
            if members:
                baseline = baseline or members[0].baseline_loss
                threshold = threshold or criterion.threshold_for(
                    members[0].baseline_loss, members[0].reference_baselines
                )
    if curves:
        figures["best_config_curves.png"] = best_curves(
            curves, baseline, threshold, "best configuration per model"
        )
    profiles = profile_table(trials, criterion)
    if profiles:
        figures["weight_profiles.png"] = weight_profiles(
            profiles, "weight profiles of successful runs (Figs. 5-6)"
        )
    baseline_of = next((t.baseline_loss for t in trials if t.baseline_loss), None)
    by_scale = loss_by_scale(trials, below=baseline_of)
    if by_scale:
        figures["loss_vs_scale.png"] = loss_vs_scale(
            by_scale, "final validation loss vs initialiser scale (Fig. 9)"
        )
    return figures


def comparison_rates(comparison: dict[str, Any]) -> bytes:
    """Success rates of compared studies side by side, one marker per study in each group, with their
    95 % Wilson intervals (`service.reports.compare.compare_studies`)."""
    rows = [r for r in comparison["rows"] if r["scope"] == "group"]
    names = {
        s["study_id"]: f"{s['name']} [{s['study_id']}] ({s['criterion']['name']})"
        for s in comparison["studies"]
    }
    groups = list(dict.fromkeys(_group_label(r["group"]) for r in rows))
    width = 0.8 / max(len(names), 1)
    fig = Figure(figsize=(min(2.0 + 0.9 * len(groups) * max(len(names), 1) ** 0.5, 16.0), 3.6))
    ax = fig.subplots()
    for i, (study_id, label) in enumerate(names.items()):
        mine = {_group_label(r["group"]): r for r in rows if r["study_id"] == study_id}
        shown = [
            (g, name) for g, name in enumerate(groups) if name in mine and mine[name]["rate"] is not None
        ]
        xs = [g + (i - (len(names) - 1) / 2) * width for g, _ in shown]  # a cell with no finished run: none
        cells = [mine[name] for _, name in shown]
        rates = [c["rate"] for c in cells]
        lo = [max(0.0, c["rate"] - c["ci95"][0]) for c in cells]
        hi = [max(0.0, c["ci95"][1] - c["rate"]) for c in cells]
        ax.errorbar(xs, rates, yerr=[lo, hi], fmt="o", capsize=4, label=label)
        for x, c in zip(xs, cells, strict=True):
            ax.annotate(f"{c['succeeded']}/{c['finished']}", (x, c["rate"]), textcoords="offset points",
                        xytext=(4, 3), fontsize=6)  # fmt: skip
    ax.set_xticks(range(len(groups)), groups, rotation=30 if len(groups) > 4 else 0, ha="right", fontsize=7)
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel("success rate (95 % Wilson CI)")
    when = f" at {comparison['at_step']:,} steps" if comparison.get("at_step") else ""
    ax.set_title(f"successful runs{when}, by {', '.join(comparison['by'])}", fontsize=9)
    ax.legend(fontsize=7)
    return _png(fig)


def _group_label(group: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in group.items())
