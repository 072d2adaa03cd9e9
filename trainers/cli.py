"""`python -m trainers`: describe a trial config, train one trial, list components, analyse a network. JSON with --json."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from trainers.analysis.command import add_analyze_parser
from trainers.cells import list_cells
from trainers.config import TrainConfig, apply_overrides, from_dict, resolve
from trainers.criterion import Criterion
from trainers.initializers import INITIALIZERS
from trainers.loop import train
from trainers.model import build_model, count_params
from trainers.params import ConfigError
from trainers.registry import UnknownNameError
from trainers.result import Evaluation
from trainers.tasks import list_tasks

# CLI flag → config field (a trial field, or a task / cell field routed by apply_overrides)
SHORTCUTS = {
    "seq_len": "seq_len",
    "init": "init",
    "scale": "scale",
    "nonlinearity": "nonlinearity",
    "hidden": "hidden",
    "lr": "lr",
    "steps": "steps",
    "epochs": "epochs",
    "seed": "seed",
    "batch_size": "batch_size",
    "eval_every": "eval_every",
    "device": "device",
    "threads": "threads",
    "numerics": "numerics",
}


def add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--task", help=f"one of: {', '.join(list_tasks())} (default: the --config file's, else copy)"
    )
    p.add_argument(
        "--cell", help=f"one of: {', '.join(list_cells())} (default: the --config file's, else rnn)"
    )
    p.add_argument("--config", help="JSON file with a trial config (flags override it)")
    p.add_argument("--seq-len", dest="seq_len", help="the task's T (copy: see the task's `layout`)")
    p.add_argument("--init", help=f"initialiser: {', '.join(INITIALIZERS.names())}")
    p.add_argument(
        "--scale", help="the initialiser's hyperparameter: α (chain), β (fbchain), λ (identity, orthogonal)"
    )
    p.add_argument("--nonlinearity", help="elu | relu | tanh (default: the task's, as in Orhan & Pitkow)")
    p.add_argument("--hidden", help="hidden units N")
    p.add_argument("--lr", help="learning rate")
    p.add_argument("--steps", help="budget in optimiser steps (replaces --epochs)")
    p.add_argument("--epochs", help="budget in epochs (default 100, Orhan)")
    p.add_argument("--seed", help="one seed fixes data, permutation and weights")
    p.add_argument("--batch-size", dest="batch_size")
    p.add_argument(
        "--eval-every", dest="eval_every", help="steps between evaluations (default: once per epoch)"
    )
    p.add_argument("--device", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--threads", help="intra-op CPU threads (default 1)")
    p.add_argument(
        "--numerics",
        help="portable (default: the same numbers on any x86-64 CPU with AVX2) | native (this CPU's fastest "
        "kernels); the default is $MEMSWEEP_NUMERICS when set",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other config field: trial, task or cell (task.KEY / cell.KEY to be explicit)",
    )
    p.add_argument(
        "--success-fraction", dest="success_fraction", type=float,
        help="success: final validation loss < this × the baseline (default 0.5, Orhan & Pitkow)",
    )  # fmt: skip
    p.add_argument(
        "--success-threshold",
        dest="success_threshold",
        type=float,
        help="success: final validation loss < this",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    base: dict[str, Any] = {}
    if args.config:
        with open(args.config) as fh:
            base = json.load(fh)
    base = {
        **base,
        "task": args.task or base.get("task", "copy"),
        "cell": args.cell or base.get("cell", "rnn"),
    }
    cfg = from_dict(base)
    overrides: dict[str, Any] = {}
    for attr, key in SHORTCUTS.items():
        value = getattr(args, attr, None)
        if value is not None:
            overrides[key] = value
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: write KEY=VALUE, e.g. --set layout=delay")
        overrides[key.strip()] = value.strip()
    return apply_overrides(cfg, overrides)


def criterion_from_args(args: argparse.Namespace) -> Criterion:
    """The success criterion of the flags: a fraction of the baseline (default 0.5) or a threshold."""
    return Criterion.of(fraction=args.success_fraction, threshold=args.success_threshold)


def cmd_describe(args: argparse.Namespace) -> int:
    resolved = resolve(config_from_args(args))
    task = resolved.make_task()
    # shapes only: file-backed tasks need their data just for a vocabulary
    model = build_model(resolved, task)
    criterion = criterion_from_args(args)
    try:
        info = task.describe()
        baseline: float | None = task.baseline_loss
        references = task.reference_baselines
        threshold = criterion.threshold_for(baseline, references)
        missing = None
    except FileNotFoundError as exc:  # the baseline of a file-backed task comes from its data
        info = {
            "seq_len": task.seq_len,
            "input_dim": task.input_dim,
            "output_dim": task.output_dim,
            "metric": task.metric_name,
        }
        baseline = threshold = None
        references = {}
        missing = str(exc)
    out = {
        "param_count": count_params(model),
        "baseline_loss": baseline,
        "reference_baselines": references,
        "criterion": criterion.to_dict(),
        "success_threshold": threshold,
        **info,
        "config_hash": resolved.config_hash(),
        "config": resolved.to_dict(),
    }
    if missing:
        out["data_missing"] = missing
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key:>18}: {value}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    resolved = resolve(config_from_args(args))
    try:  # the task's own checks (a copy sequence too short for its layout), as a study's creation makes
        resolved.make_task()
    except FileNotFoundError:
        pass  # a data file the trial needs: its failure says which, and where to put it
    except ValueError as exc:  # a bad value: refused before anything trains, not a failed trial
        raise ConfigError(f"task {resolved.config.task!r}: {exc}") from None

    def report(e: Evaluation) -> None:
        metric = f"  metric {e.metric:.4f}" if e.metric is not None else ""
        print(
            f"step {e.step:>7}  epoch {e.epoch:7.2f}  train {e.train_loss:.5f}  val {e.val_loss:.5f}"
            f"{metric}  {e.seconds:6.1f}s",
            file=sys.stderr if args.json else sys.stdout,
            flush=True,
        )

    criterion = criterion_from_args(args)  # before training: a criterion the flags cannot make is refused now
    result = train(resolved, report)
    threshold = criterion.threshold_for(result.baseline_loss, result.reference_baselines)
    success = criterion.judge(
        result.status, result.final_val_loss, result.baseline_loss, result.reference_baselines
    )
    summary = {**result.to_dict(history=args.history), "criterion": criterion.to_dict(),
               "success_threshold": threshold, "success": success,
               "config_hash": resolved.config_hash(), "config": resolved.to_dict()}  # fmt: skip
    if args.json:
        print(json.dumps(summary))
    else:
        verdict = (
            "SUCCESS"
            if success
            else ("FAILED: " + (result.reason or "") if result.status == "failed" else "no success")
        )
        print(
            f"final val loss {result.final_val_loss}  (baseline {result.baseline_loss}, "
            f"threshold {threshold}: {criterion.name})  {verdict}  steps {result.steps}  {result.seconds:.1f}s"
        )
    return 0 if result.status == "done" else 1


def cmd_list(args: argparse.Namespace) -> int:
    out = {"tasks": list_tasks(), "cells": list_cells(), "initializers": INITIALIZERS.names()}
    print(json.dumps(out) if args.json else "\n".join(f"{k}: {', '.join(v)}" for k, v in out.items()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainers", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("describe", help="resolve a trial config: parameters, baseline, threshold")
    add_config_args(p)
    p.set_defaults(fn=cmd_describe)
    p = sub.add_parser("train", help="train one trial")
    add_config_args(p)
    p.add_argument("--history", action="store_true", help="include every evaluation in the JSON")
    p.set_defaults(fn=cmd_train)
    p = sub.add_parser("list", help="registered tasks, cells and initialisers")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_list)
    add_analyze_parser(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args))
    except (ConfigError, UnknownNameError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
