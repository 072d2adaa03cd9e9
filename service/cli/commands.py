"""`memsweep`: what each command does (what the command line accepts: `service.cli.parser`). The REST
server is a thin front on the same engine; without a server, the commands answer from the local ledger
through the same study service (`service.cli.local`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from pydantic import ValidationError

from service.cli.console import (
    EXIT_FAILED,
    EXIT_REFUSED,
    EXTENDS,
    Failed,
    Refused,
    answer,
    api_url,
    build_spec,
    client_for,
    console,
    extension_of,
    failure_reasons,
    failures_of,
    given_flags,
    no_result,
    parse_pairs,
    plugin_state,
    print_best,
    print_comparison,
    print_failures,
    print_plan,
    print_plan_end,
    print_plugins,
    print_preset,
    print_status,
    print_studies,
    print_success,
    print_trials,
    pruned_part,
)
from service.cli.parser import build_parser
from service.client import FINAL_STATES
from service.core.criterion_query import OWN, SuccessQuery
from service.core.errors import invalid_fields
from service.core.settings import get_settings
from service.study.nodes import prepare_ray_process
from service.tracking.tracker import prepare_mlflow_process

if TYPE_CHECKING:
    from trainers.plugins import Plugin

TRAINER_COMMANDS = ("train", "describe", "list")

#: seconds `memsweep cancel` waits for the study to stop before it prints its state
CANCEL_WAIT = 60.0


def changes_spec(args: argparse.Namespace) -> bool:
    """Whether the command line changes a spec (beyond naming a study to resume): a preset or spec file,
    or a flag that extends the study or that the extension checks (`console.OnStudy`)."""
    return bool(args.target or given_flags(args, "extends") or given_flags(args, "checked"))


def refuse_on_resume(args: argparse.Namespace) -> None:
    """Refuse the flags a plain resume (`--study ID`) cannot apply, which it once dropped without a
    word, naming what the study keeps and the way to get it."""
    kept = given_flags(args, "kept")
    if not kept:
        return
    fixes = ["create a new study with them (its finished trials are reused, not trained again)"]
    if args.success_fraction is not None or args.success_threshold is not None:
        fixes.insert(
            0,
            f"judge this one under another criterion with `memsweep success {args.study} --fraction F` "
            "(or `--threshold L`)",
        )
    raise Refused(
        f"error: {', '.join(f.name for f in kept)}: a resumed study keeps its spec's "
        f"{', '.join(f.field for f in kept)} (--study resumes it, and extends it with {EXTENDS}, whose spec "
        f"takes these flags); {'; or '.join(fixes)}"
    )


def cmd_presets(args: argparse.Namespace) -> int:
    from search_spaces import list_presets
    from service.application.presets import preset_detail, preset_summary

    if args.name:  # one preset whole: what GET /presets/{name} serves
        if args.name not in list_presets():
            from service.application.errors import unknown_preset

            raise Refused(f"error: {unknown_preset(args.name, '`memsweep presets`')}")

        detail = preset_detail(args.name)  # with each model's parameter counts (torch: the trainers')
        if args.json:
            print(json.dumps(detail))
        else:
            print_preset(detail)
        return 0
    rows = []
    for name in list_presets():
        d = preset_summary(name)
        rows.append(
            {
                "name": name,
                "size": d.get("size"),
                "size_per_model": d.get("size_per_model"),
                "citation": d["citation"],
                "description": d["description"],
            }
        )
    if args.json:
        print(json.dumps(rows))
        return 0
    from rich.table import Table

    table = Table(title="presets (trials = points × seeds)")
    # a name whole, on one line, whatever the terminal's width: it is what `memsweep run` takes
    table.add_column("name", no_wrap=True, min_width=max((len(r["name"]) for r in rows), default=4))
    for col in ("trials", "per model", "citation"):
        table.add_column(col)
    for r in rows:
        per = ", ".join(f"{m} {n}" for m, n in (r["size_per_model"] or {}).items())
        table.add_row(r["name"], str(r["size"]), per, r["citation"])
    console().print(table)
    return 0


def _create_or_extend(args: argparse.Namespace, engine: Any, nodes: Any) -> Any:
    """`memsweep run`'s study: the one it resumes (extended when the command line changes its spec), or a new one."""
    if args.study:
        study = engine.ledger.get_study(args.study)
        if study is None:
            raise Refused(no_study_here(args.study))
        if not changes_spec(args):  # a resume: flags that would change its spec have nothing to apply to
            refuse_on_resume(args)
        if changes_spec(args):  # extend: only points the study does not hold yet are added
            added = engine.extend_study(study.id, build_spec(args, stored=study.spec), nodes=nodes)
            print(f"study {study.id}: extended by {added} trials", file=sys.stderr)
            study = engine.ledger.study(study.id)  # its spec as extended (max_trials, for what follows)
    else:
        study = engine.create_study(build_spec(args), nodes=nodes)
    return study


def no_study_here(study_id: str) -> str:
    """`memsweep run --study ID`'s error for a study this machine's ledger lacks (a server's, often)."""
    from service.cli.local import ledger_exists, ledger_place

    settings = get_settings()
    where = f"this machine's ledger ({ledger_place(settings)})"
    held = where if ledger_exists(settings) else f"{where}, which has not been made: nothing ran here"
    return (
        f"error: no study {study_id!r} in {held}; `memsweep run` trains here. A server's study is resumed "
        f"or extended with `memsweep submit --study {study_id} --url URL` (or MEMSWEEP_API_URL set)"
    )


def cmd_run(args: argparse.Namespace) -> int:
    from service.core.settings import get_settings
    from service.runner import StudyRunner
    from service.study.engine import Engine
    from service.study.nodes import embedded

    if not args.study and not args.target:  # refused before a ledger is made
        raise Refused(
            "error: give a preset name or a spec file (see `memsweep presets`), or --study ID to resume"
        )
    if args.study:  # a study of a server's (no ledger here yet: none is made to say so)
        from service.cli.local import ledger_exists

        if not ledger_exists(get_settings()):
            raise Refused(no_study_here(args.study))
    engine = Engine(get_settings())
    if args.study and engine.ledger.get_study(args.study) is not None:
        from service.study.claim import StudyBusyError, StudyClaim

        try:  # a study another process runs: refused before a plan, a progress bar or an extension
            with StudyClaim(engine.ledger, args.study):
                pass
        except StudyBusyError as exc:  # the study's state: another process runs it
            raise Failed(f"error: {exc}") from None
    runner = StudyRunner(engine, workers=1)  # the server's runner: planned, run, costed the same way
    nodes = None
    if not embedded(engine.settings):  # a cluster: its nodes' plugins are checked before anything is recorded
        try:
            runner.start_ray()
        except RuntimeError as exc:  # it names the address and what to check; nothing was recorded
            raise Failed(f"error: {exc}") from None
        nodes = runner.node_plugins
    try:
        study = _create_or_extend(args, engine, nodes)
    except BaseException:
        runner.shutdown()
        raise
    spec = study.validated_spec()
    drawn = (
        f"; its sampler draws the rest of max_trials {spec.max_trials} as it runs"
        if spec.sampler != "grid"
        else ""
    )
    print(
        f"study {study.id}: {engine.ledger.counts(study.id)['total']} trials in the ledger{drawn}",
        file=sys.stderr,
    )
    previous = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, _terminated)
        try:
            runner.submit(study.id)
            try:
                show_progress(runner, study.id, quiet=args.json)
            finally:  # from here on the shutdown below is what a SIGTERM asks for
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
        except KeyboardInterrupt as exc:  # the study stops (below) and stays resumable; no traceback
            how = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
            raise Failed(
                f"{how}: study {study.id} stopped, its unfinished trials pending; "
                f"`memsweep run --study {study.id}` resumes it"
            ) from None
        finally:
            runner.shutdown()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if study.id in runner.refused:
        raise Failed(f"error: {runner.refused[study.id]}")
    row = engine.ledger.get_study(study.id)
    if row is None or row.state == "failed" or runner.prepare_error:
        why = (row.error if row is not None else None) or runner.prepare_error
        raise Failed(f"error: study {study.id} failed: {why}")
    summary = engine.summary(study.id)
    failures, raised = failures_of(
        (t.reason, t.traceback) for t in engine.ledger.trials(study.id, ["failed"])
    )

    url = None
    if summary["mlflow"]["run_id"]:
        from service.tracking.links import ui_link

        url = ui_link(engine.tracking_uri(), summary["mlflow"]["experiment_id"], summary["mlflow"]["run_id"])
    if args.json:
        c = summary["counts"]
        print(json.dumps({
            "study_id": study.id, "state": summary["state"], "trials": c["total"], "succeeded": c["succeeded"],
            "failed": c["failed"], "done": c["done"], "run_id": summary["mlflow"]["run_id"],
            "experiment_id": summary["mlflow"]["experiment_id"], "mlflow_url": url,
            "success_by_model": {m: v["succeeded"] for m, v in summary["success"]["by_model"].items()},
            "best": summary["best"][0] if summary["best"] else None, "failures": failures, "raised": raised,
        }))  # fmt: skip
    else:
        print_success(summary)
        print_best(summary["best"], summary["success"]["by_model"])
        print_failures(failures, study.id, raised)
        print(
            f"\nMLflow: {url}\nstudy id: {study.id}  (memsweep best {study.id} · memsweep success {study.id})"
        )
    return no_result(study.id, summary["counts"], raised)


class Terminated(KeyboardInterrupt):
    """SIGTERM, which `memsweep run` takes as a Ctrl-C: `kill`, `timeout`, a batch scheduler's end of a
    job and a container's stop send it, and its default action killed the process mid-run, leaving its
    study and trials `running` and the embedded Ray's processes behind."""


def _terminated(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one would cut short the shutdown it starts
    raise Terminated


#: seconds the progress bar's reads wait on a ledger that does not answer (the run's own writes wait
#: out `service.store.patience.OUTAGE_PATIENCE`, and its runner resumes the study after a longer outage)
BAR_PATIENCE = 5.0


def show_progress(runner: Any, study_id: str, quiet: bool) -> None:
    """The study's bar while `runner` runs it: its counts against the trials it will hold (a sampled
    study's budget while it draws), and the runner's ETA (the server's). While the ledger does not
    answer it says so and waits with the runner, which resumes the study once it does: the bar gave up
    after the ledger's two minutes, ending `memsweep run` while its study was still to resume."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from sqlalchemy.exc import InterfaceError, OperationalError

    from service.store.patience import PATIENCE

    ledger, plan_shown = runner.engine.ledger, False
    spec = ledger.get_study(study_id).spec
    patience = PATIENCE.set(BAR_PATIENCE)  # this thread's reads only: the runner's threads keep theirs
    try:
        with Progress(
            TextColumn("[bold]study"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}", markup=False), TimeElapsedColumn(), transient=False,
            disable=quiet, console=console(),  # piped: the whole line, not a terminal's 80 columns
        ) as bar:  # fmt: skip
            task = bar.add_task("study", total=None, info="")
            while True:
                active, queued = runner.is_active(study_id), runner.is_queued(study_id)
                try:  # its plan once it is no longer queued (kept before the run, calibrating new shapes)
                    _show_turn(bar, task, runner.engine.ledger, runner.eta(study_id), study_id, spec, active,
                               None if plan_shown or queued else quiet)  # fmt: skip
                    plan_shown = plan_shown or not queued
                except (OperationalError, InterfaceError) as exc:
                    if not active:
                        raise
                    said = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0][:120]
                    bar.update(
                        task, info=f"the ledger does not answer ({said}); the study resumes once it does"
                    )
                if not active:
                    return
                time.sleep(0.5)
    finally:
        PATIENCE.reset(patience)


def _show_turn(
    bar: Any,
    task: Any,
    ledger: Any,
    eta: float | None,
    study_id: str,
    spec: Any,
    active: bool,
    plan_quiet: bool | None,
) -> None:
    """One turn of `show_progress`: the study's plan first when `plan_quiet` is not None (printed unless
    it is True), then its counts."""
    from service.core.spec import expected_trials
    from service.core.states import FINISHED

    if plan_quiet is not None:
        plan = (ledger.get_study(study_id).plan or {}).get("planned")
        if plan and not plan_quiet:
            print_plan_end(bar.console, plan)  # its notes and its line, as `memsweep plan` ends
    c = ledger.counts(study_id)
    info = f"running {c['running']} · failed {c['failed']}{pruned_part(c)} · successes {c['succeeded']}"
    if active:
        info += f" · ETA {eta:,.0f}s" if eta is not None else " · ETA –"
    # the last turn, the run over: a `done` study's own total (a sampler ends short over a small space)
    total = expected_trials(spec, c["total"], None if active else ledger.get_study(study_id).state)
    bar.update(task, total=total or None, completed=sum(c[s] for s in FINISHED), info=info)


def studies_for(args: argparse.Namespace) -> Any:
    """Where a command's answers come from: the server (`--url`, MEMSWEEP_API_URL) through the Python
    client, or this machine's ledger through the same calls (`service.cli.local`)."""
    url = api_url(args)
    if url:
        return client_for(url)
    from service.cli.local import LocalStudies
    from service.core.settings import get_settings

    return LocalStudies(get_settings())


def cmd_plan(args: argparse.Namespace) -> int:
    if not args.target:
        raise Refused("error: give a preset name or a spec file (see `memsweep presets`)")
    spec = build_spec(args)
    with studies_for(args) as studies:
        planned = answer(lambda: studies.plan(spec, recalibrate=args.recalibrate))
    if args.json:
        print(json.dumps(planned))
    else:
        print_plan(planned)
    if planned.get("where_unknown"):  # a plan as a preflight check fails where a run would
        print(f"error: the plan has no estimate: {planned['where_unknown']}", file=sys.stderr)
        return EXIT_FAILED
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from service.core.errors import UnknownFieldError

    query = criterion_query(args)

    def comparison(studies: Any) -> Any:
        try:
            return studies.comparison(args.studies, args.by.split(","), **query.model_dump(), log=args.mlflow)
        except UnknownFieldError as exc:  # this machine's ledger's: said with the flag (a server says ?by=)
            raise Refused(f"error: {exc.on_the_command_line()}") from None

    with studies_for(args) as studies:
        found = answer(lambda: comparison(studies))
    links = found.get("mlflow") or {}
    if links.get("run_url") or links.get("run_id"):  # once, beside any output (JSON and CSV stay clean)
        print(f"MLflow run: {links.get('run_url') or links['run_id']}", file=sys.stderr)
    if args.csv:
        from service.reports.tables import comparison_csv

        sys.stdout.write(comparison_csv(found))
    elif args.json:
        print(json.dumps(found))
    else:
        print_comparison(found)
    return 0


def cmd_trials(args: argparse.Namespace) -> int:
    where = {"model": args.model, "params": parse_pairs(args.param or [], "--param") or None}
    with studies_for(args) as studies:
        first = answer(lambda: studies.trials_page(args.study, 0, 1, args.status, **where))
        items = answer(lambda: studies.trials(args.study, args.status, history=args.history, **where))
    page = {**first, "offset": 0, "limit": len(items), "items": items}
    if args.csv:
        from service.reports.tables import trials_csv

        sys.stdout.write(trials_csv(page, args.study))
    elif args.json:
        print(json.dumps(page["items"]))
    else:
        print_trials(page)
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    with studies_for(args) as studies:
        # one more than asked for, to say whether the study has more points than the table shows
        best = answer(lambda: studies.best(args.study, k=args.k + (not args.json), model=args.model))
        # each model's counts: what to say of a model none of whose trials trained to its end
        by_model = {} if args.json else answer(lambda: studies.success(args.study))["by_model"]
    if args.json:
        print(json.dumps(best))
    else:
        print_best(best, {m: c for m, c in by_model.items() if args.model in (None, m)}, k=args.k)
    return 0


def other_tables(studies: Any, study: dict[str, Any], table: dict[str, Any]) -> list[dict[str, Any]]:
    """The success tables of the study's other criteria (copy: the same fraction of Arjovsky's baseline),
    each once and none the same criterion as `table`: what `memsweep run`, `success` and `submit --wait`
    print under the table. `studies`: this machine's or a server's (`success(id, **criterion)`)."""
    others: list[dict[str, Any]] = []
    for other in other_criteria(study["spec"]):

        def recount(other: dict[str, Any] = other) -> dict[str, Any]:
            return cast(dict[str, Any], studies.success(study["id"], **other, at_step=None))

        found = answer(recount)
        if found["criterion"] != table["criterion"] and found not in others:
            others.append(found)
    return others


def cmd_success(args: argparse.Namespace) -> int:
    query = criterion_query(args)
    with studies_for(args) as studies:
        study = answer(lambda: studies.get(args.study))
        table = answer(lambda: studies.success(args.study, **query.model_dump(), reference=args.reference))
        plain = not (args.json or args.csv or query != OWN)
        others = other_tables(studies, study, table) if plain else []  # as a run ends
    summary = {"name": study["name"], "success": table, "success_other_criteria": others}
    if args.csv:
        from service.reports.tables import success_csv

        sys.stdout.write(success_csv(summary["success"], args.study))
    elif args.json:
        print(json.dumps(summary["success"]))
    else:
        print_success(summary)
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    """`memsweep plugins`: what is installed (here, or on a server and its nodes); `check`: the contracts;
    `--files NAME`: what makes a plugin's code digest."""
    if args.action == "check":
        return check_plugins(args.names, args.json)
    if args.files:
        return plugin_files(args.files, args.json)
    url = api_url(args)
    if url:
        with client_for(url) as client:
            listing = answer(client.plugins)
    else:
        from service.study.plugins import listing as installed

        listing = {"server": installed(), "nodes": None}
    if args.json:
        print(json.dumps(listing))
    else:
        print_plugins(listing, url)
        for p in listing["server"]:
            if p.get("version_behind"):
                print(f"{p['kind']} {p['name']!r}: {p['version_behind']}")
        if url:
            print(
                "(`memsweep plugins check` checks this machine's plugins; the server checks its own, as listed)"
            )
    # one not ready (refused, breaking its contract, stale): a study that uses it is refused
    return EXIT_FAILED if any(plugin_state(p) != "ready" for p in listing["server"]) else 0


def _named(names: Sequence[str]) -> list[Plugin]:
    """`service.study.plugins.named`: a name that matches no installed plugin refused (exit 2)."""
    from service.study.plugins import named
    from trainers.registry import UnknownNameError

    try:
        return named(names)
    except UnknownNameError as exc:
        raise Refused(f"error: {exc}") from None


def plugin_files(name: str, as_json: bool) -> int:
    """The files plugin `name`'s code digest hashes (each with its own digest, to tell which one moved an
    identity) and the leftovers it leaves out (`trainers.plugins.code_files`)."""
    import hashlib

    from trainers.plugins import code_files

    report: list[dict[str, Any]] = []
    for p in _named([name]):
        files = code_files(p.value.split(":")[0])
        hashed = (
            {}
            if files is None
            else {
                rel.as_posix(): hashlib.sha256((files.root / rel).read_bytes()).hexdigest()[:16]
                for rel in files.hashed
            }
        )
        report.append(
            {
                "kind": p.kind,
                "name": p.name,
                "identity": p.identity,
                "root": None if files is None else str(files.root),
                "hashed": hashed,
                "left_out": [] if files is None else [rel.as_posix() for rel in files.left_out],
            }
        )
    if as_json:
        print(json.dumps(report))
        return 0
    for r in report:
        if r["root"] is None:
            print(
                f"{r['kind']} {r['name']!r} ({r['identity']}): its package was not found, so no file is hashed"
            )
            continue
        print(
            f"{r['kind']} {r['name']!r} ({r['identity']}): its code digest hashes {len(r['hashed'])} files of {r['root']}"
        )
        for rel, digest in r["hashed"].items():
            print(f"  {digest}  {rel}")
        if r["left_out"]:
            print("  left out (an editor's or a merge's leftovers): " + ", ".join(r["left_out"]))
    return 0


def check_plugins(names: Sequence[str], as_json: bool) -> int:
    """Run `trainers.contract` over the named plugins (all installed ones by default); 1 when one fails."""
    from service.study.plugins import check_report

    report = check_report(_named(names))
    if as_json:
        print(json.dumps(report))
    else:
        for r in report:
            verdict = "holds its contract" if not r["problems"] else "breaks its contract:"
            print(f"{r['kind']} {r['name']!r} ({r['identity']}): {verdict}")
            for problem in r["problems"]:
                print(f"  - {problem}")
            if r["version_behind"]:
                print(f"  note: {r['version_behind']}")
        if not report:
            print("no plugin is installed (see docs/plugins.md)")
    return EXIT_FAILED if any(r["problems"] for r in report) else 0


# ----- the REST service and its clients ---------------------------------------------------------------


def need_url(args: argparse.Namespace) -> str:
    url = api_url(args)
    if not url:
        raise Refused(
            "error: give the server's --url (or set MEMSWEEP_API_URL), e.g. --url "
            f"http://127.0.0.1:{get_settings().port}"
        )
    return url


def cmd_serve(args: argparse.Namespace) -> int:
    import logging

    import uvicorn

    from service.api import create_app
    from service.cli.servers import listening_socket
    from service.core.settings import get_settings

    settings = get_settings()
    host = args.host or settings.host
    port = args.port or settings.port
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.api_token is None and host not in ("127.0.0.1", "localhost", "::1"):
        logging.getLogger("memsweep").warning(
            "serving on %s without MEMSWEEP_API_TOKEN: anyone who reaches it can run studies", host
        )
    sock = listening_socket(host, port)  # before the app starts Ray: a taken port is said at once
    logging.getLogger("memsweep").info(
        "memsweep serve: listening on http://%s:%d (%s)",
        host if ":" not in host else f"[{host}]",
        port,
        "MEMSWEEP_API_TOKEN required on every route but /health"
        if settings.api_token is not None
        else "no token: open to whoever reaches it",
    )
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host=host, port=port, log_level="info"))
    with contextlib.suppress(KeyboardInterrupt):  # as `uvicorn.run`
        server.run([sock])
    return 0 if server.started else EXIT_FAILED  # the app's start-up failed (uvicorn's own `run` exits 3)


#: the best configurations `submit --wait` shows, as `memsweep run` ends (its summary's)
BEST_SHOWN = 5


def cmd_submit(args: argparse.Namespace) -> int:
    url = need_url(args)
    if args.study:
        return _submit_to_study(args, url)
    if not args.target:
        raise Refused(
            "error: give a preset name or a spec file (see `memsweep presets`), or --study ID to resume or "
            "extend a study of the server"
        )
    spec = build_spec(args)
    with client_for(url) as client:
        study = answer(lambda: client.submit(spec, idempotency_key=args.idempotency_key))
        print(f"study {study['id']}: {study['counts']['total']} trials, {study['state']}", file=sys.stderr)
    planned = (study.get("plan") or {}).get("planned")
    if planned:  # its notes (an added cell's defaults, an idle GPU …) and its line, as `run` begins
        print_plan_end(console(stderr=True), planned)
    return _follow(args, url, study)


def _submit_to_study(args: argparse.Namespace, url: str) -> int:
    """`memsweep submit --study ID`: a server's study extended by the flags (only its new points run) or,
    with none, resumed, as `memsweep run --study ID` does with this machine's ledger."""
    others = [flag.name for flag in given_flags(args, "kept")] + ["a preset or spec file"] * bool(args.target)
    others += [flag.name for flag in given_flags(args, "checked")]
    if others or args.idempotency_key:
        given = others + ["--idempotency-key"] * bool(args.idempotency_key)
        raise Refused(
            f"error: {', '.join(given)}: --study ID resumes the server's study, or extends it with {EXTENDS} "
            "(POST /studies/{id}/extend takes only those); the study keeps the rest of its spec. Create a new "
            "study with them (`memsweep submit PRESET|SPEC …`: its finished trials are reused, not trained again)"
        )
    changes = extension_of(args)
    with client_for(url) as client:
        if changes:
            extended = answer(lambda: client.extend(args.study, **changes))
            study = extended["study"]
            print(
                f"study {study['id']}: extended by {extended['added']} trials, {study['state']}",
                file=sys.stderr,
            )
        else:
            study = answer(lambda: client.resume(args.study))
            print(f"study {study['id']}: resumed, {study['state']}", file=sys.stderr)
    return _follow(args, url, study)


def _follow(args: argparse.Namespace, url: str, study: dict[str, Any]) -> int:
    """`submit`'s end: the study followed to its end with --wait, then printed with its success table
    and best configurations once done, as `memsweep run` ends (its id alone without --wait)."""
    if not args.wait:
        print(json.dumps(study) if args.json else study["id"])
        return 0
    with client_for(url) as client:
        study = answer(lambda: client.wait(study["id"], progress=not args.json, console=console()))
        done = study["state"] == "done" and not args.json
        failed_some = bool(study["counts"]["failed"])
        # the success table counts the runs that raised (`raised`), as `memsweep run` reads the ledger
        success = answer(lambda: client.success(study["id"])) if done or failed_some else None
        best = answer(lambda: client.best(study["id"], k=BEST_SHOWN + 1)) if done else None
        others = other_tables(client, study, success) if done and success is not None else []
        failed = answer(lambda: client.trials(study["id"], "failed")) if failed_some and not args.json else []
    raised = int((success or {}).get("total", {}).get("raised", 0))  # (a server before `raised`: none)
    if args.json:
        print(json.dumps(study))
    else:
        print_status(study)
        if done and success is not None and best is not None:
            print_success({"name": study["name"], "success": success, "success_other_criteria": others})
            print_best(best, success["by_model"], k=BEST_SHOWN)
        print_failures(failure_reasons(t["reason"] for t in failed), study["id"], raised)
    return EXIT_FAILED if study["state"] == "failed" else no_result(study["id"], study["counts"], raised)


def cmd_demo(args: argparse.Namespace) -> int:
    from service.cli.demo import run_demo

    return run_demo(args)


def cmd_sync(args: argparse.Namespace) -> int:
    with studies_for(args) as studies:
        study = answer(lambda: studies.sync(args.study))
    print(f"study {study['id']}: MLflow runs rebuilt from the ledger ({study['mlflow'].get('run_url')})")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    return _change_state(args, "resume")


def cmd_cancel(args: argparse.Namespace) -> int:
    return _change_state(args, "cancel")


def _change_state(args: argparse.Namespace, action: str) -> int:
    """`memsweep resume` / `cancel`: a server's study (a local run resumes with `run --study ID`, and
    stops with Ctrl-C)."""
    with client_for(need_url(args)) as client:
        study = answer(lambda: getattr(client, action)(args.study))
        if action == "cancel" and (study["state"] not in FINAL_STATES or study["active"]):
            # its running units stop first (seconds): the state it ends in, not the one it had (running)
            with contextlib.suppress(TimeoutError):
                study = answer(lambda: client.wait(args.study, poll=0.5, timeout=CANCEL_WAIT, progress=False))
    if args.json:
        print(json.dumps(study))
    else:
        print_status(study)
        if action == "cancel" and study["state"] not in FINAL_STATES:
            print(
                f"cancel requested: the study stops once its running units do (`memsweep status {args.study}`)"
            )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    with studies_for(args) as studies:
        study = answer(lambda: studies.get(args.study))
    if args.json:
        print(json.dumps(study))
    else:
        print_status(study)
        if study.get("waiting"):  # a server's queued study: what holds it back
            print(f"  waiting: {study['waiting']}")
    return 0


def cmd_studies(args: argparse.Namespace) -> int:
    with studies_for(args) as studies:
        page = answer(lambda: studies.studies_page(state=args.state, offset=args.offset, limit=args.limit))
        ledger = None if api_url(args) else studies.where  # this machine's, read for want of a server
    if args.json:
        print(json.dumps(page["items"]))
    else:
        print_studies(page, args.state, ledger)
    return 0


def other_criteria(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The criteria a study reports beside its own (`StudySpec.other_criteria`, as its summary in MLflow
    reports them), as success queries."""
    from service.core.spec import STORED, StudySpec

    validated = StudySpec.model_validate(spec, context=STORED)  # as the server stored it
    try:
        others = validated.other_criteria()
    except (ValueError, KeyError):  # a cell or task this process lacks (a server's plugin): its extras only
        others = validated.other_criteria(reference_baselines=())
    # a query names a reference baseline only (the task's is a query's own when it names none)
    return [
        {
            "fraction": c.fraction,
            "threshold": c.threshold,
            "baseline": None if c.baseline == "task" else c.baseline,
        }
        for c in others
    ]


def criterion_query(args: argparse.Namespace) -> SuccessQuery:
    """The criterion flags (`--fraction`, `--at-step`, …: the query's fields) as one query, refused here,
    flag by flag, by the bounds of the server's query parameters: a ledger and a server refuse alike
    (this machine's counted `--at-step 0` at each run's end). The calls take its fields as keywords, as
    the client's do (`studies`: a server's client or this machine's ledger)."""
    from trainers.criterion import Criterion

    given = {name: getattr(args, name) for name in SuccessQuery.model_fields}
    try:
        return SuccessQuery(**given)
    except ValidationError as exc:
        said = []
        for name, msg in ((str(e["loc"][0]), e["msg"]) for e in exc.errors()):
            if name in (
                "fraction",
                "threshold",
            ):  # the criterion's own words: what it is, and the papers' value
                try:
                    Criterion.of(**{name: given[name]})
                except ValueError as why:
                    msg = str(why)
            said.append(f"--{name.replace('_', '-')} {given[name]}: {msg}")
        raise Refused(f"error: {'; '.join(said)}") from None


#: each subcommand's function (its flags: `service.cli.parser`)
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "presets": cmd_presets, "run": cmd_run, "best": cmd_best, "success": cmd_success, "plan": cmd_plan,
    "compare": cmd_compare, "trials": cmd_trials, "serve": cmd_serve, "submit": cmd_submit, "sync": cmd_sync,
    "resume": cmd_resume, "cancel": cmd_cancel,
    "status": cmd_status, "studies": cmd_studies, "demo": cmd_demo, "plugins": cmd_plugins,
}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """`memsweep ARGV`: the command's exit status (`service.cli.console.EXIT_STATUSES`), returned, or
    raised as `Refused` (2, its message printed here) or `Failed` (1, printed by Python)."""
    prepare_ray_process(get_settings())  # before anything imports Ray
    prepare_mlflow_process()  # before any MLflow request
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in TRAINER_COMMANDS:
        from trainers.cli import main as trainers_main

        return trainers_main(argv)
    args = build_parser().parse_args(argv)
    fn = COMMANDS[args.command]
    try:
        code = int(fn(args))
        sys.stdout.flush()  # here, where a reader gone away is answered (not at the interpreter's exit)
        return code
    except BrokenPipeError:  # `memsweep trials ID | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own exit flush too
        return 128 + signal.SIGPIPE  # as a shell reports a command a closed pipe stopped
    except Refused as exc:  # Python prints no message of a status given as a number
        print(exc, file=sys.stderr)
        raise
    except ValidationError as exc:  # a spec's fields, named as the REST answer names them
        model = None
        if exc.title == "StudySpec":
            from service.core.spec import StudySpec

            model = StudySpec
        _, lines = invalid_fields(exc.errors(include_url=False), model)
        print(f"error: {'; '.join(lines)}", file=sys.stderr)
        return EXIT_REFUSED
    except ValueError as exc:  # StudyError, ConfigError
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except Exception as exc:  # the ledger's database, from a local command (SQLAlchemy was imported)
        if "sqlalchemy" in sys.modules:
            from sqlalchemy.exc import InterfaceError, OperationalError

            from service.store.database import unreachable

            if isinstance(exc, (OperationalError, InterfaceError)):
                print(f"error: {unreachable(exc)}", file=sys.stderr)
                return EXIT_FAILED
        raise


if __name__ == "__main__":
    sys.exit(main())
