"""The study lifecycle: create, extend, run.

    engine = Engine(get_settings())
    study = engine.create_study(spec)          # validates, enumerates the grid into the ledger
    summary = engine.run_study(study.id)       # runs what is not finished; resumable at any point

The ledger is the source of truth: a run that dies midway is resumed by calling `run_study` again
(only pending or interrupted trials run); `extend_study` adds only new points; a finished trial of
any study with the same config hash is reused. The driver is the only writer of the ledger and of
MLflow; an executor (Ray Tune's workers: `ray_tune`) only trains and reports, the driver's book
(`book`) records through the `recorder` and, at the end of a run, the engine makes the study's MLflow
runs whole (`rebuild`). The engine knows no Ray: it passes a `RunRequest` and its `TrialBook` to the
executor (`executor`). A study's trials come from `search`, travel as
`TrialSpec`s and units (`service.core.trial`, `packing`), and come back as `trainers.TrialResult`s.
What a run is planned to cost, and what it did, is the runner's (`service.runner`).
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from functools import partial
from itertools import pairwise
from typing import Any

from search_spaces import SearchSpace
from service.core.errors import StudyError
from service.core.settings import Settings
from service.core.spec import StudySpec
from service.core.states import FINAL, FINISHED, UNFINISHED, TrialStatus
from service.core.trial import (
    Known,
    StaleTrialError,
    TrialSpec,
    Unit,
    known_of,
    point_key,
    seeded_point_key,
    value_key,
)
from service.core.values import repr_value, value_sort_key
from service.reports.study_summary import summarise
from service.store.ledger import ClaimLostError, Ledger
from service.store.models import Study, Trial
from service.store.patience import outage
from service.study import elsewhere
from service.study.book import OUTAGE_NOTE, SHUTDOWN_NOTE, Stop, TrialBook
from service.study.claim import StudyClaim
from service.study.elsewhere import Held, alive, look_elsewhere, wait_for_others
from service.study.executor import Executor, RunRequest
from service.study.kept import KeptResults
from service.study.nodes import prepare_ray_process
from service.study.other_code import drawn_under_other_code, hash_today, other_code, part_of
from service.study.packing import bundle, pack_study, stopped_points
from service.study.plugins import NodePlugins, admit_plugins
from service.study.rebuild import finish_in_mlflow, tracking_error
from service.study.recorder import StudyRecorder
from service.study.search import (
    check_numbers_as_text,
    execution,
    first_point,
    materialize,
    points_left,
    rung_means,
    sampling,
    study_space,
    study_trials,
)
from service.tracking.context import StudyContext
from service.tracking.server import ensure_mlflow_server, home_uri, port_of, server_healthy
from service.tracking.tracker import Tracker
from trainers import Criterion

log = logging.getLogger(__name__)

#: where a run's time goes, in order (`run_study`'s summary["seconds"])
RUN_PHASES = ("ray_tune", "tracking_backlog", "summary_and_plots", "parent_run")
#: the reason of a trial a process that died left `running`, once the study's next run holds its claim
ORPHAN_NOTE = "the process running it died before it ended; it runs again"


def retrained(rows: Sequence[Trial], trials: Sequence[TrialSpec]) -> list[tuple[Trial, TrialSpec]]:
    """The extension's `trials` that would train again, under another config, a point the study's trials
    (`rows`) hold: the same model and values (seed included), a hash the study lacks; each with the row
    of its point. Their results would be counted beside the old ones, as seeds of one point. (A study
    that holds both already, from an extension before this check, is not refused for them again.)"""
    held = {r.config_hash for r in rows}
    points = {seeded_point_key(r.model, r.params): r for r in rows}
    return [
        (points[point], t)
        for t in trials
        if t.config_hash not in held and (point := seeded_point_key(t.model, t.params)) in points
    ]


def dropped_values(rows: Sequence[Any], trials: Sequence[Any]) -> dict[str, list[str]]:
    """What a grid extension's `trials` leave out of the study's points (`rows`): per field (`model`,
    a dimension, `seed`), the values the study holds that no trial of the extension has, as tables
    print them; a dimension the extension adds that the left-out trials do not set (they ran at its
    default) is named with the value "(its default)". A spec without them no longer describes the
    study: its trials would stay in its tables and resume, unlisted in its spec. A number matches its
    other spelling (1 and 1.0: one config hash)."""

    def fields(model: str, params: Mapping[str, Any]) -> list[tuple[str, Any]]:
        return [("model", model), *params.items()]

    hashes = {t.config_hash for t in trials}
    points = {seeded_point_key(t.model, t.params) for t in trials}
    kept = {(k, value_key(v)) for t in trials for k, v in fields(t.model, t.params)}
    names = {k for t in trials for k in t.params}
    dropped: dict[str, set[str]] = {}
    for r in rows:
        if r.config_hash in hashes or seeded_point_key(r.model, r.params) in points:
            continue
        for k, v in fields(r.model, r.params):
            if (k, value_key(v)) not in kept:
                dropped.setdefault(k, set()).add(repr_value(v))
        for k in names - set(r.params):
            dropped.setdefault(k, set()).add("(its default)")
    return {k: sorted(v, key=value_sort_key) for k, v in dropped.items()}


def dropped_message(dropped: Mapping[str, Sequence[str]], seeds: Sequence[int] = ()) -> str:
    """Why an extension is refused (`dropped_values`), with the fix: left-out seeds as the whole list to
    give, the study's and the extension's `seeds`."""
    said = "; ".join(f"{k}: {', '.join(v)}" for k, v in dropped.items())
    examples = []
    if "seed" in dropped:
        every = sorted({*seeds, *(int(s) for s in dropped["seed"])})
        examples.append(f"seeds: {every}, or --seeds {','.join(map(str, every))}")
    if set(dropped) - {"seed"}:
        examples.append(
            "dims: {lr: [old values…, new]}, or --dim lr=OLD,…,NEW; a new dimension with the value its "
            "trials ran at"
        )
    return (
        f"extend adds points and keeps the study's; this one leaves out values its trials hold ({said}). "
        f"Give each dimension, model list or seed list its values so far with the new ones (e.g. "
        f"{'; '.join(examples)}), or create a new study for the other values (finished trials this ledger "
        "holds are reused)"
    )


def changed_settings(old: StudySpec, new: StudySpec) -> str:
    """The trial settings (`base`) an extension changes, as `field: old → new`; empty when none."""
    keys = sorted(set(old.base) | set(new.base))
    return ", ".join(
        f"{k}: {old.base.get(k, '(default)')} → {new.base.get(k, '(default)')}"
        for k in keys
        if old.base.get(k) != new.base.get(k)
    )


def retrained_message(again: Sequence[tuple[Trial, TrialSpec]], old: StudySpec, new: StudySpec) -> str:
    """Why an extension would train the study's trials `again` (`retrained`), each cause that applies
    with its fix: the extension's settings, a plugin's code (their provenance against the code loaded
    now, as `memsweep compare` reads it), or the trainer version."""
    now = {r.id: hash_today(r.config) for r, _ in again}  # each row's config, today
    causes: list[str] = []
    fixes: list[str] = []
    moved = sum(now[r.id] is not None and now[r.id] != t.config_hash for r, t in again)
    if moved:
        changed = changed_settings(old, new)
        causes.append(
            f"{part_of(moved, len(again))}the extension changes their settings ({changed})"
            if changed
            else f"{part_of(moved, len(again))}their settings now resolve otherwise (a preset's settings changed)"
        )
        fixes.append(
            "create a new study with the new settings (memsweep compare sets two studies side by side; "
            "finished trials this ledger holds are reused)"
            + (
                ", or make a setting a dimension of its space (space: {dims: {field: [old, new]}})"
                if new.preset is None
                else ""  # a preset's dimensions are its paper's: another setting cannot become one
            )
        )
    remade = [r for r, _ in again if now[r.id] != r.config_hash]  # made under another identity
    if remade:
        code, fix = other_code(remade, len(again))
        causes += code
        fixes.append(fix)
    advice = "; or ".join(fixes)
    return (
        f"extend would train {len(again)} of the study's trials again beside their results: "
        f"{'; '.join(causes)}, and the study's tables would count both as seeds of one point. "
        f"{advice[:1].upper()}{advice[1:]}"
    )


def draws_otherwise(old: SearchSpace, new: SearchSpace, settings: Mapping[str, Any]) -> bool:
    """Whether a sampled study's extension would train a point otherwise than its old points were:
    each model of both spaces, at its old first point, resolved under each (its settings written out
    or left to their defaults alike)."""
    for model in new.models:
        before = next((m for m in old.models if m.name == model.name), None)
        if before is None or set(before.dims) != set(model.dims):
            continue  # a new model, or other dimensions: new points, nothing to compare with
        point = first_point(before)
        hashes = {
            materialize({**space.base, **m.fixed, **point, **settings, "seed": 1}).config_hash()
            for space, m in ((old, before), (new, model))
        }
        if len(hashes) > 1:
            return True
    return False


#: a line of a traceback's text that names what was raised: `package.module.NameError: its message`
RAISED = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt))(?:: (.*))?$")
#: what follows a ledger outage (`service.store.patience.outage`) in the error of the study it paused
OUTAGE_STUDY_NOTE = (
    "the study is pending and its trials spent no attempt: its server (or `memsweep run`) resumes it once "
    "the ledger answers; if that process stops first, its next start or `memsweep resume {id}` does"
)


def run_error(exc: BaseException) -> str:
    """A run's error in one line a person can read (the traceback is the log's): a ledger outage past its
    patience as such (`outage`), else what was raised first. Ray Tune re-raises a callback's error as a
    TuneError whose text is that error's traceback, the error itself chained to it, or only in that text:
    then its last exception line."""
    down = outage(exc)
    if down is not None:
        return down
    embedded = "Traceback (most recent call last):"
    seen: set[int] = set()
    while embedded in str(exc) and (exc.__cause__ or exc.__context__) is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]  # not None: the loop's test
    name, lines = type(exc).__name__, str(exc).strip().splitlines()
    if embedded in str(exc):
        raised = [
            m for line in lines if (m := RAISED.match(line.rstrip())) and embedded not in (m.group(2) or "")
        ]
        if raised:
            name, lines = raised[-1].group(1), [raised[-1].group(2) or ""]
    first = lines[0].strip() if lines else ""
    return f"{name}: {first[:500]}" if first else name


@contextlib.contextmanager
def closing(book: TrialBook) -> Iterator[None]:
    """What the block leaves running when it raises (Ray's own failure, a ledger outage past its
    patience inside a callback) goes back to `pending` with the cause in one line, before the study
    stops: not left `running` without one, nor charged an attempt (the run's error, not the trial's;
    it said "attempt 1 of 3; it runs again" while nothing ran it again). A result that came while the
    ledger did not answer is kept for the study's next run here (`TrialBook.pause_unfinished`)."""
    try:
        yield
    except BaseException as exc:
        down = outage(exc)
        if down is not None:  # its runner resumes the study once the ledger answers (`service.runner`)
            book.pause_unfinished(f"{down}; {OUTAGE_NOTE}")
        else:  # the study fails: a user resumes it
            book.pause_unfinished(
                f"the study's run stopped ({run_error(exc)}); pending, no attempt spent: it trains when "
                f"the study is resumed (`memsweep resume {book.study_id}`)"
            )
        raise


class Engine:
    """The study lifecycle over one ledger. `executor` runs the units (default: Ray Tune) and
    `tracker` makes the MLflow seam for a tracking URI (default: `Tracker`); tests pass stand-ins."""

    def __init__(
        self,
        settings: Settings,
        *,
        executor: Executor | None = None,
        tracker: Callable[[str], Tracker] | None = None,
    ) -> None:
        self.settings = settings
        settings.home.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger(settings.resolved_database_url())
        self._tracking_uri: str | None = None
        self._executor = executor
        self.new_tracker = tracker or self._tracker
        #: the recorder of each study this engine runs (its pace: `StudyRecorder.eta`)
        self.progress: dict[str, StudyRecorder] = {}
        #: per study, the results a run could not write (the ledger did not answer), on disk under the
        #: home's unwritten/ (`service.study.kept`): its next run's first, in this process or the next
        self.unwritten: dict[str, KeptResults] = {}

    def _tracker(self, uri: str) -> Tracker:
        s = self.settings
        return Tracker(
            uri,
            s.mlflow_experiment,
            live_interval=s.mlflow_live_interval,
            artifacts=s.home / "mlflow" / "mlartifacts",
        )

    @property
    def executor(self) -> Executor:
        if self._executor is None:  # Ray Tune is imported when a study first runs, not before
            # and Ray with it: its token and signal handler set first, whoever built this engine (a
            # script or a test, not only `memsweep` and the app)
            prepare_ray_process(self.settings)
            from service.study.ray_tune import RayTune

            self._executor = RayTune(self.settings)
        return self._executor

    def node_memory(self, resources: Mapping[str, float]) -> tuple[str, int] | None:
        """A node's memory for a unit of these resources (which sizes its bundles), as the run and
        the plan of a study both pack with it."""
        return self.executor.node_memory(resources)

    # ----- creation --------------------------------------------------------------------------------
    def create_study(
        self, spec: StudySpec, nodes: NodePlugins | None = None, idempotency_key: str | None = None
    ) -> Study:
        """Check the spec (its space, the plugins it uses: their contracts, and with `nodes` each Ray node's
        versions) and put the study and its trials in the ledger, bound to the request's claimed
        `idempotency_key` when it has one (one transaction)."""
        if spec.space is not None:
            spec.space.check_model_names()
        space = self.space(spec)
        check_numbers_as_text(space)
        admit_plugins(space, nodes)
        trials = study_trials(spec, space)
        name, stored = spec.name or space.name, spec.model_dump(mode="json")
        return self.ledger.create_study(name, stored, trials, key=idempotency_key)

    def extend_study(self, study_id: str, spec: StudySpec, nodes: NodePlugins | None = None) -> int:
        """Replace the study's spec with a larger one; only points not yet in the ledger are added.
        Returns how many; an extension that adds nothing (and, sampled, no budget) changes nothing."""
        study = self.ledger.study(study_id)
        old = study.validated_spec()
        if old.sampler != spec.sampler:
            raise StudyError("extend keeps the sampler; create a new study to change it")
        if spec.sampler != "grid" and (spec.max_trials or 0) < (old.max_trials or 0):
            raise StudyError(  # it answered the difference, a negative count of trials added, and kept the spec
                f"extend only adds to a sampled study's budget: max_trials {spec.max_trials} is below the "
                f"study's {old.max_trials} (the trials it drew stay in it). Give max_trials above "
                f"{old.max_trials} to draw more, or leave it out; to run fewer, cancel the study"
            )
        if old.resources.cpus != spec.resources.cpus:  # every point again, at another thread count
            raise StudyError(
                f"extend keeps resources.cpus ({old.resources.cpus:g}): a trial's threads are its unit's CPUs "
                "and part of its identity (they move its numbers' rounding), so the study's points would "
                "all be added again at the new count; leave cpus out, or create a new study to run on "
                f"{spec.resources.cpus:g}"
            )
        space = self.space(spec)
        admit_plugins(space, nodes)
        trials = study_trials(spec, space)
        rows = self.ledger.trials(study.id)
        again = retrained(rows, trials)
        if again:
            raise StudyError(retrained_message(again, old, spec))
        dropped = dropped_values(rows, trials) if spec.sampler == "grid" else {}
        if dropped:
            raise StudyError(dropped_message(dropped, space.seeds))
        if spec.sampler != "grid" and list(self.space(old).seeds) != list(space.seeds):
            raise StudyError(
                f"extend keeps a sampled study's seeds ({', '.join(map(str, self.space(old).seeds))}): each "
                "drawn point runs once per seed, and new seeds would reach only the points drawn after, "
                "leaving its points with unequal seeds. Create a new study with the new seeds (the "
                "ledger's finished trials are reused), or extend max_trials to draw more points"
            )
        drawn_otherwise = drawn_under_other_code(rows, "extend") if spec.sampler != "grid" else None
        if drawn_otherwise:
            raise StudyError(drawn_otherwise)
        if spec.sampler != "grid" and draws_otherwise(self.space(old), space, execution(spec)):
            changed = changed_settings(old, spec) or "a preset model's settings"
            raise StudyError(
                f"extend keeps the settings a sampled study draws its points under ({changed}): its "
                "sampler's history and its tables would mix the two. Create a new study with them"
            )
        added = self.ledger.add_trials(study.id, trials)
        more_budget = spec.sampler != "grid" and (spec.max_trials or 0) > (old.max_trials or 0)
        if added or more_budget:
            self.ledger.update_study(study.id, spec=spec.model_dump(mode="json"), state="pending")
        return added if spec.sampler == "grid" else (spec.max_trials or 0) - (old.max_trials or 0)

    def _release(self, study_id: str, held: Held, quiet: bool = False) -> None:
        """The trials a round reserved and never started, `pending` again (as they were: no reason, their
        evaluations kept). After a round that raised (`quiet`) too: they stayed `running`, a live
        process's rows read as a dead one's until the study's next claim; a failure to write is then
        logged, not raised over the round's error (which says more: a lost claim, rewrapped by Ray)."""
        if not held.reserved:
            return
        try:
            self.ledger.pend_running(study_id, sorted(held.reserved), None, forget_history=False)
        except Exception as exc:
            if not quiet:
                raise
            log.warning(
                "study %s: its reserved trials stay running (%s: %s)", study_id, type(exc).__name__, exc
            )

    def pend_orphans(self, study_id: str) -> list[str]:
        """The study's trials a process that died left `running`, back to `pending` (ORPHAN_NOTE, their
        evaluations forgotten): this run's to train. Only under the study's claim (`StudyClaim`: no
        other process runs it, and no run of it here has started yet) — the runner calls it as soon as
        it claims the study, before Ray, MLflow and the plan come up (they read `running` for that long
        after a restart), and `run_study` again as it starts; a study it queues behind another has them
        `pending` already, once no live process holds it (`Ledger.pend_orphans`). The config hashes it
        sent back."""
        return self.ledger.pend_running(study_id, None, ORPHAN_NOTE)

    def space(self, spec: StudySpec) -> SearchSpace:
        """The study's space, checked (`search.study_space`) under this engine's grid limit."""
        return study_space(spec, self.settings.max_grid_size)

    # ----- execution -------------------------------------------------------------------------------
    def tracking_uri(self, restart: bool = False) -> str:
        """The MLflow tracking URI: the configured one, or the local server's (started when it does not
        answer: at the first call, and again with `restart` once it died, on the port running studies
        write to)."""
        if self._tracking_uri is None or restart:
            s = self.settings
            keep = port_of(self._tracking_uri) if restart and self._tracking_uri else None
            self._tracking_uri = ensure_mlflow_server(s.mlflow_tracking_uri, s.home, s.mlflow_port, keep)
        return self._tracking_uri

    def run_study(
        self, study_id: str, *, stop: Stop | None = None, units: Sequence[Unit] | None = None
    ) -> dict[str, Any]:
        """Run every trial of the study that is not finished; returns the study summary, with the
        run's `seconds` by phase and the `units` it packed (their members' config hashes).

        `stop`: stops the run (from another thread); unfinished trials stay resumable. A user's cancel
        (`Stop.cancel`) ends the study and its running trials `cancelled`; its process stopping
        (`Stop.shut_down`: a server's shutdown, a Ctrl-C) ends both `pending` instead, saying so
        (`SHUTDOWN_NOTE`), for the next start to resume; one cause for all, read once at the end.
        `units`: the unfinished trials as a plan packed them just before (`service.runner`); used when
        they are exactly the trials this run takes up, else the run packs them."""
        study = self.ledger.study(study_id)
        spec = study.validated_spec()
        space = self.space(spec)
        stop = stop if stop is not None else Stop()
        drawn_otherwise = (
            None if spec.sampler == "grid" else drawn_under_other_code(self.ledger.trials(study.id), "a run")
        )
        if drawn_otherwise:  # (the server's door refuses its resume: a `memsweep run --study` comes here)
            raise StudyError(drawn_otherwise)
        tracker, mlflow, note = self._open_tracking(study, spec)
        try:
            self.ledger.update_study(
                study.id,
                state="running",
                error=note,
                mlflow_experiment_id=mlflow.experiment_id or None,
                mlflow_run_id=mlflow.parent_run_id or None,
            )
        except ClaimLostError:
            tracker.close()
            raise
        marks = [time.perf_counter()]
        try:
            recorder = StudyRecorder(self.ledger, tracker, study.id, mlflow)
            self.progress[study.id] = recorder
            recorder.progress(force=True)  # the parent's counts from the start (and right after a resume)
            ran = self._run_units(study, spec, space, recorder, stop, units)
            if self.ledger.claim_lost(study.id):  # stopped by the beat that found it: not a cancel
                raise ClaimLostError(f"study {study.id} was taken over by another process; this run stopped")
            state = stop.settle() or "done"
        except Exception as exc:
            if self.ledger.claim_lost(study.id):  # another process runs it now: its state is that one's
                tracker.close()
                if isinstance(exc, ClaimLostError):
                    raise
                raise ClaimLostError(  # Ray Tune re-raises a callback's error as a TuneError of its text
                    f"study {study.id} was taken over by another process; this run stopped "
                    f"({type(exc).__name__})"
                ) from exc
            # stopping for a shutdown, its trials were left pending for the next start: so is the study,
            # the error kept (`failed` is never resumed, while its trials said the next start would); a
            # study its user cancelled ends cancelled, as its trials did. The ledger not answering past its
            # patience leaves it pending too, for its runner to resume once it answers (`service.runner`)
            down = outage(exc)
            if down is None:
                log.exception("study %s failed", study.id)
                state, error = stop.settle() or "failed", run_error(exc)
            else:
                log.error("study %s stopped: %s", study.id, down, exc_info=exc)
                state, error = stop.settle() or "pending", f"{down}; {OUTAGE_STUDY_NOTE.format(id=study.id)}"
            try:  # (a ledger still down raises here: its runner waits for it all the same)
                self.ledger.update_study(study.id, state=state, error=error)
            finally:
                tracker.close()
            raise
        finally:
            self.progress.pop(study.id, None)
        marks.append(time.perf_counter())
        summary, errors = finish_in_mlflow(self.ledger, study.id, tracker, mlflow, state, marks)
        phases = dict(zip(RUN_PHASES, (b - a for a, b in pairwise(marks)), strict=True))
        log.info("study %s: %s", study.id, ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()))
        note = SHUTDOWN_NOTE if state == "pending" else None  # an MLflow error first: the repair needs it
        self.ledger.update_study(study.id, state=state, error=tracking_error(study.id, errors) or note)
        summary["state"] = state
        summary["seconds"] = phases
        summary["units"] = ran
        return summary

    def _open_tracking(self, study: Study, spec: StudySpec) -> tuple[Tracker, StudyContext, str | None]:
        """(tracker, the study's MLflow context, note) of a study about to run. When MLflow does not
        answer (or its local server cannot start), the study trains all the same (issue 35): the
        ledger keeps every result, its MLflow writes fail fast and are counted, and once MLflow answers
        the server's repair (`sync_tracking`) makes its runs; the note says so meanwhile (ids: the
        study's earlier ones, or empty)."""
        uri = (  # where this home's runs go: never another home's server on the configured port
            self.settings.mlflow_tracking_uri
            or self._tracking_uri
            or home_uri(self.settings.home, self.settings.mlflow_port)
        )
        try:
            uri = self.tracking_uri()
            tracker = self.new_tracker(uri)
            exp_id, parent = tracker.start_study(study.id, study.name, study.spec, study.mlflow_run_id)
            return tracker, StudyContext(exp_id, parent, spec.criterion()), None
        except Exception as exc:
            cause = (
                f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
            )
            log.warning(
                "study %s: MLflow at %s does not answer (%s); the study trains all the same",
                study.id,
                uri,
                cause,
            )
            note = (
                f"MLflow: {uri} did not answer when the study started ({cause}); it trains all the same, the "
                "ledger keeps every result, and its MLflow runs are made once MLflow answers"
            )
            earlier = StudyContext(
                study.mlflow_experiment_id or "", study.mlflow_run_id or "", spec.criterion()
            )
            return self.new_tracker(uri), earlier, note

    def _run_units(
        self,
        study: Study,
        spec: StudySpec,
        space: SearchSpace,
        record: StudyRecorder,
        stop: Stop,
        packed: Sequence[Unit] | None,
    ) -> list[list[str]]:
        """The study's trials through the executor: its unfinished trials packed into units, round
        after round while an infrastructure fault sends some back (each at most `trial_attempts` starts
        in this run); a sampled study's, before its sampler draws what its budget leaves beside the
        points it holds (`points_left`: an interrupted point trains first, and the sampler draws
        knowing its result), and again after (what a fault sent back of the draws). The packed units
        it ran, as their members' config hashes."""
        self.executor.start()
        resources = {"cpu": spec.resources.cpus, "gpu": spec.resources.gpus}
        why = self.executor.unplaceable(resources)
        if why is not None:
            raise StudyError(why)
        admit_plugins(space, self.executor.node_plugins)  # the nodes may have changed since the door
        attempts = self.settings.trial_attempts
        self.pend_orphans(study.id)  # the runner did at its claim; a caller without one, here
        book = TrialBook(
            self.ledger, study.id, record, stop, sampled=spec.sampler != "grid", attempts=attempts,
            kept=self.unwritten.setdefault(study.id, KeptResults(self.settings.home / "unwritten" / study.id)),
        )  # fmt: skip
        if written := book.write_kept():  # a run the ledger failed could not: written, not trained again
            log.info("study %s: %d results a ledger outage held back are written", study.id, len(written))
        request = RunRequest(
            f"study-{study.id}", resources, spec.concurrency, stop.event,
            asha=spec.asha if spec.scheduler == "asha" else None,
        )  # fmt: skip
        ran: list[list[str]] = []
        measured = None
        held = Held()  # what a round's dispatches reserved, took and left to others
        rounds_request = request
        if spec.scheduler == "fifo":
            rounds_request = replace(
                request,
                dispatch=self._dispatch(study, record, held),
                tick=self._take_meanwhile(study, record, held),
            )

        def rounds() -> None:
            """The study's unfinished trials packed into units, round after round until none is left."""
            nonlocal packed, measured
            request = rounds_request
            idle = 0  # rounds in a row that moved no trial on
            while not stop.event.is_set():
                # pending, interrupted by a fault (pending again), cancelled, error
                try:
                    rows = [
                        t for t in self.ledger.trials(study.id, UNFINISHED) if not book.spent(t.config_hash)
                    ]
                    todo = [t.spec() for t in rows]
                except StaleTrialError as exc:
                    raise StudyError(str(exc)) from None
                todo, waits = self._not_trained_elsewhere(study, spec, todo, record)
                if spec.scheduler == "asha":
                    todo = self._pruned_with_their_points(study.id, todo, book)
                if not todo and not waits:
                    return
                if todo:
                    if book.requeued:  # a fault sent them back, and the executor did not run them again
                        log.warning(
                            "study %s: %d trials were interrupted; they run again", study.id, len(todo)
                        )
                    if packed is not None and sorted(
                        m.config_hash for u in packed for m in u.members
                    ) == sorted(t.config_hash for t in todo):
                        units = list(packed)  # packed by the plan just before, as this run packs them
                    else:
                        if measured is None and spec.sizes_bundles:
                            measured = self.node_memory(resources)
                        units = pack_study(spec, todo, measured)
                    if spec.scheduler == "asha":
                        units = self._with_finished_seeds(study.id, units)
                    packed = None
                    log.info("study %s: %d trials in %d Ray units", study.id, len(todo), len(units))
                    record.expect(todo)
                    book.begin_round()
                    held.clear()
                    starts = sum(book.starts.values())
                    try:
                        self._execute(
                            replace(request, units=units, asha_history=self._asha_history(spec, study.id)),
                            book,
                        )
                    except BaseException:  # the round's error stands: the release is only logged if it fails
                        self._release(study.id, held, quiet=True)
                        raise
                    self._release(study.id, held)  # reserved by units that never started (a cancel)
                    dropped = held.taken | held.deferred
                    ran.extend(
                        kept
                        for u in units
                        if (kept := [m.config_hash for m in u.members if m.config_hash not in dropped])
                    )
                    moved = sum(book.starts.values()) > starts or held.taken or held.deferred
                    idle = 0 if moved else idle + 1
                    if (
                        idle >= 2
                    ):  # nothing started, nothing taken or left to others: it would go round for ever
                        raise StudyError(
                            f"study {study.id}: {len(todo)} trials were packed in two rounds and none started; "
                            "resume it once the cluster can run its units (`memsweep resume ID`)"
                        )
                if waits:  # then what they leave unfinished is this study's to train, next round
                    wait_for_others(
                        self.ledger, study, waits, stop.event, lambda n: record.progress(force=True)
                    )
                    record.took(waits)  # those that took the other study's result meanwhile

        try:
            if book.sampled:
                # the points it holds unfinished first (a crash or a fault interrupted them): the sampler
                # then draws knowing their results, and never draws one of them again
                rounds()
                trials = self.ledger.trials(study.id)
                left = points_left(spec, space, trials)
                if left > 0 and not stop.event.is_set():
                    known = partial(self.ledger.finished_objectives, study.id)
                    finished = [t for t in trials if t.status in FINISHED]
                    draws = sampling(spec, space, finished, left, known)
                    self._execute(
                        replace(request, sampling=draws, asha_history=self._asha_history(spec, study.id)),
                        book,
                    )
            rounds()  # what is left unfinished (a fault sent back some of the draws)
        finally:  # the stop's cause, read once, on an error too: what a shutdown paused before its user's
            book.settle()  # cancel ends cancelled with the rest
        return ran

    def _not_trained_elsewhere(
        self, study: Study, spec: StudySpec, todo: list[TrialSpec], record: StudyRecorder
    ) -> tuple[list[TrialSpec], dict[str, str]]:
        """(the trials this round trains, those it waits for: config hash → the study training them)
        (`service.study.elsewhere`): a trial another study finished `done` since this one made it
        takes that result; under fifo, one another study trains now is waited for. (Under asha a
        point's seeds train as one unit and are judged together: it takes results, and waits for none.)"""
        hashes = [t.config_hash for t in todo]
        if spec.scheduler == "fifo":
            taken, waits = look_elsewhere(self.ledger, study.id, hashes)
        else:
            taken, waits = set(self.ledger.take_results(study.id, hashes)) if hashes else set(), {}
        if taken:
            log.info(
                "study %s: %d trials take the results another study has since finished", study.id, len(taken)
            )
            record.took(taken)
            record.progress(force=True)
        return [t for t in todo if t.config_hash not in taken and t.config_hash not in waits], waits

    def _dispatch(self, study: Study, record: StudyRecorder, held: Held) -> Callable[[Unit], Unit | None]:
        """A unit as it leaves the queue (`RunRequest.dispatch`), holding only the members it reserved:
        a member another study has finished since the round began takes that result, one another live
        study holds running (reserved, or training) is left to it (waited for after the round), and
        the rest are marked running here at once (`Ledger.reserve_trials`), before the unit's worker
        starts; None when none is left. The first study to reserve a trial trains it
        (`service.study.elsewhere`). What each dispatch did is added to `held`."""

        def dispatch(unit: Unit) -> Unit | None:
            hashes = [m.config_hash for m in unit.members]
            taken = set(self.ledger.take_results(study.id, hashes))
            reserved = self.ledger.reserve_trials(study.id, [h for h in hashes if h not in taken], alive)
            deferred = set(hashes) - taken - reserved
            held.reserved |= reserved
            held.taken |= taken
            held.deferred |= deferred
            if taken or deferred:
                record.unexpect(taken | deferred)
                if taken:
                    record.took(taken)
                    record.progress(force=True)
                log.info(
                    "study %s: of a unit's %d trials, %d took another study's results and %d are another "
                    "study's to train now",
                    study.id, len(hashes), len(taken), len(deferred),
                )  # fmt: skip
            keep = [m for m in unit.members if m.config_hash in reserved]
            if len(keep) == len(unit.members):
                return unit
            return bundle(keep, fused=unit.fused, lockstep=unit.lockstep) if keep else None

        return dispatch

    def _take_meanwhile(self, study: Study, record: StudyRecorder, held: Held) -> Callable[[], None]:
        """`RunRequest.tick`: at most every POLL_SECONDS, the trials a round's units left to other
        studies (`held.deferred`) take the results those studies have finished since, while the round
        runs (they stayed pending until it ended)."""
        due = 0.0

        def tick() -> None:
            nonlocal due
            now = time.monotonic()
            if not held.deferred or now < due:
                return
            due = now + elsewhere.POLL_SECONDS
            taken = set(self.ledger.take_results(study.id, sorted(held.deferred)))
            if taken:
                held.deferred -= taken
                held.taken |= taken
                record.took(taken)
                log.info(
                    "study %s: %d trials took the results another study has just finished",
                    study.id,
                    len(taken),
                )
                record.progress(force=True)

        return tick

    def _asha_history(self, spec: StudySpec, study_id: str) -> list[dict[int, float]]:
        """Under asha, the study's points whose every seed has finished, each its objective by
        evaluations (`rung_means`): the rungs a run's scheduler starts with (`RunRequest`)."""
        if spec.scheduler != "asha":
            return []
        points: dict[Any, list[Trial]] = {}
        for t in self.ledger.trials(study_id):
            points.setdefault(point_key(t.model, t.params), []).append(t)
        return [rung_means(seeds) for seeds in points.values() if all(t.status in FINISHED for t in seeds)]

    def _pruned_with_their_points(
        self, study_id: str, todo: list[TrialSpec], book: TrialBook
    ) -> list[TrialSpec]:
        """Under asha, the seeds added to a point the scheduler stopped in an earlier run are pruned
        with it, untrained (as in a study that had them from its start); the rest of `todo`."""
        stopped = stopped_points(self.ledger.trials(study_id, [TrialStatus.PRUNED]))
        added = [t for t in todo if point_key(t.model, t.params) in stopped]
        if added:
            with closing(book):
                book.prune_unstarted(
                    f"added-to-pruned-{study_id}", Unit(tuple(added)),
                    "its point was stopped early by the scheduler before this seed was added; not trained",
                )  # fmt: skip
            log.info(
                "study %s: %d seeds added to points asha stopped before are pruned with them",
                study_id,
                len(added),
            )
        return [t for t in todo if t not in added]

    def _with_finished_seeds(self, study_id: str, units: Sequence[Unit]) -> list[Unit]:
        """Under asha a point is judged on the mean of all its seeds: a point's unit counts the seeds
        that finished in an earlier run or round (`Unit.known`), as a sampled point met again does."""
        seeds: dict[Any, dict[str, Known]] = {}
        for t in self.ledger.trials(study_id, FINISHED):
            seeds.setdefault(point_key(t.model, t.params), {})[t.config_hash] = known_of(t)
        return [
            replace(u, known=seeds.get(point_key(u.members[0].model, u.members[0].params), {})) for u in units
        ]

    def _execute(self, request: RunRequest, book: TrialBook) -> None:
        """The executor's run of a round (`closing`)."""
        with closing(book):
            self.executor.run(request, book)

    def sync_tracking(self, study_id: str) -> dict[str, Any]:
        """Rebuild the study's MLflow runs from the ledger, the source of truth: the parent run (made
        again if MLflow lost it), a complete child run for every finished trial (an incomplete one, left
        by an outage, is made again; one no trial owns is deleted), and the summary. Returns the study
        summary, with `mlflow_errors` (empty when MLflow now agrees with the ledger). It holds the
        study's claim while it rebuilds (`StudyClaim.for_sync`): `StudyBusyError` while a run holds it."""
        with StudyClaim.for_sync(self.ledger, study_id):
            return self._sync_tracking(study_id)

    def _sync_tracking(self, study_id: str) -> dict[str, Any]:
        study = self.ledger.study(study_id)
        spec = study.validated_spec()
        uri = self.tracking_uri()
        down = (
            None if not uri.startswith("http") or server_healthy(uri) else f"MLflow at {uri} does not answer"
        )
        try:  # a quick probe first: MLflow's client retries a refused connection for a minute or more
            if down:
                raise ConnectionError(down)
            tracker = self.new_tracker(uri)
            exp_id, parent = tracker.start_study(study.id, study.name, study.spec, study.mlflow_run_id)
        except Exception as exc:  # nothing to rebuild on yet; the ledger keeps every result
            summary = self.summary(study.id)
            summary["mlflow_errors"] = [down or f"{type(exc).__name__}: {exc}"]
            return summary
        self.ledger.update_study(study.id, mlflow_experiment_id=exp_id, mlflow_run_id=parent)
        state = study.state if study.state in FINAL else "cancelled"
        mlflow = StudyContext(exp_id, parent, spec.criterion())
        summary, errors = finish_in_mlflow(self.ledger, study.id, tracker, mlflow, state, [])
        if study.state != "running":
            self.ledger.update_study(study.id, error=tracking_error(study.id, errors))
        summary["mlflow_errors"] = errors
        return summary

    # ----- answers -----------------------------------------------------------------------------------
    def summary(self, study_id: str, criterion: Criterion | None = None) -> dict[str, Any]:
        """What the study found, under its own criterion (or `criterion`): `reports.study_summary`."""
        return summarise(self.ledger, self.ledger.study(study_id), criterion)
