"""The terminal side that `memsweep`'s commands share: a spec from flags, tables and status lines,
and calls to a memsweep server that end in one-line errors (used by `service.cli` and `service.demo`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def parse_value(raw: str) -> Any:
    """CLI text → JSON scalar when it parses as one (1e-3 → 0.001, true → True), else the string."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def parse_pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"error: {flag} {item!r}: write KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def build_spec(args: argparse.Namespace, stored: dict[str, Any] | None = None) -> Any:
    """The spec from a preset name or file, or from a stored study's spec, with the flags applied."""
    from service.spec import StudySpec, load_spec

    target = args.target
    data: dict[str, Any]
    if stored is not None:
        data = dict(stored)
    elif target and (target.endswith((".yaml", ".yml", ".json")) or Path(target).is_file()):
        data = load_spec(target).model_dump(exclude_unset=True)
    else:
        data = {"preset": target}
    base = dict(data.get("base", {}))
    base.update({k: parse_value(v) for k, v in parse_pairs(args.set, "--set").items()})
    data["base"] = base
    dims = dict(data.get("dims", {}))
    for key, values in parse_pairs(args.dim, "--dim").items():
        dims[key] = [parse_value(v) for v in values.split(",")]
    data["dims"] = dims
    for field in ("sampler", "max_trials", "concurrency", "name", "scheduler", "success_fraction"):
        value = getattr(args, field)
        if value is not None:
            data[field] = value
    if args.models:
        data["models"] = args.models.split(",")
    if args.seeds:
        data["seeds"] = [int(s) for s in args.seeds.split(",")]
    if args.cpus is not None or args.gpus is not None:
        data["resources"] = {"cpus": args.cpus or 1.0, "gpus": args.gpus or 0.0}
    return StudySpec.model_validate(data)


def add_spec_flags(p: argparse.ArgumentParser) -> None:
    """The flags that build a spec (shared by `run` and `submit`)."""
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a trial setting for every trial (e.g. steps=500)",
    )
    p.add_argument(
        "--dim", action="append", default=[], metavar="KEY=V1,V2", help="replace a dimension's values"
    )
    p.add_argument("--models", help="only these models, comma-separated")
    p.add_argument("--seeds", help="seeds, comma-separated")
    p.add_argument("--sampler", choices=["grid", "random", "tpe", "cmaes", "qmc"])
    p.add_argument("--max-trials", dest="max_trials", type=int)
    p.add_argument("--concurrency", type=int)
    p.add_argument("--scheduler", choices=["fifo", "asha"])
    p.add_argument("--success-fraction", dest="success_fraction", type=float)
    p.add_argument("--cpus", type=float, help="CPUs per Ray trial")
    p.add_argument("--gpus", type=float, help="GPU fraction per Ray trial")
    p.add_argument("--name")


def print_success(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    success = summary["success"]
    when = f" at {success['at_step']:,} steps" if success.get("at_step") else ""
    table = Table(
        title=f"successes{when}: final validation loss < {success['criterion']['name']} ({summary['name']})"
    )
    for col in ("model", "trials", "finished", "failed", "succeeded", "rate", "95 % Wilson CI"):
        table.add_column(col, justify="right" if col != "model" else "left")
    for model, cell in summary["success"]["by_model"].items():
        lo, hi = cell["ci95"]
        table.add_row(
            model,
            str(cell["trials"]),
            str(cell["finished"]),
            str(cell["failed"]),
            str(cell["succeeded"]),
            f"{cell['rate']:.3f}",
            f"[{lo:.3f}, {hi:.3f}]",
        )
    Console().print(table)


def print_best(best: list[dict[str, Any]]) -> None:
    if not best:
        print("no finished trial yet")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="best configurations (mean final validation loss over seeds)")
    for col in ("model", "params", "mean loss", "s.e.m.", "seeds", "succeeded"):
        table.add_column(col)
    for r in best:
        params = " ".join(f"{k}={v}" for k, v in r["params"].items())
        table.add_row(
            r["model"],
            params,
            f"{r['mean_final_val_loss']:.5g}",
            f"{r['sem']:.2g}",
            str(len(r["seeds"])),
            f"{r['succeeded']}/{r['trials']}",
        )
    Console().print(table)


def print_status(study: dict[str, Any]) -> None:
    c = study["counts"]
    eta = f"{study['eta_seconds']:,.0f} s" if study.get("eta_seconds") is not None else "–"
    state = "queued" if study.get("queued") else study["state"]
    print(f"study {study['id']} ({study['name']}): {state}")
    print(
        f"  trials {c['total']} (expected {study['expected_trials']}) · finished {c['finished']} · "
        f"running {c['running']} · done {c['done']} · failed {c['failed']} · successes {c['succeeded']} · ETA {eta}"
    )
    if study.get("error"):
        print(f"  error: {study['error']}")
    if study["mlflow"].get("run_url"):
        print(f"  MLflow: {study['mlflow']['run_url']}")


def api_url(args: argparse.Namespace) -> str | None:
    from service.settings import get_settings

    url: str | None = getattr(args, "url", None) or get_settings().api_url
    return url


def client_for(url: str) -> Any:
    from service.client import MemsweepClient
    from service.settings import get_settings

    token = get_settings().api_token
    return MemsweepClient(url, token=token.get_secret_value() if token else None)


def remote(call: Callable[[], T]) -> T:
    """The answer of a server call; its refusal or an unreachable server as a one-line error."""
    import httpx

    from service.client import MemsweepAPIError

    try:
        return call()
    except MemsweepAPIError as exc:
        raise SystemExit(f"error: {exc}") from None
    except httpx.TransportError as exc:
        raise SystemExit(f"error: the server does not answer ({exc}); is `memsweep serve` running?") from None
