"""What the `memsweep` command line accepts (what each command does: `service.cli.commands`)."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable

from service.cli.console import EXIT_STATUSES, EXTENDS, SPEC_FLAGS_USAGE, add_spec_flags
from service.core.limits import BEST_K, STUDIES_LIMIT, STUDIES_OFFSET, Bounds
from service.core.states import QUEUED, StudyState, TrialStatus

#: `memsweep run`'s line of the usage, its spec flags listed from their table (as wide as the lines around it)
RUN_USAGE = textwrap.fill(
    f"memsweep run PRESET|SPEC.yaml [spec flags] [--json]   # spec flags: {SPEC_FLAGS_USAGE} "
    "(`memsweep run --help`)",
    width=105,
    subsequent_indent="    ",
    break_on_hyphens=False,
)

USAGE = f"""`memsweep`: run and query studies from the command line (the REST server is a thin front on the same engine).

memsweep presets [NAME] [--json]   # the papers' grids; NAME: its models' settings, dims, seeds
{RUN_USAGE}
memsweep run --study ID            # resume: only unfinished trials run
memsweep run --study ID --seeds 1,2,3 [--dim KEY=V1,V2]   # extend: only the new points run
memsweep plan PRESET|SPEC.yaml [spec flags] [--recalibrate] [--json] [--url URL]   # trials, bundles, estimate; nothing runs
memsweep best STUDY [--k 5] [--model M] [--json] [--url URL]
memsweep success STUDY [--fraction F | --threshold L] [--baseline B] [--at-step S] [--reference M]
    [--json | --csv] [--url URL]
memsweep compare A B … [--by cell,seq_len] [--fraction F | --threshold L] [--baseline B] [--at-step S]
    [--json | --csv] [--mlflow] [--url URL]
memsweep trials STUDY [--status done] [--history] [--json | --csv] [--url URL]
memsweep train|describe|list …     # one trial, as `python -m trainers`
memsweep plugins [--json] [--url URL]          # installed plugin cells and tasks (with --url: the server's and its nodes')
memsweep plugins --files NAME [--json]         # the files that make a plugin's code digest (why its identity moved)
memsweep plugins check [NAME …] [--json]       # run the cell / task contract over plugins (all by default)

The REST service and its clients (the token, when the server sets one, comes from MEMSWEEP_API_TOKEN;
--url defaults to MEMSWEEP_API_URL; every query above, `status`, `studies` and `sync` ask the server
when they have a URL, else read this machine's ledger):
memsweep serve [--host H] [--port P]
memsweep submit PRESET|SPEC.yaml [spec flags] [--idempotency-key K] --url URL [--wait] [--json]
memsweep submit --study ID [--seeds 1,2,3] [--dim KEY=V1,V2] --url URL [--wait]   # a server's study resumed or extended
memsweep status STUDY [--url URL] [--json]
memsweep studies [--state S] [--limit N] [--offset K] [--url URL] [--json]
memsweep sync STUDY [--url URL]      # rebuild its MLflow runs from the ledger
memsweep resume STUDY --url URL [--json]   # run a server's failed, cancelled or interrupted study on
memsweep cancel STUDY --url URL [--json]   # stop it (its unfinished trials stay resumable)
memsweep demo [--port P] [--keep-serving] [spec flags]   # the README's main job, over REST
"""


#: the epilog of `memsweep --help`: what each exit status says (`service.cli.console.EXIT_STATUSES`)
EXIT_STATUS = "Exit status (every command):\n" + "\n".join(
    textwrap.fill(said, width=100, initial_indent=f"  {status}  ", subsequent_indent="     ")
    for status, said in EXIT_STATUSES.items()
)


def build_parser() -> argparse.ArgumentParser:
    """`memsweep`'s parser: one subcommand each (`args.command`)."""
    parser = argparse.ArgumentParser(
        prog="memsweep",
        description=USAGE,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _study_commands(sub)
    _query_commands(sub)
    _server_commands(sub)
    return parser


def _study_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The commands that make and run studies."""
    p = sub.add_parser("run", help="create and run a study (or resume one with --study)")
    p.add_argument("target", nargs="?", help="a preset name or a YAML/JSON spec file")
    p.add_argument(
        "--study",
        help=f"resume this study: only unfinished trials run (with {EXTENDS}, extended first)",
    )
    add_spec_flags(p)
    p.add_argument("--json", action="store_true", help="end with one JSON line")
    p = sub.add_parser(
        "plan", help="what a study would run and cost: trials, bundles, budget, an estimate (nothing runs)"
    )
    p.add_argument("target", nargs="?", help="a preset name or a YAML/JSON spec file")
    add_spec_flags(p)
    p.add_argument("--recalibrate", action="store_true", help="measure every shape again (not the cache)")
    p.add_argument("--json", action="store_true")
    add_url_flag(p, "ask this memsweep server (it calibrates on its Ray) instead of planning here")
    p = sub.add_parser(
        "submit", help="create a study on a memsweep server (or resume or extend one with --study)"
    )
    p.add_argument("target", nargs="?", help="a preset name or a YAML/JSON spec file")
    p.add_argument(
        "--study",
        help=f"the server's study to resume (its unfinished trials run) or, with {EXTENDS}, to "
        "extend first (a trial it finished is never trained again)",
    )
    add_spec_flags(p)
    add_url_flag(p, "the memsweep server")
    p.add_argument(
        "--idempotency-key", dest="idempotency_key", help="repeat a submit safely (default: random)"
    )
    p.add_argument(
        "--wait", action="store_true", help="follow the study until it finishes (through a server restart)"
    )
    p.add_argument("--json", action="store_true", help="print the study as JSON")
    p = sub.add_parser(
        "demo", help="start the server, submit a small Orhan copy study over REST, print its results"
    )
    p.add_argument("--port", type=int, help="port of the server to start (default: MEMSWEEP_PORT, 8000)")
    p.add_argument("--keep-serving", dest="keep_serving", action="store_true", help="leave the server up")
    add_spec_flags(p)
    p.set_defaults(target=None)


def _query_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The commands that read a study's results."""
    p = sub.add_parser("best", help="best configurations of a study")
    p.add_argument("study")
    p.add_argument(
        "--k",
        type=whole_number(BEST_K),
        default=BEST_K.default,
        help=f"how many configurations ({BEST_K.low} to {BEST_K.high})",
    )
    p.add_argument("--model", help="only this model")
    p.add_argument("--json", action="store_true")
    add_url_flag(p, "ask this memsweep server instead of the local ledger")
    p = sub.add_parser("success", help="success counts by model, with 95 %% Wilson intervals")
    p.add_argument("study")
    add_criterion_flags(p)
    p.add_argument(
        "--reference", metavar="MODEL",
        help="each model's rate minus this model's, with Newcombe's 95 %% interval (your cell against a paper's)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--csv", action="store_true", help="the table as CSV (criterion and trainer version in its header)"
    )
    add_url_flag(p, "ask this memsweep server instead of the local ledger")
    p = sub.add_parser("compare", help="success counts of studies side by side, with differences of rates")
    p.add_argument("studies", nargs="+", help="study ids; the first is the reference of every difference")
    p.add_argument("--by", default="model", help="fields to group by, comma-separated (e.g. cell,seq_len)")
    add_criterion_flags(p)
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--csv", action="store_true", help="the table as CSV (criteria and trainer version in its header)"
    )
    p.add_argument("--mlflow", action="store_true", help="also log the comparison to MLflow as its own run")
    add_url_flag(p, "ask this memsweep server instead of the local ledger")
    p = sub.add_parser("trials", help="a study's trials (every field; --csv for a table)")
    p.add_argument("study")
    p.add_argument(
        "--status", action="append", choices=[t.value for t in TrialStatus],
        help="only trials in this status (repeatable)",
    )  # fmt: skip
    p.add_argument("--model", action="append", help="only this model's trials (repeatable)")
    p.add_argument(
        "--param", action="append", metavar="KEY=VALUE",
        help="only trials at this value, e.g. --param lr=1e-3 (repeatable; as GET /studies/ID/trials?param=)",
    )  # fmt: skip
    p.add_argument(
        "--history",
        action="store_true",
        help="with every evaluation, the weight profile and a failed trial's traceback (JSON text in CSV)",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--csv", action="store_true", help="one row per trial, params.* and config.* columns")
    add_url_flag(p, "ask this memsweep server instead of the local ledger")
    p = sub.add_parser("status", help="a study's state, counts, ETA and MLflow link")
    p.add_argument("study")
    add_url_flag(p, "ask this memsweep server, not the local ledger")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("studies", help="the studies, newest first: id, name, state, trials finished")
    p.add_argument(
        "--state", choices=[*(s.value for s in StudyState), QUEUED],
        help="only studies in this state (queued: a server's, accepted and not started yet)",
    )  # fmt: skip
    p.add_argument(
        "--limit",
        type=whole_number(STUDIES_LIMIT),
        default=STUDIES_LIMIT.default,
        help=f"at most this many, {STUDIES_LIMIT.low} to {STUDIES_LIMIT.high} (default {STUDIES_LIMIT.default})",
    )
    p.add_argument(
        "--offset",
        type=whole_number(STUDIES_OFFSET),
        default=STUDIES_OFFSET.default,
        help=f"skip this many of the newest (default {STUDIES_OFFSET.default})",
    )
    add_url_flag(p, "ask this memsweep server, not the local ledger")
    p.add_argument("--json", action="store_true", help="the page's studies as a JSON list of summaries")


def _server_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The presets, the server and its MLflow."""
    p = sub.add_parser("presets", help="the papers' grids; with NAME, what that one runs")
    p.add_argument(
        "name",
        nargs="?",
        metavar="NAME",
        help="one preset: each model's fixed settings and dimensions, the shared settings, seeds and trials",
    )
    p.add_argument(
        "--json", action="store_true", help="the list (or NAME's detail, as GET /presets/NAME) as JSON"
    )
    p = sub.add_parser("plugins", help="plugin cells and tasks: list them, or check their contracts")
    p.add_argument("action", nargs="?", choices=["list", "check"], default="list")
    p.add_argument(
        "names", nargs="*", help="check: these plugins (NAME or cell:NAME / task:NAME); default all"
    )
    p.add_argument(
        "--files",
        metavar="NAME",
        help="list: the files of plugin NAME (or cell:NAME / task:NAME) that its code digest hashes, each with "
        "its own digest, and those it leaves out",
    )
    p.add_argument("--json", action="store_true")
    add_url_flag(p, "list: ask this memsweep server (its plugins and each Ray node's)")
    p = sub.add_parser("serve", help="the REST service (uvicorn): studies run in the background")
    p.add_argument("--host", help="address to bind (default: MEMSWEEP_HOST, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default: MEMSWEEP_PORT, 8000)")
    p = sub.add_parser(
        "sync", help="rebuild a study's MLflow runs from the ledger (after MLflow was down or lost its store)"
    )
    p.add_argument("study")
    add_url_flag(p, "ask this memsweep server instead of using the local ledger")
    for name, what in (
        ("resume", "run a server's study again: its unfinished trials (locally: memsweep run --study ID)"),
        ("cancel", "stop a study a server runs; its unfinished trials stay resumable"),
    ):
        p = sub.add_parser(name, help=what)
        p.add_argument("study")
        p.add_argument("--json", action="store_true")
        add_url_flag(p, "the memsweep server that runs it")


def whole_number(bounds: Bounds) -> Callable[[str], int]:
    """An argparse type: a whole number within `bounds`, as the REST route takes it."""
    low, high = bounds.low, bounds.high

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is no whole number; give {low} to {high}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range; give {low} to {high}")
        return value

    return parse


def add_criterion_flags(p: argparse.ArgumentParser) -> None:
    """The flags that judge under another criterion or at a budget (success, compare)."""
    p.add_argument("--fraction", type=float, help="judge under this fraction of the baseline")
    p.add_argument("--threshold", type=float, help="judge under this loss threshold")
    p.add_argument(
        "--baseline",
        help="judge against a reference baseline the task reports (copy: arjovsky), at --fraction or the study's",
    )
    p.add_argument("--at-step", dest="at_step", type=int, help="count at a budget of this many steps")


def add_url_flag(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--url", help=f"{help} (default: MEMSWEEP_API_URL)")
