"""The paper's panels as PNG files. matplotlib is imported inside each function, never by `import trainers`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainers.analysis.decoding import Decoding
from trainers.analysis.fisher import FisherMemory
from trainers.analysis.profile import ProfileStats


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def plot_fisher(curves: Mapping[str, FisherMemory], path: str, k_max: int | None = None) -> None:
    """Fig. 1b–c: memory curves J(k) and transient amplification ‖Wᵏv‖², one line per network, k ≤ k_max."""
    plt = _pyplot()
    fig, (ax_j, ax_a) = plt.subplots(1, 2, figsize=(9, 3.5))
    for name, fm in curves.items():
        ks = range(len(fm.j))
        ax_j.plot(ks, fm.j, label=f"{name} (J_tot = {fm.j_tot:.3g})")
        ax_a.plot(ks, fm.amplification, label=name)
    ax_j.set(xlabel="k (steps in the past)", ylabel="J(k)", title="Fisher memory curve (eq. 3)")
    ax_a.set(xlabel="k", ylabel="‖Wᵏv‖²", yscale="log", title="transient amplification")
    if k_max is not None:
        ax_j.set_xlim(0, k_max)
        ax_a.set_xlim(0, k_max)
    ax_j.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_decoding(results: Mapping[str, Decoding], path: str) -> None:
    """Fig. 2: decoded against true s_1, one panel per network, in-sample R² in the title."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 4), squeeze=False)
    for ax, (name, d) in zip(axes[0], results.items(), strict=True):
        ax.scatter(d.target.tolist(), d.prediction.tolist(), s=6)
        lo, hi = float(d.target.min()), float(d.target.max())
        ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8)
        ax.set(xlabel="s_1", ylabel="decoded s_1")
        ax.set_title(f"{name}\nR² = {d.r2:.3f} (held out {d.r2_heldout:.3f})", fontsize=10)
    fig.suptitle(f"{d.nonlinearity}, σ = {d.sigma}, {d.trials} trials, h_{d.steps}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_profile(stats: ProfileStats, path: str, title: str = "") -> None:
    """Fig. 5–6: mean W_ij against the order difference i − j, with the standard error shaded."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.plot(stats.offsets, stats.mean)
    if stats.sem is not None:
        lo = [m - s for m, s in zip(stats.mean, stats.sem, strict=True)]
        hi = [m + s for m, s in zip(stats.mean, stats.sem, strict=True)]
        ax.fill_between(stats.offsets, lo, hi, alpha=0.3)
    ax.axvline(0, color="grey", lw=0.5)
    ax.set(xlabel="i − j (order difference)", ylabel="mean W_ij", title=title or f"{stats.count} network(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
