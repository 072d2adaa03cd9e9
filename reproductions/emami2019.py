"""Emami et al. (NeurIPS 2019), §5, reduced: students of a contractive teacher, through memsweep's engine.

A random contractive ReLU RNN with n_true = 4 states (the teacher) maps 2 noisy inputs to 2 outputs over
T = 1,000 steps; students — an RNN (relu, orthogonal init), a URNN (the same RNN projected onto the
orthogonal group after every batch) and an LSTM — of n ∈ {2, 4, …, 14} states learn that map under the
paper's protocol (docs/protocol.md §3: MSE, tf.keras' Adam at lr 0.01, batch 10, epochs of 70 updates,
validation on the 300 test sequences each epoch). The paper plots, per student and n, the test R²
against the optimal R² at the noise level (Fig. 2: dense Gaussian input at 20 dB; Fig. 3: sparse input at
15 dB) and reads three things off the curves: the RNN reaches the optimal R² only from n ≥ 8 (twice
n_true); a URNN needs about 2n states to match an RNN with n; the LSTM is close to the URNN. This script
runs that sweep as one study and writes a Markdown report and the figure:

    python reproductions/emami2019.py                      # Fig. 2, reduced (see the report for its time)
    python reproductions/emami2019.py --figure 3           # Fig. 3's setting
    python reproductions/emami2019.py --quick              # a smoke run: 2 sizes, 1 teacher, 3 epochs
    python reproductions/emami2019.py --teachers 30 --epochs 100   # the paper's sweep (about 30 CPU-hours here)

Where the small scale differs from the paper (the report says it again): 3 teacher realisations instead
of 30, and 50 epochs instead of 100 (the report's R²-against-budget table shows what the last epochs
still moved). Every other setting is the preset's, which is the paper's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the repository's root, for `reproductions.studies`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reproductions.studies import budget_marks, failed_lines, numerics_lines, run_studies

FIGURES = {
    2: {"preset": "emami2019-gaussian20db", "setting": "dense Gaussian input, output SNR 20 dB"},
    3: {"preset": "emami2019-sparse15db", "setting": "sparse Gaussian input (p = 0.02), output SNR 15 dB"},
}
HIDDEN_SIZES = [2, 4, 6, 8, 10, 12, 14]  # the paper's n, all of them
N_TRUE = 4  # the teacher's states
TEACHERS, EPOCHS = 3, 50  # the reduced sweep's realisations and budget (the paper: 30 and 100)
#: a student "reaches" the optimum when its mean R² is within this of the optimal R² at the noise level
#: (the paper reads it off a plot; this is the report's reading, stated wherever it is used)
NEAR_OPTIMAL = 0.01
CLAIMS = {
    "rnn": "the RNN reaches the optimal R² only for n ≥ 8 = 2 n_true",
    "urnn": "a URNN needs about 2n states to match an RNN with n",
    "lstm": "the LSTM is close to the URNN",
}


def study_spec(figure: int, sizes: list[int], teachers: int, epochs: int, concurrency: int) -> dict[str, Any]:
    """The figure's preset with its grid and budget cut down; every protocol setting stays the preset's."""
    return {
        "preset": FIGURES[figure]["preset"],
        "name": f"reproduce-emami2019-fig{figure}",
        "dims": {"hidden": sizes, "teacher_seed": list(range(1, teachers + 1))},
        "base": {"epochs": epochs},
        "concurrency": concurrency,
    }


@dataclass(frozen=True)
class Mean:
    """A mean over teacher realisations with its standard error (None for one value)."""

    mean: float
    sem: float | None
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Mean | None:
        if not values:
            return None
        sem = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None
        return cls(statistics.fmean(values), sem, len(values))

    def text(self) -> str:
        return f"{self.mean:.4f}" + ("" if self.sem is None else f" ± {self.sem:.4f}")


@dataclass(frozen=True)
class Cell:
    """One student and n over the teachers: the mean R² of its runs that beat the memoryless predictor
    (R² > 0), and how many did not — a run that diverged ends there, at R² as low as −10²⁷, where one
    such run would be the whole mean — or failed (a non-finite loss)."""

    kept: Mean | None
    below: int = 0
    failed: int = 0

    @classmethod
    def of(cls, values: Sequence[float], failed: int = 0) -> Cell:
        kept = [v for v in values if v > 0]
        return cls(Mean.of(kept), len(values) - len(kept), failed)

    def text(self) -> str:
        said = self.kept.text() if self.kept else "–"
        lost = [f"{k} {what}" for k, what in ((self.failed, "failed"), (self.below, "at R² ≤ 0")) if k]
        if lost:
            total = (self.kept.n if self.kept else 0) + self.below + self.failed
            said += f" ({self.kept.n if self.kept else 0} of {total}; {', '.join(lost)})"
        return said


def _done(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in records if r["status"] == "done" and r["final_metric"] is not None]


def r2_by_size(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[int, Cell]]:
    """Final test R² per student and n over the teachers (`Cell`: those that beat the memoryless
    predictor, and how many did not or failed)."""
    seen: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    failed: dict[tuple[str, int], int] = defaultdict(int)
    for r in records:
        key = (r["model"], int(r["params"]["hidden"]))
        if r["status"] == "done" and r["final_metric"] is not None:
            seen[key[0]][key[1]].append(float(r["final_metric"]))
        elif r["status"] == "failed":
            seen[key[0]].setdefault(key[1], [])
            failed[key] += 1
    return {m: {n: Cell.of(v, failed[(m, n)]) for n, v in sorted(by.items())} for m, by in seen.items()}


def kept_means(r2: Mapping[str, Mapping[int, Cell]]) -> dict[str, dict[int, Mean]]:
    """Each student's mean R² per n over the runs that beat the memoryless predictor (n with none left out)."""
    return {m: {n: c.kept for n, c in by.items() if c.kept} for m, by in r2.items()}


def r2_at(
    records: Iterable[Mapping[str, Any]], steps: Sequence[int]
) -> dict[tuple[str, int], dict[int, Cell]]:
    """Test R² per (student, n) at each of `steps` (the evaluations in each trial's history); a failed
    trial counts at the steps it reached and as failed at those after."""
    seen: dict[tuple[str, int], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    failed: dict[tuple[str, int], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for r in records:
        if r["status"] not in ("done", "failed"):
            continue
        key = (r["model"], int(r["params"]["hidden"]))
        at = {e["step"]: e["metric"] for e in r["history"] or [] if e.get("metric") is not None}
        for s in steps:
            if s in at and math.isfinite(at[s]):
                seen[key][s].append(float(at[s]))
            elif r["status"] == "failed":
                seen[key].setdefault(s, [])
                failed[key][s] += 1
    return {k: {s: Cell.of(v, failed[k][s]) for s, v in by.items()} for k, by in sorted(seen.items())}


def epochs_of(records: Iterable[Mapping[str, Any]]) -> dict[int, float]:
    """Each evaluation step's epoch, as the trials recorded it."""
    return {e["step"]: e["epoch"] for r in records for e in r["history"] or []}


def evaluation_steps(records: Iterable[Mapping[str, Any]]) -> list[int]:
    """The evaluation steps every finished trial shares (one per epoch under the protocol)."""
    common: set[int] | None = None
    for r in _done(records):
        steps = {e["step"] for e in r["history"] or []}
        common = steps if common is None else common & steps
    return sorted(common or ())


def near_optimal(r2: Mapping[int, Mean], optimal: float, near: float = NEAR_OPTIMAL) -> list[int]:
    """The n whose mean R² is within `near` of `optimal`."""
    return sorted(n for n, m in r2.items() if optimal - m.mean <= near)


def doubling_gaps(r2: Mapping[str, Mapping[int, Mean]]) -> list[tuple[int, float, float | None]]:
    """For each n whose 2n was run: (n, R²_urnn(2n) − R²_rnn(n), its standard error where both have one)."""
    rnn, urnn = r2.get("rnn", {}), r2.get("urnn", {})
    out = []
    for n in sorted(rnn):
        if 2 * n in urnn:
            a, b = urnn[2 * n], rnn[n]
            sem = math.hypot(a.sem, b.sem) if a.sem is not None and b.sem is not None else None
            out.append((n, a.mean - b.mean, sem))
    return out


def optimal_r2(records: Iterable[Mapping[str, Any]]) -> dict[int, float]:
    """The optimal R² at the noise level of each teacher realisation, from its task (docs/protocol.md §3)."""
    from trainers.config import resolve
    from trainers.tasks.teacher import TeacherTask

    configs: dict[int, Mapping[str, Any]] = {}
    for r in records:
        configs.setdefault(int(r["params"]["teacher_seed"]), r["config"])
    out = {}
    for seed, config in sorted(configs.items()):
        task = resolve(config).make_task()
        if not isinstance(task, TeacherTask):
            raise SystemExit(
                f"teacher_seed {seed}: its trials' task is {type(task).__name__}, not the teacher's"
            )
        out[seed] = task.optimal_r2
    return out


def report(result: dict[str, Any], plot: str | None) -> str:
    """The Markdown report of a sweep's result (what `sweep` returns, or its --json file)."""
    run = result["run"]
    figure = run["figure"]
    part = result["parts"][f"fig{figure}"]
    records, spec = part["records"], part["spec"]
    optimal = result["optimal_r2"]
    opt = statistics.fmean(optimal.values())
    r2 = r2_by_size(records)
    models = [m for m in ("rnn", "urnn", "lstm") if m in r2]
    sizes = sorted({n for by in r2.values() for n in by})
    epochs, teachers = spec["base"]["epochs"], len(spec["dims"]["teacher_seed"])
    lines = [
        f"# Emami et al. (2019), Fig. {figure}, reduced, through memsweep",
        "",
        f"Command: `{run['command']}` — {run['seconds'] / 60:.0f} min on a machine of {run['cores']} cores (CPU). "
        "TRAINER_VERSION "
        f"{part['summary']['trainer_version']}.",
        "",
        *numerics_lines(result["parts"]),
        "",
        f"One study through the engine (the ledger, MLflow) on the paper's protocol (docs/protocol.md §3) for "
        f"Fig. {figure} ({FIGURES[figure]['setting']}): the contractive relu teacher with n_true = {N_TRUE}, "
        "T = 1,000, 700 training and 300 test sequences; students trained on the MSE with tf.keras' Adam "
        "(lr 0.01), batch 10, 70 updates an epoch, validated on the test sequences every epoch. "
        f"Reduced: {teachers} teacher realisation(s) instead of 30 and {epochs} epochs instead of 100; "
        f"n ∈ {{{', '.join(map(str, sizes))}}}; {part['trials']} trials in {part['seconds'] / 60:.1f} min.",
        "",
        "## Final test R² (mean ± s.e.m. over the teachers)",
        "",
        f"The optimal R² at the noise level is {opt:.4f} (mean over the teachers; "
        + ", ".join(f"teacher {s}: {v:.4f}" for s, v in optimal.items())
        + "). A mean is over the runs that beat the memoryless predictor (R² > 0); a cell says how many "
        "of its runs did not, or failed: a run that diverged and still ended finite sits far below 0, "
        "where one alone would be the whole mean"
        + (f" (the lowest here: {lowest:.1e})" if (lowest := _lowest(records)) < -1 else "")
        + ". "
        + _diverged_line(r2),
        "",
        "| n | " + " | ".join(models) + " |",
        "|---" * (1 + len(models)) + "|",
    ]
    for n in sizes:
        cells = [r2[m][n].text() if n in r2[m] else "–" for m in models]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    if plot:
        lines += ["", f"![R² against n]({Path(plot).name})"]
    lines += ["", "## The paper's readings, checked", ""]
    lines += _claim_lines(r2, opt)
    marks = budget_marks(evaluation_steps(records))
    epoch = epochs_of(records)
    at = r2_at(records, marks)
    if marks:
        lines += [
            "",
            "## R² against budget",
            "",
            "Mean test R² at a few epochs, over the runs above 0 then, each cell saying how many were not "
            "or had failed by then; a column still rising at the last epoch says the reduced budget cut it "
            "short.",
            "",
            "| student | n | " + " | ".join(f"epoch {epoch[s]:g}" for s in marks) + " |",
            "|---" * (2 + len(marks)) + "|",
        ]
        for (model, n), by in at.items():
            lines.append(
                f"| {model} | {n} | " + " | ".join(by[s].text() if s in by else "–" for s in marks) + " |"
            )
    lines += failed_lines(
        part["failed"], part["trials"], "left out of the means above, counted in their cells"
    )
    lines += ["", f"MLflow: {part['mlflow_url']}", ""]
    return "\n".join(lines)


def _lowest(records: Iterable[Mapping[str, Any]]) -> float:
    """The lowest final R² of the finished runs (0 when none finished)."""
    return min((float(r["final_metric"]) for r in _done(records)), default=0.0)


def _diverged_line(r2: Mapping[str, Mapping[int, Cell]]) -> str:
    """How many runs of each student ended at R² ≤ 0 or failed, of how many."""
    said = []
    for model, by in r2.items():
        lost = sum(c.below + c.failed for c in by.values())
        total = lost + sum(c.kept.n for c in by.values() if c.kept)
        said.append(f"{model} {lost} of {total}")

    return "Runs at R² ≤ 0 or failed: " + ", ".join(said) + "."


def _claim_lines(cells: Mapping[str, Mapping[int, Cell]], optimal: float) -> list[str]:
    """Each of the paper's three readings of its figure, beside what this run gives (its kept means)."""
    r2 = kept_means(cells)
    lines = []
    if "rnn" in r2:
        near = near_optimal(r2["rnn"], optimal)
        got = f"at n = {', '.join(map(str, near))}" if near else "at no n run"
        lines.append(
            f"- Paper: {CLAIMS['rnn']}. Here the RNN's mean R² is within {NEAR_OPTIMAL} of the optimum {got}"
            f" (of n = {', '.join(map(str, sorted(r2['rnn'])))})."
        )
    gaps = doubling_gaps(r2)
    if gaps:
        text = "; ".join(f"n = {n}: {g:+.4f}" + ("" if s is None else f" ± {s:.4f}") for n, g, s in gaps)
        lines.append(f"- Paper: {CLAIMS['urnn']}. Here R²(URNN, 2n) − R²(RNN, n): {text}.")
    if "urnn" in r2 and "lstm" in r2:
        shared = sorted(set(r2["urnn"]) & set(r2["lstm"]))
        diffs = [r2["lstm"][n].mean - r2["urnn"][n].mean for n in shared]
        if diffs:
            lines.append(
                f"- Paper: {CLAIMS['lstm']}. Here R²(LSTM) − R²(URNN) over n = {shared[0]}…{shared[-1]}: "
                f"{min(diffs):+.4f} to {max(diffs):+.4f} (mean {statistics.fmean(diffs):+.4f})."
            )
    return lines


def plot_figure(result: dict[str, Any], figure: int, out: str) -> None:
    """R² against n per student with s.e.m. bars and the optimal R² dashed, as the paper draws Fig. 2/3."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r2 = kept_means(r2_by_size(result["parts"][f"fig{figure}"]["records"]))
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for model, by in r2.items():
        ns = sorted(by)
        ax.errorbar(
            ns,
            [by[n].mean for n in ns],
            yerr=[by[n].sem or 0.0 for n in ns],
            marker="o",
            capsize=3,
            label=model,
        )
    ax.axhline(statistics.fmean(result["optimal_r2"].values()), ls="--", c="k", lw=1, label="optimal")
    ax.set_xlabel("student states n")
    ax.set_ylabel("test R² (runs above 0)")
    ax.set_title(f"Emami et al. Fig. {figure}, reduced ({FIGURES[figure]['setting']})", fontsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--figure", type=int, choices=sorted(FIGURES), default=2)
    p.add_argument("--quick", action="store_true", help="a smoke run: n ∈ {2, 8}, 1 teacher, 3 epochs")
    p.add_argument("--teachers", type=int, default=TEACHERS, help="teacher realisations (the paper: 30)")
    p.add_argument("--epochs", type=int, default=EPOCHS, help="epochs of 70 updates (the paper: 100)")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--home", help="memsweep home for the run (default: a new temporary folder)")
    p.add_argument("--out", help="the report (default: reproductions/emami2019-fig<N>-report.md)")
    p.add_argument("--json", help="also write the raw summaries and trial records here")
    p.add_argument("--from-json", help="write the report and figure from a run's --json file; nothing trains")
    args = p.parse_args()
    if args.from_json:
        result = json.loads(Path(args.from_json).read_text())
        result["optimal_r2"] = {int(k): v for k, v in result["optimal_r2"].items()}
    else:
        result = sweep(args)
    figure = result["run"]["figure"]
    out = Path(args.out or Path(__file__).with_name(f"emami2019-fig{figure}-report.md"))
    plot = str(out.with_suffix(".png"))
    plot_figure(result, figure, plot)
    out.write_text(report(result, plot))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    print(f"report: {out}, figure: {plot} ({result['run']['seconds'] / 60:.1f} min)")


def sweep(args: argparse.Namespace) -> dict[str, Any]:
    """Run the reduced sweep as one study; its result, with the optimal R² of each teacher and the run."""
    sizes, teachers, epochs = HIDDEN_SIZES, args.teachers, args.epochs
    if args.quick:
        sizes, teachers, epochs = [2, 8], 1, 3
    started = time.perf_counter()
    spec = study_spec(args.figure, sizes, teachers, epochs, args.concurrency)
    result = run_studies({f"fig{args.figure}": spec}, args.home, args.concurrency)
    result["optimal_r2"] = optimal_r2(result["parts"][f"fig{args.figure}"]["records"])
    flags = [f"--figure {args.figure}"] if args.figure != 2 else []
    if args.quick:
        flags.append("--quick")
    else:
        flags += [f"--teachers {teachers}"] * (teachers != TEACHERS) + [f"--epochs {epochs}"] * (
            epochs != EPOCHS
        )
    result["run"] = {
        "figure": args.figure,
        "command": " ".join(["python reproductions/emami2019.py", *flags]),
        "seconds": time.perf_counter() - started,
        "cores": os.cpu_count(),
    }
    return result


if __name__ == "__main__":
    main()
