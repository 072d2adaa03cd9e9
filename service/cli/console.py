"""The terminal side that `memsweep`'s commands share: the spec flags (one table, `SPEC_FLAGS`) and the
spec they build, tables and status lines, calls to a memsweep server that end in one-line errors, and
the exit statuses those errors end with (used by `service.cli.commands` and `service.cli.demo`)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args

from service.core.spec import Sampler, StudySpec, names_spec_file, stored_values_once
from service.core.values import params_texts

if TYPE_CHECKING:
    from rich.console import Console

T = TypeVar("T")

#: `memsweep`'s exit statuses, one convention for every command (`memsweep --help` lists them; a pipe
#: its reader closed early, `memsweep trials ID | head`, ends 141 as a shell reports SIGPIPE)
EXIT_STATUSES = {
    0: "done (a study whose trials failed by the protocol's rule, a loss not finite, is done: those are "
    "results).",
    1: "the command ran, and what it did failed or found something wrong: a study failed, or every trial "
    "of it raised an exception, a plan cannot say where its trials would run, a plugin breaks its contract "
    "or cannot be used, a study's state refuses the change, the server (or the ledger, MLflow, the Ray "
    "cluster) does not answer, a run was stopped by Ctrl-C or SIGTERM.",
    2: "the input was refused before anything ran: a usage error, a malformed flag, a spec refused as "
    "invalid (here or by the server), an unknown preset, plugin or study, a URL without its scheme, a "
    "missing or wrong token.",
}
EXIT_FAILED = 1
EXIT_REFUSED = 2

#: a server's answers that refuse the request as sent (exit 2): a body that is no JSON object, a token,
#: an unknown study or preset, a body over the limit, an invalid spec or query; any other error answer
#: (409: the study's state; 5xx: the server or a service behind it) is a failure (exit 1)
REFUSED_ANSWERS = frozenset({400, 401, 403, 404, 413, 422})


class Refused(SystemExit):
    """The input refused before anything ran: exits 2 (`EXIT_REFUSED`), as argparse's usage errors do.
    `service.cli.commands.main` prints the message (`error: …`) to stderr; `str()` is the message."""

    def __init__(self, message: str) -> None:
        super().__init__(EXIT_REFUSED)
        self.message = message

    def __str__(self) -> str:
        return self.message


class Failed(SystemExit):
    """What the command did failed, or found something wrong: exits 1 (`EXIT_FAILED`), Python printing
    the message (`error: …`) to stderr, as it does for a `SystemExit` that holds text."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


#: how a command that read this machine's ledger is pointed at a server instead
ASK_A_SERVER = (
    "to ask a server, give --url URL (or set MEMSWEEP_API_URL); a server's study is resumed or extended "
    "from here with `memsweep submit --study ID --url URL`"
)

#: the width of a table written to a pipe or a file: wide enough that no value is cut (rich's default
#: there, 80 columns, printed `lr=0.00…` for 0.001 and 0.0003 alike, so `| grep` found neither)
PIPE_WIDTH = 240


def console(stderr: bool = False) -> Console:
    """Where tables are printed: stdout (stderr: for what a script reading stdout must not get) at its
    terminal's width, or PIPE_WIDTH when it is no terminal (COLUMNS, when set, wins either way). Text
    prints as written, no markup or emoji codes: a study named `lr [/sweep]` raised rich's MarkupError,
    and `[bold]sweep` or `A [bdd08e278468]` lost their brackets."""
    from rich.console import Console

    piped = not (sys.stderr if stderr else sys.stdout).isatty() and "COLUMNS" not in os.environ
    return Console(width=PIPE_WIDTH if piped else None, markup=False, emoji=False, stderr=stderr)


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
            raise Refused(f"error: {flag} {item!r}: write KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


# ----- the spec flags of run, plan, submit and demo: one table, which their parser, their help, the spec
# they build, a study's extension and a resume's refusals all read --------------------------------------
#: what `--study ID` does with a flag. extends: the study's extension takes its field (`StudyExtend`,
#: `POST /studies/{id}/extend`). checked: `run --study` puts it in the extended spec, whose engine
#: refuses another value (the sampler); a server's extension does not take it. kept: the study keeps its
#: spec's own, and a resume refuses the flag (it was dropped without a word). Extends is written here,
#: not read from `StudyExtend`: importing `service.application.records` loads the ledger's SQLAlchemy
#: models, which `memsweep status --url` must not (tests/test_imports.py); tests/service/test_spec_flags.py
#: holds the two equal.
OnStudy = Literal["extends", "checked", "kept"]


@dataclasses.dataclass(frozen=True)
class SpecFlag:
    """A flag that sets a field of the spec (a row of `SPEC_FLAGS`)."""

    name: str  # "--max-trials"; argparse makes its dest, max_trials
    field: str  # the spec's field it sets; dotted for a field inside one ("resources.cpus")
    example: str  # its value in `memsweep --help`'s list of spec flags ("N": "--max-trials N")
    on_study: OnStudy
    options: Mapping[str, Any]  # argparse's add_argument keywords, its help among them
    read: Callable[[Any], Any] | None = None  # argparse's value → the field's (None: as argparse gives it)
    instead_of: str | None = None  # the field it replaces (a criterion is a fraction or a threshold)

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")

    @property
    def extends(self) -> bool:
        return self.on_study == "extends"

    def given(self, args: argparse.Namespace) -> bool:
        """Whether the command line gives it (argparse leaves None, or [] for a repeatable flag): even as
        empty text or 0, which is read and judged, not dropped without a word."""
        return getattr(args, self.dest) not in (None, [])

    def value(self, args: argparse.Namespace) -> Any:
        """The spec field's value from the command line; None when the flag is not given."""
        if not self.given(args):
            return None
        raw = getattr(args, self.dest)
        return raw if self.read is None else self.read(raw)


def _settings(items: Sequence[str]) -> dict[str, Any]:
    """`--set KEY=VALUE`: each value as JSON reads it (1e-3 → 0.001), else as text."""
    return {key: parse_value(value) for key, value in parse_pairs(items, "--set").items()}


def parse_dims(items: Sequence[str]) -> dict[str, list[Any]]:
    """`--dim KEY=V1,V2`: each dimension's values, split on the commas. A value that is a list (`[1,3]`)
    is refused: split on its commas, it reached the trials as `'[1'` and `'3]'`."""
    dims: dict[str, list[Any]] = {}
    for key, values in parse_pairs(items, "--dim").items():
        if any(v.strip().startswith("[") for v in values.split(",")):
            singles = ",".join(v.strip(" []") for v in values.split(",") if v.strip(" []"))
            raise Refused(
                f"error: --dim {key}={values}: a dimension's values are single values, separated by commas; "
                f"a list is one setting of every trial, given with --set (or in base): --set '{key}={values}'; "
                f"several single values are swept as --dim {key}={singles or '1,3'}"
            )
        dims[key] = [parse_value(v) for v in values.split(",")]
    return dims


def _names(text: str) -> list[str]:
    return text.split(",")


def parse_seeds(raw: str) -> list[int]:
    """`--seeds 1,2,3`."""
    try:
        return [int(s) for s in raw.split(",")]
    except ValueError:
        raise ValueError(
            f"--seeds {raw}: give whole numbers separated by commas, e.g. --seeds 1,2,3"
        ) from None


#: (the spec names its schedulers in its field's type alone)
SCHEDULERS = get_args(StudySpec.model_fields["scheduler"].annotation)

SPEC_FLAGS: tuple[SpecFlag, ...] = (
    SpecFlag(
        "--set", "base", "KEY=VALUE", "extends", read=_settings,
        options={"action": "append", "default": [], "metavar": "KEY=VALUE",
                 "help": "a trial setting for every trial (e.g. steps=500)"},
    ),
    SpecFlag(
        "--dim", "dims", "lr=1e-3,3e-4", "extends", read=parse_dims,
        options={"action": "append", "default": [], "metavar": "KEY=V1,V2",
                 "help": "replace a dimension's values (extending a study: its values so far and the new ones)"},
    ),
    SpecFlag(
        "--models", "models", "a,b", "extends", read=_names,
        options={"help": "only these models, comma-separated; a cell's name adds an arm of it (docs/plugins.md)"},
    ),
    SpecFlag("--seeds", "seeds", "1,2", "extends", read=parse_seeds, options={"help": "seeds, comma-separated"}),
    SpecFlag(
        "--sampler", "sampler", "S", "checked",
        options={"choices": get_args(Sampler), "help": "grid (default), or an Optuna sampler"},
    ),
    SpecFlag(
        "--max-trials", "max_trials", "N", "extends",
        options={"type": int, "help": "a sampler's budget in trials (points × seeds)"},
    ),
    SpecFlag(
        "--concurrency", "concurrency", "N", "kept",
        options={"type": int,
                 "help": "Ray units at once, each a fused bundle of trials (default: what the nodes hold)"},
    ),
    SpecFlag(
        "--scheduler", "scheduler", "|".join(SCHEDULERS), "kept",
        options={"choices": SCHEDULERS, "help": "asha: stop the worse points early (docs/studies.md)"},
    ),
    SpecFlag(
        "--success-fraction", "success_fraction", "F", "kept", instead_of="success_threshold",
        options={"type": float,
                 "help": "a run succeeds below this fraction of its baseline's loss (default 0.5, the papers')"},
    ),
    SpecFlag(
        "--success-threshold", "success_threshold", "L", "kept", instead_of="success_fraction",
        options={"type": float,
                 "help": "or: a run succeeds below this validation loss (instead of a fraction of its baseline's)"},
    ),
    SpecFlag(
        "--cpus", "resources.cpus", "C", "kept",
        options={"type": float, "help": "CPUs per Ray unit, a bundle of trials (the spec's resources.cpus)"},
    ),
    SpecFlag(
        "--gpus", "resources.gpus", "G", "kept",
        options={"type": float, "help": "GPUs per Ray unit, a fraction to share one (resources.gpus)"},
    ),
    SpecFlag(
        "--name", "name", "NAME", "kept",
        options={"help": "the study's name (default: the preset's, or 'custom')"},
    ),
)  # fmt: skip


def given_flags(args: argparse.Namespace, on_study: OnStudy) -> list[SpecFlag]:
    """The flags of this kind the command line gives, in the table's order."""
    return [flag for flag in SPEC_FLAGS if flag.on_study == on_study and flag.given(args)]


def _either(flags: Sequence[str]) -> str:
    return f"{', '.join(flags[:-1])} or {flags[-1]}"


#: the flags that extend a study, as its help and its refusals name them
EXTENDS = _either([flag.name for flag in SPEC_FLAGS if flag.extends])


def _listed() -> str:
    """The spec flags as `memsweep --help` lists them; a pair that replace each other (a criterion's two
    forms) as alternatives."""
    text = f"{SPEC_FLAGS[0].name} {SPEC_FLAGS[0].example}"
    for before, flag in itertools.pairwise(SPEC_FLAGS):
        text += f"{' | ' if flag.instead_of == before.field else ', '}{flag.name} {flag.example}"
    return text


#: the spec flags, as `memsweep --help` lists them
SPEC_FLAGS_USAGE = _listed()


def build_spec(args: argparse.Namespace, stored: dict[str, Any] | None = None) -> Any:
    """The spec from a preset name or file, or from a stored study's spec, with the spec flags applied."""
    from service.client import read_spec_file

    target = args.target
    data: dict[str, Any]
    if stored is not None:
        data = stored_values_once(stored)
    elif target and names_spec_file(target):
        data = read_spec_file(target).model_dump(exclude_unset=True)  # its errors name the file
    else:
        data = {"preset": target}
    given = [(flag, value) for flag in SPEC_FLAGS if (value := flag.value(args)) is not None]
    fields = {flag.field for flag, _ in given}
    for flag, value in given:
        field, _, key = flag.field.partition(".")
        if key:  # one of a field's keys (resources.cpus): the others stay as the spec has them
            data[field] = {**dict(data.get(field) or {}), key: value}
        elif isinstance(value, dict):  # --set, --dim: their keys over the spec's own
            data[field] = {**dict(data.get(field) or {}), **value}
        else:
            data[field] = value
        # a criterion flag replaces the spec file's criterion, whichever form that has (both flags are refused)
        if flag.instead_of and flag.instead_of not in fields:
            data.pop(flag.instead_of, None)
    return StudySpec.model_validate(data)


def extension_of(args: argparse.Namespace) -> dict[str, Any]:
    """The changes the spec flags that extend a study make to a server's study (`POST
    /studies/{id}/extend`'s body: each dimension, and the seeds, given whole, as `build_spec` takes them
    for a study of this machine's ledger); {} when none is given."""
    given = ((flag, flag.value(args)) for flag in SPEC_FLAGS if flag.extends)
    return {flag.field: value for flag, value in given if value is not None}


def add_spec_flags(p: argparse.ArgumentParser) -> None:
    """The flags that build a spec (shared by `run`, `plan`, `submit` and `demo`)."""
    for flag in SPEC_FLAGS:
        p.add_argument(flag.name, **flag.options)


def rate_text(rate: float | None) -> str:
    """A success rate as the tables print it; "–" when no run has finished (no estimate)."""
    return "–" if rate is None else f"{rate:.3f}"


def print_success(summary: dict[str, Any]) -> None:
    from rich.table import Table

    success = summary["success"]
    when = f" at {success['at_step']:,} steps" if success.get("at_step") else ""
    table = Table(
        title=f"successes{when}: final validation {judged_by(success['criterion'])} ({summary['name']})"
    )
    differences, reference = success.get("differences"), success.get("reference")
    pruned = any(cell.get("pruned") for cell in success["by_model"].values())  # a column under asha
    columns = ["model", "trials", "finished", "failed", *(["pruned"] if pruned else []), "succeeded", "rate",
               "95 % Wilson CI"]  # fmt: skip
    if differences:
        columns += [f"− {reference}", "95 % Newcombe CI", "p (Fisher)"]
    for col in columns:
        table.add_column(col, justify="right" if col != "model" else "left")
    for model, cell in summary["success"]["by_model"].items():
        lo, hi = cell["ci95"]
        row = [
            model,
            str(cell["trials"]),
            str(cell["finished"]),
            str(cell["failed"]),
            *([str(cell["pruned"])] if pruned else []),
            str(cell["succeeded"]),
            rate_text(cell["rate"]),
            f"[{lo:.3f}, {hi:.3f}]",
        ]
        if differences:
            d = differences[model]
            if model == reference:  # itself: nothing to set against
                row += ["reference", "", ""]
            elif d["difference"] is None:  # no finished run to set against yet
                row += ["–", "", ""]
            else:
                p = d.get("p")  # (a server before it: none)
                row += [
                    f"{d['difference']:+.3f}",
                    f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]",
                    "" if p is None else f"{p:.3g}",
                ]
        table.add_row(*row)
    console().print(table)
    for note in success.get("notes") or []:  # an at_step past every run's end (a server before: none)
        print(f"note: {note}")
    for line in other_criteria_lines(success, summary.get("success_other_criteria") or []):
        print(line)


def other_criteria_lines(success: Mapping[str, Any], others: Sequence[Mapping[str, Any]]) -> list[str]:
    """The study's other criteria under its success table (copy: the same fraction of Arjovsky's
    baseline), each model's successes of its finished runs; criteria that count alike share a line, and
    those that count as the table does are named once, not repeated (copy's `delay` layout: Arjovsky's
    baseline is the task's)."""

    def counts(table: Mapping[str, Any]) -> tuple[tuple[str, int, int], ...]:
        return tuple((m, c["succeeded"], c["finished"]) for m, c in table["by_model"].items())

    alike: dict[tuple[tuple[str, int, int], ...], list[str]] = {}
    for other in others:
        alike.setdefault(counts(other), []).append(other["criterion"]["name"])
    lines = []
    for said, names in alike.items():
        told = (
            "the same successes as above"
            if said == counts(success)
            else ", ".join(f"{m} {succeeded}/{finished}" for m, succeeded, finished in said)
        )
        named = " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
        lines.append(f"  also under {named}: {told}")
    return lines


#: why a seed is not in its point's mean (`BestConfig.missing_seeds`), and why a trial has no result
NOT_ENDED = {
    "pruned": "stopped early by asha",
    "failed": "failed",
    "pending": "not run yet",
    "running": "still training",
    "cancelled": "cancelled before its end",
    "error": "lost to an infrastructure fault",
    "done": "done without a final loss",
}


def print_best(
    best: list[dict[str, Any]], by_model: Mapping[str, Mapping[str, Any]] | None = None, k: int | None = None
) -> None:
    """The best configurations: a row some seed of which is not in its mean is marked `*` and told
    under the table (it is ranked after the complete points); with the study's counts by model
    (`by_model`: a success table's), each model none of whose trials trained to its end is told why
    (a study asha stopped whole read "no finished trial yet", as if it had not run). With `k`, the
    rows asked for: `best` holds one more where the study has more points, and the table says so."""
    more = k is not None and len(best) > k
    best = best[:k] if k is not None else best
    empty = [why for m, cell in (by_model or {}).items() if (why := none_ended(m, cell))]
    if not best:
        print("\n".join(empty) if empty else "no finished trial yet")
        return
    from rich.table import Table

    table = Table(
        title="best configurations, ranked by mean final validation loss over seeds, not by successes"
    )
    for col in ("model", "params", "mean loss", "s.e.m.", "seeds", "succeeded"):
        table.add_column(col)
    notes = []
    # a point with no varied values of its own (its model fixes them all): the settings that tell it from
    # the study's other points (`BestConfig.settings`; a server before them: none), else "–"
    shown = params_texts([r["params"] or r.get("settings") or {} for r in best])
    for r, params in zip(best, [text or "–" for text in shown], strict=True):
        missing = r.get("missing_seeds") or {}  # (a server before the field: none said)
        if missing:
            why = ", ".join(f"{n} {NOT_ENDED.get(status, status)}" for status, n in missing.items())
            notes.append(f"  {r['model']} {params}: {why}")
        table.add_row(
            r["model"],
            params,
            f"{r['mean_final_val_loss']:.5g}",
            f"{r['sem']:.2g}" if len(r["seeds"]) > 1 else "–",  # one seed: no spread to estimate
            f"{len(r['seeds'])} of {r['trials']} *" if missing else str(len(r["seeds"])),
            f"{r['succeeded']}/{r['trials']}",
        )
    console().print(table)
    if more:
        print(f"the best {k} points shown; the study has more (--k N shows N)")
    if notes:
        print("* seeds not in the mean, ranked after the points whose every seed trained to its end:")
        print("\n".join(notes))
    for line in empty:
        print(line)


def none_ended(model: str, cell: Mapping[str, Any]) -> str | None:
    """Why none of `model`'s trials trained to its end, from its success-table cell; None when one did."""
    pruned, failed, errors = cell.get("pruned", 0), cell["failed"], cell["errors"]
    total, unended = cell["trials"] + errors, cell["trials"] - cell["finished"]
    if cell["finished"] - failed - pruned or not total:
        return None
    if pruned == total:
        return f"all {total} trials of {model} were stopped early by asha; none trained to its end"
    if unended == total:
        return f"no trial of {model} has ended yet ({total} pending, running or cancelled)"
    counts = {"pruned": pruned, "failed": failed, "error": errors}
    parts = [f"{n} {NOT_ENDED[status]}" for status, n in counts.items() if n]
    parts += [f"{unended} not ended (pending, running or cancelled)"] if unended else []
    return f"none of the {total} trials of {model} trained to its end: {', '.join(parts)}"


def print_plugins(listing: dict[str, Any], where: str | None = None) -> None:
    """`memsweep plugins`: this machine's (or the server's at `where`) plugins, and which nodes differ."""
    from rich.table import Table

    here = f"the server's at {where}" if where else "this machine's"
    table = Table(title=f"plugin cells and tasks: {here} (docs/plugins.md)")
    for col in ("kind", "name", "distribution", "version", "code", "state"):
        table.add_column(col)
    for p in listing["server"]:
        table.add_row(p["kind"], p["name"], p["distribution"], p["version"], p["digest"], plugin_state(p))
    screen = console()
    screen.print(table if listing["server"] else f"no plugin is installed ({here})")
    nodes = listing.get("nodes")
    if nodes is None:
        if where:
            screen.print(
                "nodes: none listed (an embedded Ray's workers load the server's own plugins; a cluster's "
                "nodes are listed once the server has joined it)"
            )
        return
    ours = {f"{p['kind']}:{p['name']}": p["identity"] for p in listing["server"] if p["problem"] is None}
    for node, there in sorted(nodes.items()):
        if "unanswered" in there:  # (service.study.plugins.UNANSWERED: it did not say)
            screen.print(f"node {node}: did not say which plugins it has ({there['unanswered']})")
            continue
        differ = sorted(k for k in {*ours, *there} if ours.get(k) != there.get(k))
        screen.print(
            f"node {node}: "
            + (
                "the same plugins"
                if not differ
                else "differs on " + ", ".join(f"{k} ({there.get(k) or 'missing'})" for k in differ)
            )
        )


def print_preset(detail: Mapping[str, Any]) -> None:
    """`memsweep presets NAME`: each model's fixed settings and dimensions, then the settings every model
    shares, the seeds and the size (`search_spaces.describe`, as GET /presets/{name} serves it)."""
    from rich.table import Table

    from service.core.values import repr_value

    def settings(values: Mapping[str, Any]) -> str:
        return ", ".join(f"{k}={repr_value(v)}" for k, v in values.items()) or "–"

    def dims(values: Mapping[str, Any]) -> str:
        said = []
        for k, d in values.items():
            if "values" in d:
                said.append(f"{k}: {', '.join(repr_value(v) for v in d['values'])}")
            else:  # a range (a preset is a grid today; a space's model may not be)
                kind = next(key for key in d if key != "log")
                low, high = d[kind]
                said.append(
                    f"{k}: {kind} {repr_value(low)} to {repr_value(high)}{' (log)' if d.get('log') else ''}"
                )
        return "; ".join(said) or "–"

    screen = console()
    screen.print(f"{detail['name']}: {detail['description']}")
    screen.print(f"citation: {detail['citation']}")
    per_model = detail.get("size_per_model") or {}
    table = Table(title="models (each model's settings over the shared ones below)")
    table.add_column("model", no_wrap=True)
    for col in ("fixed", "dimensions", "parameters", "trials"):
        table.add_column(col)
    for name, model in detail["models"].items():
        trials = per_model.get(name)
        counts = model.get("param_counts") or []  # (a server before them: none)
        params = f"{counts[0]:,}" + (f"–{counts[-1]:,}" if len(counts) > 1 else "") if counts else "–"
        table.add_row(
            name, settings(model["fixed"]), dims(model["dims"]), params, "" if trials is None else str(trials)
        )
    screen.print(table)
    screen.print(f"base (every model but where it fixes its own): {settings(detail['base'])}")
    screen.print(f"seeds: {', '.join(str(s) for s in detail['seeds'])}")
    size = detail.get("size")
    screen.print(f"trials: {'sampled (a space with ranges)' if size is None else f'{size} (points × seeds)'}")


def plugin_state(plugin: Mapping[str, Any]) -> str:
    """A listed plugin's state in one line: `ready`, or why a study that uses it is refused."""
    if plugin["problem"] is not None:
        return f"refused: {plugin['problem']}"
    if plugin.get("edited"):  # (an older server lists no `edited`)
        return "stale: changed on disk since loaded; restart the server to use it"
    contract = plugin.get("contract") or []  # (nor `contract`)
    if contract:
        first = contract[0].strip().splitlines()[0]
        more = len(contract) - 1
        rest = f" (and {more} more: `memsweep plugins check {plugin['name']}`)" if more else ""
        return f"breaks its contract: {first}{rest}"
    return "ready"


def pruned_part(counts: dict[str, Any]) -> str:
    """` · pruned N` for a study some trials of which a scheduler pruned (asha), else nothing."""
    return f" · pruned {counts['pruned']}" if counts.get("pruned") else ""


def print_status(study: dict[str, Any]) -> None:
    c = study["counts"]
    eta = f"{study['eta_seconds']:,.0f} s" if study.get("eta_seconds") is not None else "–"
    state = "queued" if study.get("queued") else study["state"]
    print(f"study {study['id']} ({study['name']}): {state}")
    print(
        f"  trials {c['total']} (expected {study['expected_trials']}) · finished {c['finished']} · "
        f"running {c['running']} · done {c['done']} · failed {c['failed']}{pruned_part(c)} · "
        f"successes {c['succeeded']} · ETA {eta}"
    )
    if study.get("error"):
        print(f"  error: {study['error']}")
    if study["mlflow"].get("run_url"):
        print(f"  MLflow: {study['mlflow']['run_url']}")


def print_studies(page: dict[str, Any], state: str | None = None, ledger: str | None = None) -> None:
    """A page of `GET /studies` (`total`, `offset`, `items`: summaries), one study a line (its trials
    finished of its `expected_trials`), and where the next page starts when there is one; `ledger`:
    where this machine's ledger is, when the page is its (an empty one then says how to ask a server)."""
    studies, total, offset = page["items"], page["total"], page["offset"]
    if not studies and total:
        print(f"no study past --offset {offset}: {total} in all")
        return
    here = f" in this machine's ledger ({ledger}); {ASK_A_SERVER}" if ledger else ""
    if not studies and state == "queued" and ledger:
        print(f"no study is queued here: a server queues the studies it is sent; {ASK_A_SERVER}")
        return
    if not studies and state:
        print(f"no study is {state}{here or ' (`memsweep studies` lists them all)'}")
        return
    if not studies:
        print(
            f"no studies in this machine's ledger ({ledger}): `memsweep run PRESET` makes one here; {ASK_A_SERVER}"
            if ledger
            else "no studies yet: `memsweep submit PRESET --url URL` makes one"
        )
        return
    for s in studies:
        c = s["counts"]
        now = "queued" if s.get("queued") else s["state"]
        # against what the study will hold: a sampled study's budget while it still draws its points
        expected = s.get("expected_trials", c["total"])
        print(f"{s['id']}  {now:<9} {c['finished']:>6}/{expected:<6} {s['created_at'][:19]}  {s['name']}")
    shown = offset + len(studies)
    if shown < total:
        print(f"{offset + 1}–{shown} of {total}, newest first; --offset {shown} shows the next")


def api_url(args: argparse.Namespace) -> str | None:
    from service.core.settings import get_settings

    url: str | None = getattr(args, "url", None) or get_settings().api_url
    return url


def client_for(url: str) -> Any:
    """The client of the server at `url`, with MEMSWEEP_API_TOKEN's token (the client reads it)."""
    from service.client import MemsweepClient

    try:
        return MemsweepClient(url)
    except ValueError as exc:  # a URL without its scheme: said so, not "is `memsweep serve` running?"
        raise Refused(f"error: --url (or MEMSWEEP_API_URL): {exc}") from None


def answer(call: Callable[[], T]) -> T:
    """The answer of a call to a server or to the local ledger (`service.cli.local`), or a one-line
    error: `Refused` (exit 2) for a request refused as sent (an invalid spec, an unknown study: the
    server's `REFUSED_ANSWERS`), `Failed` (exit 1) for a study whose state refuses it, a service that
    does not answer, or an unreachable server."""
    import httpx

    from service.application.errors import ConflictError, NotFoundError, UnavailableError
    from service.client import MemsweepAPIError, NotMemsweepError
    from service.core.errors import StudyError

    try:
        return call()
    except (NotFoundError, StudyError) as exc:
        raise Refused(f"error: {exc}") from None
    except MemsweepAPIError as exc:  # another server at the URL (NotMemsweepError): no memsweep answered
        refused = exc.status in REFUSED_ANSWERS and not isinstance(exc, NotMemsweepError)
        raise (Refused if refused else Failed)(f"error: {exc}") from None
    except (ConflictError, UnavailableError) as exc:
        raise Failed(f"error: {exc}") from None
    except httpx.TransportError as exc:
        where = ""
        with contextlib.suppress(RuntimeError):  # the request the error came from, when httpx kept it
            url = exc.request.url
            where = f" at {url.scheme}://{url.netloc.decode()}"
        raise Failed(
            f"error: the server{where} does not answer ({exc}); is `memsweep serve` running there?"
        ) from None


def duration(seconds: float) -> str:
    """Seconds as people read a duration: `52 s`, `14 min`, `3.2 h`, `167 days`."""
    for unit, size in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= 2 * size:
            return f"{seconds / size:,.3g} {unit}"
    return f"{seconds:,.0f} s"


def plan_line(plan: Mapping[str, Any], notes_above: bool = False) -> str:
    """A plan in one line: trials, units, and the estimate in seconds with its range; without one, why
    (the notes, or where they are printed above it: `notes_above`)."""
    untrained = plan.get("pruned_untrained") or 0
    finished = f"{plan['reused']} finished already" + (f", {untrained} pruned untrained" if untrained else "")
    head = f"plan: {plan['to_run']} trials to run ({finished}) in {plan['units']} Ray units"
    e = plan.get("estimate")
    if not e:  # why: the notes that say there is none (a failed calibration, an unknown node), else all
        why = [n for n in plan["notes"] if "no estimate" in n] or plan["notes"]
        said = "the notes above say why" if notes_above and why else "; ".join(why) or "not calibrated"
        return f"{head}; no estimate yet ({said})"
    lo, hi = e["wall_seconds_range"]
    partial = "" if e["complete"] else f" (covers {e['units_estimated']} of {plan['units']} units)"
    return (
        f"{head}; estimate {e['wall_seconds']:,.0f} s ({lo:,.0f}–{hi:,.0f} s, ≈ {duration(e['wall_seconds'])}) "
        f"at {plan['slots']} slots, {e['trial_hours']:,.3g} trial-hours{partial}"
    )


def print_plan(plan: dict[str, Any]) -> None:
    from rich.table import Table

    screen = console()
    table = Table(title=f"plan of {plan['name']} ({plan['sampler']}): nothing runs")
    for col in ("model", "trials", "to run", "units", "trains", "steps a trial"):
        table.add_column(col, justify="left" if col in ("model", "trains") else "right")
    for model, row in plan["by_model"].items():
        steps = row["budget_steps"]
        span = (
            "?"
            if steps is None
            else f"{steps[0]:,}"
            if steps[0] == steps[1]
            else f"{steps[0]:,}–{steps[1]:,}"
        )
        trains = "–" if not row["units"] else "in bundles" if row.get("fused") else "solo"
        table.add_row(model, str(row["trials"]), str(row["to_run"]), str(row["units"]), trains, span)
    screen.print(table)
    # (a server before `unit_sizes` answers them under their first name)
    sizes = ", ".join(f"{n} × {k}" for k, n in (plan.get("unit_sizes") or plan["bundle_sizes"]).items())
    budget = plan["budget"]
    screen.print(
        f"units: {plan['units']} ({plan['bundles']} fused bundles; units × members: {sizes or 'none'}) · "
        f"steps: {budget['trial_steps']:,} over the trials, {budget['unit_steps']:,} over the units · "
        f"{plan['slots']} slots (concurrency {plan['concurrency']}) on {plan['node_type'] or '?'}"
    )
    shapes = Table(title="shapes (calibrated: real steps of the largest unit)")
    for col in (
        "shape",
        "fused × members",
        "units",
        "step (median, ms)",
        "per member-step",
        "eval (s)",
        "source",
    ):
        shapes.add_column(col)
    for s in plan["shapes"]:
        c = s["calibration"]
        if c is None:
            cells = ["–", "–", "–", s["error"] or "not calibrated"]
        else:
            import statistics

            step = statistics.median(c["step_seconds"])
            evaluation = (c["eval_seconds"] or 0.0) * c["val_scale"]
            cells = [
                f"{1000 * step:,.1f} ({1000 * min(c['step_seconds']):,.1f}–{1000 * max(c['step_seconds']):,.1f})",
                f"{1000 * step / c['bundle_size']:,.2f} ms",
                f"{evaluation:,.2f}",
                "cache" if s["cached"] else f"measured ({c['seconds']:.1f} s)",
            ]
        shapes.add_row(
            s["description"], f"{'yes' if s['fused'] else 'no'} × {s['bundle_size']}", str(s["units"]), *cells
        )
    screen.print(shapes)
    e = plan.get("estimate")
    if e:
        lo, hi = e["wall_seconds_range"]
        tlo, thi = e["trial_hours_range"]
        screen.print(
            f"estimate: wall-clock {e['wall_seconds']:,.0f} s (range {lo:,.0f}–{hi:,.0f} s; ≈ "
            f"{duration(e['wall_seconds'])}) · {e['trial_hours']:,.3g} trial-hours ({tlo:,.3g}–{thi:,.3g}; × "
            f"{plan['resources']['cpus']:g} CPU per unit)"
            + ("" if e["complete"] else " · INCOMPLETE: see notes")
        )
    print_plan_end(screen, plan)


def print_plan_end(screen: Console, plan: Mapping[str, Any]) -> None:
    """A plan's notes (a cell added beside a preset's models, an idle GPU, a failed calibration …), then
    its one line: how `memsweep plan` ends and `memsweep run` begins (user text, printed as written)."""
    for note in plan.get("notes") or []:
        screen.print(f"note: {note}", style=None, highlight=False, markup=False)
    screen.print(plan_line(plan, notes_above=True), style=None, highlight=False, markup=False)


def print_comparison(comparison: dict[str, Any]) -> None:
    from rich.table import Table

    names = {s["study_id"]: s for s in comparison["studies"]}
    when = f" at {comparison['at_step']:,} steps" if comparison.get("at_step") else ""
    table = Table(
        title=f"successes{when} by {', '.join(comparison['by'])}; differences from {comparison['reference']}"
    )
    for col in (
        *comparison["by"],
        "study",
        "criterion",
        "succeeded",
        "rate",
        "95 % Wilson CI",
        "difference (95 % Newcombe; Fisher's p)",
        "shared",
    ):
        table.add_column(col)
    # a study that holds no trial of a group (a model of the other study's only) has no row there
    rows = [r for r in comparison["rows"] if r["study_id"] is None or r["trials"]]
    if len(rows) < len(comparison["rows"]):
        table.caption = "a study with no trial in a group has no row in it"
    for r in rows:
        group = (
            [str(v) for v in r["group"].values()]
            if r["scope"] == "group"
            else ["all", *[""] * (len(r["group"]) - 1)]
        )
        lo, hi = r["ci95"]
        diff = (
            ""
            if r["difference"] is None
            else f"{r['difference']:+.3f} [{r['difference_ci95'][0]:+.3f}, {r['difference_ci95'][1]:+.3f}]"
            + (
                "" if r.get("difference_p") is None else f"; p {r['difference_p']:.3g}"
            )  # (a server before: none)
        )
        if r["study_id"] is None:  # pooled: every distinct run once, under the reference's criterion
            who, criterion = "all (distinct runs)", names[comparison["reference"]]["criterion"]["name"]
        else:
            who = f"{names[r['study_id']]['name']} [{r['study_id']}]"
            criterion = names[r["study_id"]]["criterion"]["name"]
        table.add_row(
            *group, who, criterion, f"{r['succeeded']}/{r['finished']}" + _unfinished(r),
            rate_text(r["rate"]), f"[{lo:.3f}, {hi:.3f}]", diff, "" if r["shared"] is None else str(r["shared"]),
        )  # fmt: skip
    console().print(table)
    for note in comparison.get("notes") or []:  # what the numbers cannot say themselves (numerics, plugins)
        print(f"note: {note}")


def judged_by(criterion: Mapping[str, Any]) -> str:
    """A criterion as a table's title says it: `loss < 0.17`, `loss < 0.5 × baseline` (its name reads
    "loss < 0.17" for a threshold: titles said "loss < loss < 0.17")."""
    name = str(criterion["name"])
    return name if criterion.get("threshold") is not None else f"loss < {name}"


def print_trials(page: dict[str, Any]) -> None:
    from rich.table import Table

    total = page["total"]
    table = Table(title=f"{total} trial{'' if total == 1 else 's'} (success: {page['criterion']['name']})")
    # a failed, pruned or interrupted trial's reason; a pending one's, when another study trains it
    why = any(t.get("reason") or t.get("trained_by") for t in page["items"])
    # where a running trial has got to: its latest evaluation's step and validation loss
    now = any(t["status"] == "running" and t.get("last_evaluation") for t in page["items"])
    for col in (
        "id",
        "model",
        "params",
        "status",
        *(["latest (step: val loss)"] if now else []),
        "final loss",
        "success",
        "seconds",
        *(["reason"] if why else []),
    ):
        table.add_column(col)
    for t, params in zip(page["items"], params_texts([t["params"] for t in page["items"]]), strict=True):
        loss = "" if t["final_val_loss"] is None else f"{t['final_val_loss']:.5g}"
        seconds = "" if t["seconds"] is None else f"{t['seconds']:.1f}"
        latest = t.get("last_evaluation") if t["status"] == "running" else None
        progress = [f"{latest['step']}: {latest['val_loss']:.5g}" if latest else ""] if now else []
        reason = [short(t.get("reason") or _trained_by(t))] if why else []
        success = "" if t["success"] is None else str(t["success"])  # not judged until it finishes
        table.add_row(
            str(t["id"]), t["model"], params, t["status"], *progress, loss, success, seconds, *reason,
        )  # fmt: skip
    console().print(table)


def _trained_by(trial: Mapping[str, Any]) -> str:
    other = trial.get("trained_by")
    return f"study {other} trains it now; this study takes its result" if other else ""


def short(text: str, width: int = 100) -> str:
    """A reason's first line, at most `width` characters."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def failure_reasons(reasons: Iterable[str | None]) -> dict[str, int]:
    """Failed trials' reasons, each first line (shortened) once, with how many trials gave it."""
    return dict(Counter(short(reason or "no reason recorded", 160) for reason in reasons))


def failures_of(failed: Iterable[tuple[str | None, str | None]]) -> tuple[dict[str, int], int]:
    """Failed trials' (reason, traceback) pairs, from the ledger or a server: their reasons
    (`failure_reasons`), and how many of them raised an exception (a traceback kept:
    `trainers.runtime.fail`)."""
    pairs = list(failed)
    return failure_reasons(reason for reason, _ in pairs), sum(tb is not None for _, tb in pairs)


def no_result(study_id: str, counts: Mapping[str, int], raised: int) -> int:
    """`EXIT_FAILED`, said on stderr, when every trial of a study that ended raised an exception (a bug in
    a cell or a task: the study has no result, however its rates read); else 0."""
    if raised and raised == counts["failed"] and not counts["done"] + counts.get("pruned", 0):
        print(
            f"error: every trial of study {study_id} raised an exception (above): it has no result",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return 0


def print_failures(reasons: Mapping[str, int], study_id: str, raised: int = 0) -> None:
    """Why a run's failed trials failed, each reason once with its count, and where to read more; of
    them, those `raised` by an exception (a traceback kept) said apart from the protocol's failures (a
    loss not finite): a bug in a cell or a task, or a numerical error, which the rates count as runs
    that did not succeed."""
    if not reasons:
        return
    print(f"\nfailed: {sum(reasons.values())} trial(s)")
    for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"  {n} × {reason}")
    if raised:
        print(
            f"  {raised} of them raised an exception, not the protocol's failure (a loss not finite): a bug "
            "in a cell or a task, or a numerical error. The success rates count them as runs that did not "
            "succeed: read their tracebacks before the rates."
        )
    print(f"  (memsweep trials {study_id} --status failed lists them; with --json --history, each traceback)")


def _unfinished(cell: dict[str, Any]) -> str:
    """ " of N" after succeeded/finished when some of the N trials have not finished (a study under way,
    or cancelled): the rate is over the finished runs."""
    return f" of {cell['trials']}" if cell["finished"] != cell["trials"] else ""
