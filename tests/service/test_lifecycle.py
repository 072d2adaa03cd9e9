"""The study lifecycle, fast: the real `Engine`, ledger, recorder, packing and trainers, with the two
outside systems replaced by in-process stand-ins that keep their contracts — an executor that runs
each unit in this process and tells the driver's `TrialBook` (as Ray Tune's callback does), and a
tracker that keeps MLflow's runs in memory. The integration tiers (test_engine, test_api, the
compose tier) run the same lifecycle on a real Ray and a real MLflow server."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState

import trainers
from service.application.study_service import StudyService
from service.cli.commands import _create_or_extend
from service.cli.parser import build_parser
from service.core.errors import StudyError
from service.core.settings import Settings
from service.core.spec import StudySpec
from service.core.trial import Finished, Unit
from service.study.book import Stop, TrialBook
from service.study.engine import Engine
from service.study.executor import RunRequest, Task, TaskResult
from service.study.search import Draws, sampling
from service.study.worker import train_unit
from tests.service.conftest import TINY
from trainers import plugins


class InProcess:
    """An executor that runs each unit here, one after another, telling the driver's book what
    happens as an executor must (`TrialBook`'s lifecycle): started, reported, then ended — or failed,
    when `dies(unit, start)` says the unit's worker dies before it reports (an infrastructure fault),
    or without having started, when `dies_before_start(unit, attempt)` says it dies while Ray places it.
    A sampler's draws are taken one unit at a time (`Draws`), as Ray Tune's searcher takes them."""

    def __init__(
        self,
        dies: Callable[[Unit, int], bool] = lambda unit, start: False,
        dies_before_start: Callable[[Unit, int], bool] = lambda unit, attempt: False,
    ) -> None:
        self.dies = dies
        self.dies_before_start = dies_before_start  # Ray's actor died while placed or importing
        self.rounds: list[list[list[str]]] = []  # each run's units, as their members' hashes
        self.after_unit: Callable[[], None] = lambda: None

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def unplaceable(self, resources: Mapping[str, float]) -> str | None:
        return None if resources.get("gpu", 0) == 0 else "no node of this process has a GPU"

    def resources(self) -> Mapping[str, float] | None:
        return None  # no cluster

    def run_tasks(
        self, tasks: Sequence[Task], resources: Mapping[str, float], slots: int, timeout: float,
        cancel: threading.Event | None = None,
    ) -> list[TaskResult | None]:  # fmt: skip
        out: list[TaskResult | None] = []
        for task in tasks:
            try:
                out.append(
                    None if cancel is not None and cancel.is_set() else TaskResult(task.fn(*task.args))
                )
            except Exception as exc:
                out.append(TaskResult(error=exc))
        return out

    def node_plugins(self) -> Mapping[str, Mapping[str, str]] | None:
        return None  # one process: its own plugins

    def node_memory(self, resources: Mapping[str, float]) -> tuple[str, int] | None:
        return None  # the packer's defaults

    def run(self, request: RunRequest, book: TrialBook) -> None:
        if request.sampling is None:
            units = list(request.units)
            self.rounds.append([[m.config_hash for m in u.members] for u in units])
            for i, queued in enumerate(units):
                if request.cancel.is_set():
                    break
                unit = queued if request.dispatch is None else request.dispatch(queued)
                if unit is not None:
                    self._unit(f"{request.name}-{len(self.rounds)}-{i}", unit, book)
                if request.tick is not None:
                    request.tick()
        else:
            draws, drawn = Draws(request.sampling), list[list[str]]()
            self.rounds.append(drawn)
            for i in range(request.sampling.count):
                if request.cancel.is_set():
                    break
                unit = draws.ask(key := f"{request.name}-draw-{i}")
                drawn.append([m.config_hash for m in unit.members])
                draws.tell(key, self._unit(key, unit, book))
        book.close_unfinished("its unit ended before this member reported")

    def _unit(self, run: str, unit: Unit, book: TrialBook) -> float | None:
        """Run one unit; its last reported objective (None when its worker died)."""
        attempt = 1 + max(book.starts.get(m.config_hash, 0) for m in unit.members)
        if self.dies_before_start(unit, attempt):  # Tune errs the trial without having started it
            book.failed(run, "its worker failed: the worker process died", unit)
            return None
        book.started(run, unit)
        start = max(book.starts.get(m.config_hash, 0) for m in unit.members)
        if self.dies(unit, start):
            book.failed(run, "its worker failed: the worker process died")
            return None
        reports: list[dict[str, Any]] = []

        def report(result: dict[str, Any]) -> None:
            reports.append(result)
            book.reported(run, result["events"])

        train_unit(unit, report, node="in-process")
        book.ended(run)
        self.after_unit()
        return float(reports[-1]["objective"])


class MemoryTracker:
    """MLflow's runs in memory: a parent per study, a child per trial (made at its start, finished
    with its result), the parent's summary and status."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.runs: dict[str, dict[str, Any]] = {}
        self.summaries: list[tuple[str, str]] = []  # (parent, status)

    def _new(self, **fields: Any) -> str:
        run_id = f"run-{len(self.runs)}"
        self.runs[run_id] = {"status": "RUNNING", **fields}
        return run_id

    def start_study(self, study_id: str, name: str, spec: Any, run_id: str | None) -> tuple[str, str]:
        if run_id is None or run_id not in self.runs:
            run_id = self._new(study=study_id)
        return "exp-0", run_id

    def trial_started(self, study: Any, row: Any, set_run_id: Callable[[str], None]) -> None:
        set_run_id(self._new(parent=study.parent_run_id, trial=row.config_hash, trial_status="running"))

    def trial_evaluated(self, config_hash: str, evaluations: Any) -> None:
        pass

    def trial_stopped(self, config_hash: str, status: str, reason: str) -> None:
        for run in self.runs.values():
            if run.get("trial") == config_hash and run["status"] == "RUNNING":
                run.update(status="KILLED", reason=reason, trial_status=status)

    def trial_restated(self, trial: Any, status: str, reason: str) -> None:
        if trial.mlflow_run_id in self.runs:
            self.runs[trial.mlflow_run_id].update(reason=reason, trial_status=status)

    def log_trial(self, study: Any, row: Any, matrices: Any, set_run_id: Callable[[str], None]) -> None:
        run_id = (
            row.mlflow_run_id if row.mlflow_run_id in self.runs else self._new(parent=study.parent_run_id)
        )
        self.runs[run_id].update(
            status="FINISHED", trial=row.config_hash, loss=row.final_val_loss, trial_status=row.status
        )
        set_run_id(run_id)

    def study_progress(self, parent: str, table: Any) -> None:
        pass

    def log_summary(self, parent: str, summary: Any, figures: Any, status: str) -> None:
        self.runs[parent]["status"] = status
        self.summaries.append((parent, status))

    def flush(self) -> list[str]:
        return []

    def close(self) -> None:
        pass

    def abandon(self, why: str) -> list[str]:
        return [why]

    def child_statuses(self, exp_id: str, parent: str) -> dict[str, tuple[str, str | None]]:
        return {
            k: (r["status"], r.get("trial_status")) for k, r in self.runs.items() if r.get("parent") == parent
        }

    def delete_run(self, run_id: str) -> None:
        self.runs.pop(run_id, None)


def grid(**kw: Any) -> StudySpec:
    data = {
        "name": "lifecycle",
        "space": {
            "models": {
                "chain": {"fixed": {"init": "chain"}, "dims": {"lr": [1e-3, 50.0]}},
                "orth": {"fixed": {"init": "orthogonal"}, "dims": {"lr": [1e-3]}},
            }
        },
        "base": {**TINY, "steps": 10, "eval_every": 5, "clip_norm": None},  # lr 50: non-finite, failed
        "seeds": [1, 2],
        "concurrency": 2,
    }
    return StudySpec.model_validate({**data, **kw})


@pytest.fixture
def make_engine(tmp_path: Path) -> Callable[..., tuple[Engine, InProcess, list[MemoryTracker]]]:
    def make(**executor: Any) -> tuple[Engine, InProcess, list[MemoryTracker]]:
        settings = Settings(home=tmp_path, mlflow_tracking_uri="memory://lifecycle", trial_attempts=2)
        trackers: list[MemoryTracker] = []

        def tracker(uri: str) -> MemoryTracker:
            trackers.append(MemoryTracker(uri))
            return trackers[-1]

        ex = InProcess(**executor)
        return Engine(settings, executor=ex, tracker=tracker), ex, trackers  # type: ignore[arg-type]

    return make


def test_a_grid_runs_each_trial_once_records_it_and_ends_done(make_engine: Any) -> None:
    engine, ex, trackers = make_engine()
    study = engine.create_study(grid())
    summary = engine.run_study(study.id)
    trials = engine.ledger.trials(study.id)
    assert summary["state"] == "done" and engine.ledger.get_study(study.id).state == "done"
    assert len(trials) == 6 and all(t.runs == 1 for t in trials)
    assert {t.status for t in trials if t.params["lr"] == 50.0} == {"failed"}
    assert {t.status for t in trials if t.params["lr"] == 1e-3} == {"done"}
    assert all(t.node == "in-process" for t in trials)
    # the units the run packed are what it reports, and every trial was in exactly one
    assert summary["units"] == ex.rounds[0]
    assert sorted(h for u in summary["units"] for h in u) == sorted(t.config_hash for t in trials)
    assert list(summary["seconds"]) == ["ray_tune", "tracking_backlog", "summary_and_plots", "parent_run"]
    # MLflow: one finished child run per trial, each named in its ledger row, the parent finished
    (tracker,) = trackers
    children = tracker.child_statuses("exp-0", study_row(engine, study.id).mlflow_run_id)
    assert sorted(children) == sorted(t.mlflow_run_id for t in trials)
    assert {status for status, _ in children.values()} == {"FINISHED"}
    assert tracker.summaries == [(study_row(engine, study.id).mlflow_run_id, "FINISHED")]
    assert summary["counts"]["done"] == 4 and summary["counts"]["failed"] == 2


def study_row(engine: Engine, study_id: str) -> Any:
    return engine.ledger.get_study(study_id)


def test_a_worker_that_dies_sends_its_members_back_once_then_they_end_as_error(make_engine: Any) -> None:
    # every unit holding an lr 1e-3 chain trial dies on its first start; those holding seed 2 of it
    # die on every start, so they end as `error` after `trial_attempts` (2) starts in this run
    def dies(unit: Unit, start: int) -> bool:
        chain = [m for m in unit.members if m.model == "chain" and m.params["lr"] == 1e-3]
        return bool(chain) and (start == 1 or any(m.params["seed"] == 2 for m in chain))

    engine, ex, trackers = make_engine(dies=dies)
    study = engine.create_study(grid(bundle_size=1))
    summary = engine.run_study(study.id)
    by = {(t.model, t.params["lr"], t.params["seed"]): t for t in engine.ledger.trials(study.id)}
    assert len(ex.rounds) == 2  # a second round for what the fault sent back
    # an interrupted start's child run ends KILLED with its reason (it stayed RUNNING for ever: here the
    # error's; the earlier starts' runs, owned by no trial, the study's end deletes)
    children = [r for r in trackers[-1].runs.values() if "trial" in r]
    assert not [r for r in children if r["status"] == "RUNNING"]
    (killed,) = [r for r in children if r["status"] == "KILLED"]
    assert killed["trial"] == by[("chain", 1e-3, 2)].config_hash and "after 2 attempts" in killed["reason"]
    assert killed["trial_status"] == "error"  # the ledger's status, as MLflow tags it
    assert by[("chain", 1e-3, 1)].status == "done" and by[("chain", 1e-3, 1)].runs == 2
    assert by[("chain", 1e-3, 2)].status == "error" and "after 2 attempts" in by[("chain", 1e-3, 2)].reason
    others = [t for k, t in by.items() if k[:2] != ("chain", 1e-3)]
    assert all(t.runs == 1 and t.status in ("done", "failed") for t in others)  # none ran twice
    assert summary["state"] == "done" and summary["counts"]["error"] == 1
    # the error is no run: the next run of the study takes it up again, and only it
    ex.dies = lambda unit, start: False
    engine.run_study(study.id)
    again = {(t.model, t.params["lr"], t.params["seed"]): t for t in engine.ledger.trials(study.id)}
    assert again[("chain", 1e-3, 2)].status == "done"
    assert ex.rounds[-1] == [[again[("chain", 1e-3, 2)].config_hash]]


def test_a_unit_whose_worker_dies_before_it_starts_runs_again_and_never_ends_the_study_pending(
    make_engine: Any,
) -> None:
    """Ray errs a trial whose actor died while it was placed or importing (seen under load: the
    device script's SIGKILL hit a worker still in `ImplicitFunc.__init__`) without ever starting it.
    Its members were left pending, uncounted, and the study ended `done` with 4 of 8 trials never
    run. Now each such death is one attempt: the unit runs again, and a unit that never starts ends
    its members as `error` after `trial_attempts`, not pending."""

    def chain_1e3(unit: Unit) -> bool:
        return any(m.model == "chain" and m.params["lr"] == 1e-3 for m in unit.members)

    engine, ex, _ = make_engine(dies_before_start=lambda unit, attempt: chain_1e3(unit) and attempt == 1)
    study = engine.create_study(grid(bundle_size=1))
    summary = engine.run_study(study.id)
    trials = engine.ledger.trials(study.id)
    assert len(ex.rounds) == 2 and sorted(h for u in ex.rounds[1] for h in u) == sorted(
        t.config_hash for t in trials if t.model == "chain" and t.params["lr"] == 1e-3
    )
    assert summary["state"] == "done" and all(t.status in ("done", "failed") for t in trials)
    assert all(t.runs == 1 for t in trials)  # started once each: the death came before a start

    never, _, _ = make_engine(dies_before_start=lambda unit, attempt: chain_1e3(unit))
    study = never.create_study(grid(bundle_size=1, name="never", seeds=[3, 4]))  # none reused
    summary = never.run_study(study.id)
    by = {(t.model, t.params["lr"], t.params["seed"]): t for t in never.ledger.trials(study.id)}
    lost = [by[("chain", 1e-3, seed)] for seed in (3, 4)]
    assert all(t.status == "error" and t.runs == 0 for t in lost), [(t.status, t.runs) for t in lost]
    assert all("before its unit started" in t.reason and "after 2 attempts" in t.reason for t in lost)
    assert summary["counts"]["error"] == 2 and summary["counts"]["pending"] == 0


def test_a_cancel_stops_the_run_and_a_resume_runs_only_what_is_left(make_engine: Any) -> None:
    engine, ex, _ = make_engine()
    study = engine.create_study(grid(bundle_size=1, concurrency=1))
    stop = Stop()
    ex.after_unit = stop.cancel  # cancelled once the first unit finished
    summary = engine.run_study(study.id, stop=stop)
    assert summary["state"] == "cancelled"
    first = [t for t in engine.ledger.trials(study.id) if t.status in ("done", "failed")]
    assert len(first) == 1
    ex.after_unit = lambda: None
    summary = engine.run_study(study.id)
    trials = engine.ledger.trials(study.id)
    assert summary["state"] == "done" and all(t.status in ("done", "failed") for t in trials)
    assert all(t.runs == 1 for t in trials)  # the finished one was not run again
    assert first[0].config_hash not in {h for u in ex.rounds[-1] for h in u}


def test_an_unplaceable_study_fails_naming_why_and_runs_nothing(make_engine: Any) -> None:
    engine, ex, _ = make_engine()
    study = engine.create_study(grid(resources={"cpus": 1, "gpus": 1}))
    with pytest.raises(Exception, match="no node of this process has a GPU"):
        engine.run_study(study.id)
    row = engine.ledger.get_study(study.id)
    assert row.state == "failed" and "GPU" in row.error and ex.rounds == []
    assert {t.status for t in engine.ledger.trials(study.id)} == {"pending"}


def test_a_run_trains_the_units_its_plan_packed_and_packs_only_what_changed(
    make_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner plans, then runs (`service.runner.run_planned`): the run trains the units the plan
    packed just before, packed once; units for other trials than the run takes up are not used."""
    from service.planning import plan as planning
    from service.study import engine as lifecycle

    packed: list[int] = []

    def counted(*args: Any, **kw: Any) -> Any:
        packed.append(1)
        return pack_study(*args, **kw)

    pack_study = lifecycle.pack_study
    monkeypatch.setattr(lifecycle, "pack_study", counted)
    monkeypatch.setattr(planning, "pack_study", counted)
    engine, ex, _ = make_engine()
    study = engine.create_study(grid())
    _, units = planning.plan_study(engine, study.id, calibrate=False)
    assert units is not None and len(packed) == 1
    engine.run_study(study.id, units=units)
    assert len(packed) == 1  # the plan's packing was the run's
    assert ex.rounds[0] == [[m.config_hash for m in u.members] for u in units]
    # a stale packing (here: another study's trials) is not trusted: the run packs its own
    other = engine.create_study(grid(seeds=[3]))
    engine.run_study(other.id, units=units)
    assert len(packed) == 2
    assert {h for u in ex.rounds[-1] for h in u} == {t.config_hash for t in engine.ledger.trials(other.id)}


def sampled(max_trials: int) -> StudySpec:
    return StudySpec.model_validate(
        {
            "name": "sampled",
            "space": {"dims": {"lr": {"loguniform": [1e-4, 1e-2]}, "init": ["chain", "orthogonal"]}},
            "base": {**TINY, "steps": 10, "eval_every": 5},
            "seeds": [1, 2],
            "sampler": "tpe",
            "sampler_seed": 7,
            "max_trials": max_trials,
        }
    )


@pytest.mark.parametrize("sampler", ["random", "tpe", "cmaes", "qmc"])
def test_every_documented_sampler_draws_its_budget(make_engine: Any, sampler: str) -> None:
    """`sampler: cmaes` was documented and accepted, and failed after its first point: Optuna's CMA-ES
    imports the `cmaes` package, which optuna does not require and memsweep did not install."""
    engine, _, _ = make_engine()
    spec = StudySpec.model_validate(
        {**sampled(6).model_dump(exclude_unset=True), "sampler": sampler,
         "space": {"dims": {"lr": {"loguniform": [1e-4, 1e-2]}}}}
    )  # fmt: skip
    study = engine.create_study(spec)
    assert engine.run_study(study.id)["state"] == "done", engine.ledger.study(study.id).error
    assert len(engine.ledger.trials(study.id)) == 6


def test_a_sampled_study_trains_each_drawn_point_for_every_seed_and_an_extension_draws_only_more(
    make_engine: Any,
) -> None:
    engine, ex, _ = make_engine()
    study = engine.create_study(sampled(6))
    assert Draws(sampling(sampled(6), engine.space(sampled(6)), [], 1, dict)).study.trials == []
    assert engine.ledger.counts(study.id)["total"] == 0  # points are drawn as the study runs
    summary = engine.run_study(study.id)
    trials = engine.ledger.trials(study.id)
    assert summary["state"] == "done" and len(trials) == 6 and all(t.runs == 1 for t in trials)
    assert len(ex.rounds) == 1 and len(ex.rounds[0]) == 3  # three draws, then no round: nothing left
    points = {(t.params["lr"], t.params["init"]) for t in trials}
    assert len(points) == 3 and all(1e-4 <= lr <= 1e-2 for lr, _ in points)
    for point in points:  # each drawn point is one unit of its seeds
        assert sorted(t.params["seed"] for t in trials if (t.params["lr"], t.params["init"]) == point) == [
            1,
            2,
        ]
    # the finished points are the sampler's history when it draws on
    history = sampling(sampled(8), engine.space(sampled(8)), trials, 1, dict)
    assert len(Draws(history).study.get_trials(states=[TrialState.COMPLETE])) == 3
    assert engine.extend_study(study.id, sampled(8)) == 2
    engine.run_study(study.id)
    again = engine.ledger.trials(study.id)
    assert len(again) == 8 and len(ex.rounds[-1]) == 1 and all(t.runs == 1 for t in again)


@pytest.mark.parametrize("when", ["mid-unit", "before it starts"])
def test_a_sampled_point_whose_worker_dies_runs_again_in_the_next_round(make_engine: Any, when: str) -> None:
    """The first drawn unit's worker dies on its first attempt, mid-unit or before it starts (a drawn
    unit has no ledger row until it starts: one that dies first gets its rows, then runs again)."""
    deaths: list[int] = []

    def first(unit: Unit, attempt: int) -> bool:
        if not deaths:
            deaths.append(attempt)
            return True
        return False

    engine, ex, _ = make_engine(**{"dies" if when == "mid-unit" else "dies_before_start": first})
    study = engine.create_study(sampled(4))
    summary = engine.run_study(study.id)
    trials = engine.ledger.trials(study.id)
    assert summary["state"] == "done" and len(trials) == 4
    assert all(t.status == "done" for t in trials)
    # the round after the draws: the members of the unit that died, and only they
    assert sorted(h for u in ex.rounds[1] for h in u) == sorted(ex.rounds[0][0])
    assert sorted(t.runs for t in trials) == ([1, 1, 2, 2] if when == "mid-unit" else [1, 1, 1, 1])


def test_a_point_drawn_again_while_it_trains_waits_for_it_then_is_counted_not_trained(
    make_engine: Any,
) -> None:
    """A sampler may draw a point again (here the only one there is) while a unit still trains it, as
    Ray Tune asks for several units at once: that draw waits (`ask` answers None, Tune asks again
    later, nothing more is drawn meanwhile), and once the unit ended it is handed out with its members
    counted from the ledger. Before, both units trained the point at once."""
    engine, _, _ = make_engine()
    spec = StudySpec.model_validate(
        {"space": {"dims": {"init": ["chain"]}}, "base": TINY, "seeds": [1, 2], "sampler": "random",
         "sampler_seed": 1, "max_trials": 4}
    )  # fmt: skip
    finished: dict[str, float] = {}
    draws = Draws(
        sampling(
            spec, engine.space(spec), [], 2, lambda hashes: {h: finished[h] for h in hashes if h in finished}
        )
    )
    first = draws.ask("a")
    assert first is not None and len(first.members) == 2 and not first.known
    assert draws.ask("b") is None and draws.ask("b") is None  # the same point, still training under "a"
    assert len(draws.study.trials) == 2  # one draw waits: no more are taken while it does
    finished.update({m.config_hash: 0.25 for m in first.members})
    draws.tell("a", 0.25)
    again = draws.ask("b")
    assert again is not None and [m.config_hash for m in again.members] == [
        m.config_hash for m in first.members
    ]
    assert dict(again.known) == finished  # counted, not trained
    assert len(draws.study.trials) == 2


class Recorded:
    """The recorder's part that matters here: results into the ledger."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def started(self, trial_id: int, spec: Any) -> None:
        pass

    def evaluated(self, trial_id: int, config_hash: str, history: Sequence[trainers.Evaluation]) -> None:
        pass

    def write_evaluations(self) -> None:
        pass

    def finished(self, trial_id: int, result: trainers.TrialResult) -> None:
        self.engine.ledger.finish_trial(trial_id, result)

    def stopped(self, trial_id: int, config_hash: str, status: str, reason: str) -> None:
        pass

    def restated(self, trial_id: int, status: str, reason: str) -> None:
        pass


def test_a_trial_left_to_another_study_takes_its_result_while_the_round_runs(
    make_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A unit's member another study held running was left to it, and stayed `pending` until this
    study's whole round ended (hours, for a paper's grid) although the other had finished it: the
    round's ticks take its result as soon as it is there (`RunRequest.tick`)."""
    from service.study import elsewhere
    from service.study.claim import this_process

    monkeypatch.setattr(elsewhere, "POLL_SECONDS", 0.0)
    engine, ex, _ = make_engine()
    a = engine.create_study(grid(name="a", bundle_size=1))
    b = engine.create_study(grid(name="b", bundle_size=1))  # the same trials, made before a ran any
    engine.ledger.update_study(a.id, state="running", owner=this_process(), owner_beat=time.time())
    held: list[str] = []
    seen: list[str] = []

    def meanwhile() -> None:  # after each of b's units
        done = len(seen) + 1
        if done == 1:  # a starts the trial b's second unit holds
            held.append(ex.rounds[-1][1][0])
            engine.ledger.start_trial(a.id, held[0])
        elif done == 2:  # b left it to a, trained its third unit; a finishes it
            (row,) = [t for t in engine.ledger.trials(a.id) if t.config_hash == held[0]]
            engine.ledger.finish_trial(row.id, trainers.train(row.config))
        seen.append(engine.ledger.statuses(b.id, held)[held[0]])

    ex.after_unit = meanwhile
    assert engine.run_study(b.id)["state"] == "done"
    assert seen[:3] == ["pending", "pending", "done"]  # taken while units were still to run
    (taken,) = [t for t in engine.ledger.trials(b.id) if t.config_hash == held[0]]
    assert taken.runs == 0 and taken.reused_from is not None and len(ex.rounds) == 1


def test_a_member_open_in_one_unit_is_neither_started_nor_recorded_by_another(make_engine: Any) -> None:
    """Two executor trials holding the same member (a repeat drawn in a race): the second neither starts
    it again nor records what it reports of it, and its end closes nothing of the first's. Before, the
    member's row was started twice and the later unit's report (or its cancel) overwrote the result."""
    engine, _, _ = make_engine()
    study = engine.create_study(grid())
    row = engine.ledger.trials(study.id)[0]
    member = row.spec()
    book = TrialBook(engine.ledger, study.id, Recorded(engine), Stop(), sampled=False)
    book.started("a", Unit((member,)))
    book.started("b", Unit((member,)))
    assert book.open == {"a": {member.config_hash}, "b": set()}
    ours = trainers.TrialResult(final_val_loss=0.125, baseline_loss=1.0, steps=10)
    theirs = trainers.TrialResult(final_val_loss=0.5, baseline_loss=1.0, steps=10)
    book.reported("b", [Finished(member.config_hash, theirs)])
    book.reported("a", [Finished(member.config_hash, ours)])
    book.ended("b")
    book.ended("a")
    after = engine.ledger.trial(row.id)
    assert (after.status, after.runs, after.final_val_loss) == ("done", 1, 0.125)


def test_a_running_trial_shows_its_device_and_node_once_its_worker_says(make_engine: Any) -> None:
    """A running trial's `node` was null until its end (`memsweep trials ID --status running` could not
    say which node to take down, or which one was slow): the unit's first report says where its worker
    trains (`Placement`), and the book writes it on its running members' rows at once."""
    from service.study.worker import Placement

    engine, _, _ = make_engine()
    study = engine.create_study(grid())
    first, second = engine.ledger.trials(study.id)[:2]
    book = TrialBook(engine.ledger, study.id, Recorded(engine), Stop(), sampled=False)
    book.started("a", Unit((first.spec(),)))
    book.placed("a", Placement("node-7", "cpu", {"numerics": "portable"}))
    row, other = engine.ledger.trial(first.id), engine.ledger.trial(second.id)
    assert (row.status, row.device, row.node) == ("running", "cpu", "node-7")
    assert (other.status, other.device, other.node) == ("pending", None, None)  # not in the unit
    book.failed("a", "its node died")  # pending again, to run elsewhere: not on the node it lost
    book.started("b", Unit((first.spec(),)))
    again = engine.ledger.trial(first.id)
    assert (again.status, again.runs, again.device, again.node) == ("running", 2, None, None)


def test_a_trial_stopped_before_its_worker_reports_names_the_plugin_it_would_have_run(
    make_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial asha stopped (or pruned untrained) had no provenance: its plugin's identity was missing, and
    a comparison of two studies that ran two versions of a plugin cell said nothing when asha had stopped
    its trials. The driver records the plugins its cell and task come from, as the worker would."""
    from trainers import plugins

    engine, _, _ = make_engine()
    study = engine.create_study(grid())
    row = engine.ledger.trials(study.id)[0]
    member = row.spec()  # (its hash checked under the cells as they are)
    monkeypatch.setattr(plugins, "identities", lambda cell, task: {"cell": f"memsweep-{cell}==1.0+aa"})
    book = TrialBook(engine.ledger, study.id, Recorded(engine), Stop(), sampled=False)
    book.prune_unstarted("p", Unit((member,)), "its point was stopped before this seed was added")
    after = engine.ledger.trial(row.id)
    assert after.status == "pruned" and after.runs == 0
    assert after.provenance == {"plugin.cell": f"memsweep-{row.config['cell']}==1.0+aa"}
    assert after.baseline_loss is not None and after.budget_steps == 10  # what it records of its task


class RaisesMidUnit(InProcess):
    """An executor whose run raises while a unit's members are open (a ledger outage past its patience in
    a Ray callback, Ray's own failure)."""

    def _unit(self, run: str, unit: Unit, book: TrialBook) -> float | None:
        book.started(run, unit)
        raise RuntimeError("the ledger did not answer")


def test_a_run_that_raises_leaves_its_open_members_pending_with_the_reason(tmp_path: Path) -> None:
    """The study fails, and the members its run left open are interrupted with the reason (pending again,
    for its resume), not left `running` without one."""
    settings = Settings(home=tmp_path, mlflow_tracking_uri="memory://lifecycle", trial_attempts=2)
    engine = Engine(settings, executor=RaisesMidUnit(), tracker=MemoryTracker)  # type: ignore[arg-type]
    study = engine.create_study(grid())
    with pytest.raises(RuntimeError, match="the ledger did not answer"):
        engine.run_study(study.id)
    trials = engine.ledger.trials(study.id)
    opened = [t for t in trials if t.runs == 1]
    assert engine.ledger.get_study(study.id).state == "failed" and opened
    assert {t.status for t in opened} == {"pending"}
    assert all(
        "the study's run stopped (RuntimeError: the ledger did not answer)" in (t.reason or "")
        for t in opened
    )
    assert {t.status for t in trials if t.runs == 0} == {"pending"}


def _claimed(engine: Engine, study_id: str) -> tuple[Any, Callable[[], list[tuple]]]:
    """The study claimed by this engine's process, another process's ledger, and the study's rows."""
    from service.store.ledger import Ledger

    assert engine.ledger.claim_study(study_id, "here/1/2", lambda owner, beat: False) is None
    other = Ledger(engine.ledger.url)

    def rows() -> list[tuple]:
        s = other.study(study_id)
        return [(s.state, s.error)] + [
            (t.status, t.reason, t.runs, t.final_val_loss) for t in other.trials(study_id)
        ]

    return other, rows


def test_a_run_whose_claim_a_beat_found_lost_ends_refused_not_cancelled(make_engine: Any) -> None:
    """The beat that finds the study taken over stops the run as a cancel would, while no trial is open
    (between units, or all still waiting for a node): the run ends with `ClaimLostError`, and neither
    finishes the study in MLflow (the new owner's parent run) nor writes its state."""
    from service.store.ledger import ClaimLostError

    engine, ex, trackers = make_engine()
    study = engine.create_study(grid())
    other, rows = _claimed(engine, study.id)
    stop, taken = Stop(), []

    def take_over() -> None:
        if not taken:
            assert other.claim_study(study.id, "there/3/4", lambda owner, beat: True) is None
            assert not engine.ledger.beat_study(study.id, "here/1/2")  # the beat finds it gone
            stop.event.set()  # StudyClaim's on_lost
            taken.append(rows())

    ex.after_unit = take_over
    with pytest.raises(ClaimLostError, match="taken over by another process"):
        engine.run_study(study.id, stop=stop)
    assert taken and rows() == taken[0]
    assert trackers[0].summaries == []  # no summary, no status, no child run deleted in MLflow


def test_a_refused_write_that_ray_rewraps_still_ends_the_run_refused(tmp_path: Path) -> None:
    """Ray Tune re-raises a callback's error as a TuneError of its text: the engine still knows the
    claim is lost (the ledger refused a write) and ends refused, without writing the study `failed`."""
    from service.store.ledger import ClaimLostError

    class Rewraps(InProcess):
        def run(self, request: RunRequest, book: TrialBook) -> None:
            try:  # a callback's write, or the searcher's look as it starts a unit (`dispatch`)
                super().run(request, book)
            except ClaimLostError as exc:
                raise RuntimeError(f"TuneError: Traceback ... {exc}") from None  # its type lost

    settings = Settings(home=tmp_path, mlflow_tracking_uri="memory://lifecycle", trial_attempts=2)
    ex = Rewraps()
    engine = Engine(settings, executor=ex, tracker=MemoryTracker)  # type: ignore[arg-type]
    study = engine.create_study(grid())
    other, rows = _claimed(engine, study.id)
    taken: list[list[tuple]] = []

    def take_over() -> None:
        if not taken:
            assert other.claim_study(study.id, "there/3/4", lambda owner, beat: True) is None
            taken.append(rows())

    ex.after_unit = take_over
    with pytest.raises(
        ClaimLostError, match=r"taken over by another process; this run stopped \(RuntimeError\)"
    ):
        engine.run_study(study.id)
    assert taken and rows() == taken[0]


def test_extend_keeps_the_studys_cpus(make_engine: Any) -> None:
    """A trial's threads are its unit's CPUs and part of its hash: an extension at another CPU count
    would add every point again (its results counted twice), so it is refused, naming the fix."""
    from service.core.errors import StudyError

    engine, _, _ = make_engine()
    study = engine.create_study(grid())
    wider = grid(seeds=[1, 2, 3], resources={"cpus": 2})
    with pytest.raises(
        StudyError, match=r"extend keeps resources.cpus \(1\).*create a new study to run on 2"
    ):
        engine.extend_study(study.id, wider)
    assert len(engine.ledger.trials(study.id)) == 6
    assert engine.extend_study(study.id, grid(seeds=[1, 2, 3])) == 3


def test_extend_never_trains_a_point_again_under_other_settings(make_engine: Any) -> None:
    """An extension that changed the trial settings (`base`) added every point again under its new
    config, and the study's tables counted both results as seeds of one point; so did one of a study
    made under an older trainer. Refused, naming what changed and what to do instead."""
    from sqlalchemy import update

    from service.core.errors import StudyError
    from service.store.models import Trial
    from service.study.search import study_trials

    engine, _, _ = make_engine()
    spec = grid()
    study = engine.create_study(spec)
    longer = spec.model_dump(mode="json", exclude_unset=True)
    longer["base"] = {**longer["base"], "steps": 20}
    longer["seeds"] = [1, 2, 3]
    with pytest.raises(
        StudyError,
        match=r"train 6 of the study's trials again .*\(steps: 10 → 20\).*new study.*a dimension of its space",
    ):
        engine.extend_study(study.id, StudySpec.model_validate(longer))
    # a preset's dimensions are its paper's: the fix does not tell its study to make steps one
    preset = {"preset": "orhan2020-copy500", "models": ["chain"], "dims": {"lr": [1e-3], "scale": [1.0]},
              "base": {"seq_len": 30, "steps": 10}, "seeds": [1]}  # fmt: skip
    copy = engine.create_study(StudySpec.model_validate(preset))
    with pytest.raises(StudyError, match=r"\(steps: 10 → 20\).*new study") as refused:
        engine.extend_study(
            copy.id, StudySpec.model_validate({**preset, "base": {"seq_len": 30, "steps": 20}})
        )
    assert "dimension" not in str(refused.value)
    assert len(engine.ledger.trials(study.id)) == 6
    # a trial made under another trainer version (its stored hash is not what its config gives now)
    (first, *_) = engine.ledger.trials(study.id)
    with engine.ledger.session() as s:
        s.execute(update(Trial).where(Trial.id == first.id).values(config_hash="0" * 16))
    with pytest.raises(StudyError, match=r"train 1 of the study's trials again .*another trainer version"):
        engine.extend_study(study.id, grid(seeds=[1, 2, 3]))
    with engine.ledger.session() as s:
        s.execute(update(Trial).where(Trial.id == first.id).values(config_hash=first.config_hash))
    assert engine.extend_study(study.id, grid(seeds=[1, 2, 3])) == 3  # new seeds only: new points
    # a study that holds both configs of its points already (extended so before this check) is not
    # refused again for them: its next seeds are new points
    engine.ledger.add_trials(
        study.id,
        study_trials(StudySpec.model_validate(longer), engine.space(StudySpec.model_validate(longer))),
    )
    assert engine.extend_study(study.id, grid(seeds=[1, 2, 3, 4])) == 3
    # a sampled study draws its new points under the settings it drew its old ones with
    sampled = StudySpec.model_validate(
        {"name": "drawn", "sampler": "random", "max_trials": 2, "base": {**TINY, "steps": 10},
         "space": {"dims": {"lr": {"loguniform": [1e-4, 1e-2]}}}, "seeds": [1]}
    )  # fmt: skip
    drawn = engine.create_study(sampled)
    more = sampled.model_dump(mode="json", exclude_unset=True) | {"max_trials": 4}
    assert engine.extend_study(drawn.id, StudySpec.model_validate(more)) == 2
    more["base"] = {**more["base"], "batch_size": trainers.TrainConfig().batch_size}  # a default, written out
    assert engine.extend_study(drawn.id, StudySpec.model_validate(more | {"max_trials": 5})) == 1
    with pytest.raises(StudyError, match=r"extend keeps a sampled study's seeds \(1\).*unequal seeds"):
        engine.extend_study(drawn.id, StudySpec.model_validate(more | {"seeds": [1, 2], "max_trials": 8}))
    more["base"] = {**more["base"], "seq_len": 30}
    with pytest.raises(StudyError, match=r"sampled study draws its points under \(seq_len: 20 → 30\)"):
        engine.extend_study(drawn.id, StudySpec.model_validate(more | {"max_trials": 6}))


def test_shutdown_leaves_ray_up_under_a_study_that_has_not_stopped(make_engine: Any, monkeypatch) -> None:
    """A study that does not stop within the shutdown's patience (a calibration waits on its Ray tasks)
    keeps its Ray: shut down under it, its next call would have started a new embedded Ray while the
    process exits. Ray is shut down by the shutdown that finds no study running (or at exit)."""
    from service.runner import StudyRunner

    engine, ex, _ = make_engine()
    study = engine.create_study(grid())
    runner = StudyRunner(engine, workers=1)
    stopped: list[bool] = []
    monkeypatch.setattr(ex, "stop", lambda: stopped.append(True))
    inside, release = threading.Event(), threading.Event()

    def calibrating(study_id: str, a: Any) -> None:
        inside.set()
        release.wait(30)  # deaf to its cancel, as Ray's wait on a calibration task is

    monkeypatch.setattr(runner, "_run_claimed", calibrating)
    runner.start_ray()
    assert runner.submit(study.id) and inside.wait(30)
    runner.shutdown(timeout=0.3)
    assert stopped == [] and runner.is_active(study.id)
    release.set()
    deadline = time.monotonic() + 30
    while runner.is_active(study.id):
        assert time.monotonic() < deadline, "the study never ended"
        time.sleep(0.05)
    runner.shutdown(timeout=5)
    assert stopped == [True]
    runner.shutdown(timeout=5)  # once
    assert stopped == [True]


def test_a_study_that_found_no_ray_fails_saying_how_to_run_it_again(make_engine: Any, monkeypatch) -> None:
    from service.runner import StudyRunner

    engine, _, _ = make_engine()
    study = engine.create_study(grid())
    runner = StudyRunner(engine, workers=1)

    def no_ray() -> None:
        raise RuntimeError("ConnectionError: Failed to connect to Ray cluster at head:6379")

    monkeypatch.setattr(runner, "prepare", no_ray)
    try:
        assert runner.submit(study.id)
        deadline = time.monotonic() + 30
        while runner.is_active(study.id):
            assert time.monotonic() < deadline, "the study never ended"
            time.sleep(0.05)
    finally:
        runner.shutdown(timeout=5)
    row = engine.ledger.study(study.id)
    assert row.state == "failed"
    assert "could not bring up Ray or MLflow (ConnectionError: Failed to connect" in (row.error or "")
    assert f"memsweep resume {study.id} --url URL" in (row.error or "")


def test_a_shutdown_during_the_warm_up_still_shuts_down_the_ray_it_started(
    make_engine: Any, monkeypatch
) -> None:
    """The server's warm-up starts Ray in the background; a shutdown that comes while Ray is starting
    waits for that start and shuts it down (it had looked too early, and Ray outlived the runner)."""
    from service.runner import StudyRunner

    engine, ex, _ = make_engine()
    runner = StudyRunner(engine, workers=1)
    starting = threading.Event()
    events: list[str] = []

    def slow_start() -> None:
        starting.set()
        time.sleep(1.0)
        events.append("up")

    monkeypatch.setattr(ex, "start", slow_start)
    monkeypatch.setattr(ex, "stop", lambda: events.append("shutdown"))
    runner.start()
    assert starting.wait(10)
    runner.shutdown(timeout=10)
    assert events == ["up", "shutdown"]
    with pytest.raises(RuntimeError, match="stopping"):
        runner.start_ray()  # nothing starts Ray after the shutdown
    assert events == ["up", "shutdown"]


class CrashesOnce(InProcess):
    """An executor whose run stops for good as its `at`-th unit trains (the driver's process killed
    mid-run), that unit's members open; once only: the study's next run trains on."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.units = at, 0

    def _unit(self, run: str, unit: Unit, book: TrialBook) -> float | None:
        self.units += 1
        if self.units == self.at:
            book.started(run, unit)
            raise RuntimeError("the server was stopped")
        return super()._unit(run, unit, book)


def two_models_sampled(max_trials: int) -> StudySpec:
    lr = {"loguniform": [1e-4, 1e-2]}
    return StudySpec.model_validate(
        {
            "name": "two models",
            "space": {
                "models": {
                    "chain": {"fixed": {"init": "chain"}, "dims": {"lr": lr}},
                    "orth": {"fixed": {"init": "orthogonal"}, "dims": {"lr": lr}},
                }
            },
            "base": {**TINY, "steps": 10, "eval_every": 5},
            "seeds": [1, 2],
            "sampler": "tpe",
            "sampler_seed": 7,
            "max_trials": max_trials,
        }
    )


def interrupted(tmp_path: Path, max_trials: int, at: int = 3) -> tuple[Engine, CrashesOnce, str]:
    """A sampled study of two models stopped as its `at`-th point trained: the points before it
    finished, its seeds open (pending again, for its resume)."""
    settings = Settings(home=tmp_path, mlflow_tracking_uri="memory://lifecycle", trial_attempts=2)
    ex = CrashesOnce(at=at)
    engine = Engine(settings, executor=ex, tracker=MemoryTracker)  # type: ignore[arg-type]
    study = engine.create_study(two_models_sampled(max_trials))
    with pytest.raises(RuntimeError, match="the server was stopped"):
        engine.run_study(study.id)
    statuses = sorted(t.status for t in engine.ledger.trials(study.id))
    assert statuses == ["done"] * 2 * (at - 1) + ["pending"] * 2
    return engine, ex, study.id


@pytest.mark.parametrize("max_trials", [8, 7])
def test_a_resumed_sampled_study_trains_its_interrupted_point_within_its_budget(
    tmp_path: Path, max_trials: int
) -> None:
    """max_trials 8 (or 7, rounded up to whole points) over 2 seeds: 4 points. Resumed with 2 points
    finished and a third interrupted, the run draws 1 point and trains the third again: 8 trials.
    Before, it drew 8 − 4 finished = 2 points beside the interrupted one, and the study ended with 10."""
    engine, ex, study_id = interrupted(tmp_path, max_trials)
    open_point = sorted(t.config_hash for t in engine.ledger.trials(study_id) if t.status == "pending")
    summary = engine.run_study(study_id)
    trials = engine.ledger.trials(study_id)
    assert summary["state"] == "done" and len(trials) == 8 and {t.status for t in trials} == {"done"}
    points = {(t.model, t.params["lr"]) for t in trials}
    assert len(points) == 4 and all(
        sorted(t.params["seed"] for t in trials if (t.model, t.params["lr"]) == p) == [1, 2] for p in points
    )
    again, drawn = ex.rounds[-2:]  # the interrupted point first: the sampler then knows its result
    assert sorted(h for u in again for h in u) == open_point  # the interrupted point, trained again
    assert len(drawn) == 1  # the budget's last point


def test_the_plan_of_a_resumed_sampled_study_counts_its_draws_and_its_interrupted_point(
    tmp_path: Path,
) -> None:
    """Stopped with its only points of one model (one finished, one interrupted), a study of two
    models under max_trials 8 (4 points of 2 seeds) has 2 points to draw, of the other model (the
    models in turn, going on from what it holds), and its interrupted point to train again. Before,
    its plan failed (KeyError: a draw of a model the study held no trial of), and the resumed run had
    none."""
    from service.planning.plan import plan_study

    engine, _, study_id = interrupted(tmp_path, 8, at=2)
    rows = engine.ledger.trials(study_id)
    (held,) = {t.model for t in rows}
    (other,) = {"chain", "orth"} - {held}
    plan, packed = plan_study(engine, study_id, calibrate=False)
    assert packed is None  # a sampled study's units are drawn as it runs
    assert (plan.trials, plan.to_run, plan.reused) == (8, 6, 2)
    assert {m: (r.trials, r.to_run) for m, r in plan.by_model.items()} == {held: (4, 2), other: (4, 4)}
    assert plan.by_model[other].units == 2 and plan.units == 2 + plan.by_model[held].units
    # and the run does as planned: 2 points drawn, the interrupted one trained again, 8 trials
    engine.run_study(study_id)
    assert len(engine.ledger.trials(study_id)) == 8


def test_a_cancel_of_a_queued_study_another_process_holds_leaves_its_state_alone(
    make_engine: Any, monkeypatch
) -> None:
    """A study queued here that a live `memsweep run` on the same ledger runs: the cancel marked it
    `cancelled` under that run, so that another study stopped waiting for its trials and trained them
    too. It is refused (the study stays queued here, its state the other process's); a queued study no
    process holds is still cancelled at once."""
    from service.application.errors import ConflictError
    from service.application.study_service import StudyService
    from service.runner import StudyRunner

    engine, _, _ = make_engine()
    busy, held, free = (engine.create_study(grid(name=n)) for n in ("busy", "held", "free"))
    # another process runs it (another host's, beating now)
    engine.ledger.update_study(held.id, state="running", owner="elsewhere/4242/1", owner_beat=time.time())
    runner = StudyRunner(engine, workers=1)
    inside, release = threading.Event(), threading.Event()

    def blocking(study_id: str, a: Any) -> None:  # the one worker, taken until the test lets go
        inside.set()
        release.wait(30)

    monkeypatch.setattr(runner, "_run_claimed", blocking)
    runner.start_ray()
    try:
        assert runner.submit(busy.id) and inside.wait(30)
        assert runner.submit(held.id) and runner.submit(free.id) and runner.is_queued(held.id)
        studies = StudyService(engine, runner)
        with pytest.raises(ConflictError, match="another process holds it"):
            studies.cancel(held.id)
        assert engine.ledger.get_study(held.id).state == "running" and runner.is_queued(held.id)
        assert studies.cancel(free.id).state == "cancelled" and not runner.is_active(free.id)
    finally:
        release.set()
        runner.shutdown(timeout=10)


def test_a_shutdown_while_a_study_plans_leaves_it_pending_without_a_run(
    make_engine: Any, monkeypatch
) -> None:
    """SIGTERM while a study calibrated its plan: the run went on into `Engine.run_study` (the study
    `running`, a parent run made and its summary written for a run of nothing). It ends there, pending
    for the next start and saying so; a user's cancel at that moment ends it cancelled."""
    import service.runner as runner_module
    from service.runner import StudyRunner
    from service.study.book import SHUTDOWN_NOTE

    engine, _, _ = make_engine()
    stopped, cancelled = (
        engine.create_study(grid(name="stopped")),
        engine.create_study(grid(name="cancelled")),
    )
    inside = threading.Event()

    def calibrating(engine: Any, study_id: str, cancel: threading.Event | None) -> None:
        inside.set()
        assert cancel is not None and cancel.wait(30)  # a calibration stops at its cancel
        return None

    monkeypatch.setattr(runner_module, "plan_run", calibrating)
    runner = StudyRunner(engine, workers=1)
    runner.start_ray()
    assert runner.submit(cancelled.id) and inside.wait(30)
    assert runner.cancel(cancelled.id)
    deadline = time.monotonic() + 30
    while runner.is_active(cancelled.id):
        assert time.monotonic() < deadline, "the cancelled study never ended"
        time.sleep(0.05)
    inside.clear()
    assert runner.submit(stopped.id) and inside.wait(30)
    runner.shutdown(timeout=30)
    for study, state, note in ((stopped, "pending", SHUTDOWN_NOTE), (cancelled, "cancelled", None)):
        row = engine.ledger.get_study(study.id)
        assert (row.state, row.error, row.mlflow_run_id) == (state, note, None), study.name
        assert "accuracy" not in (row.plan or {})


def test_an_error_while_a_shutdown_stops_the_run_leaves_the_study_pending(make_engine: Any) -> None:
    """An error as the run stopped for a shutdown (Tune raising as it stops a trial, the ledger past its
    patience) ended the study `failed`, which no start resumes, while its trials said the next would."""
    engine, ex, _ = make_engine()
    study = engine.create_study(grid())
    stop = Stop()

    def stopping_badly() -> None:
        stop.shut_down()
        raise RuntimeError("the executor failed as it stopped")

    ex.after_unit = stopping_badly
    with pytest.raises(RuntimeError, match="failed as it stopped"):
        engine.run_study(study.id, stop=stop)
    row = engine.ledger.get_study(study.id)
    assert row.state == "pending" and "RuntimeError: the executor failed as it stopped" in (row.error or "")


# An extension refused because it would train a study's trials again names what made them other trials: a
# plugin's code (as `memsweep compare` reads it from their provenance), the trainer version, or the
# extension's settings, only those that apply.


THEN, NOW = "memsweep-cornn==0.1.0+5739548f", "memsweep-cornn==0.1.0+ec85ca60"


def as_plugin(monkeypatch: pytest.MonkeyPatch, identity: str) -> None:
    """Every cell of the study as if a plugin with this identity gave it (its trials' hashes and provenance)."""
    monkeypatch.setattr(plugins, "identities", lambda cell, task: {"cell": identity})


def test_an_extension_after_a_plugins_code_changed_names_the_plugin_and_not_the_trainer_version(
    make_engine: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Study trained with one code of a plugin cell, another loaded since: the refusal blamed "another
    trainer version … or a preset's settings changed"."""
    engine, _, _ = make_engine()
    as_plugin(monkeypatch, THEN)
    study = engine.create_study(grid())
    engine.run_study(study.id)
    assert {t.provenance["plugin.cell"] for t in engine.ledger.trials(study.id)} == {THEN}
    as_plugin(monkeypatch, NOW)
    with pytest.raises(StudyError) as refused:
        engine.extend_study(study.id, grid(seeds=[1, 2, 3]))
    said = str(refused.value)
    assert said.startswith("extend would train 6 of the study's trials again beside their results: ")
    assert (
        f"the cell memsweep-cornn plugin changed (its version or its code) since they were made (then {THEN}; "
        f"now {NOW})" in said
    )
    assert "Put the plugin they ran back" in said and "or create a new study for the new code" in said
    assert "trainer version" not in said and "settings" not in said
    # the plugin's code and the settings both: each named, with its fix
    longer = grid(seeds=[1, 2, 3]).model_dump(mode="json", exclude_unset=True)
    longer["base"] = {**longer["base"], "steps": 20}
    with pytest.raises(StudyError) as both:
        engine.extend_study(study.id, StudySpec.model_validate(longer))
    said = str(both.value)
    assert (
        "the extension changes their settings (steps: 10 → 20)" in said
        and "plugin changed (its version or its code)" in said
    )
    assert "make a setting a dimension of its space" in said and "trainer version" not in said
    # the code they ran put back: the same trials, the new seed's alone are added
    as_plugin(monkeypatch, THEN)
    assert engine.extend_study(study.id, grid(seeds=[1, 2, 3])) == 3


def test_a_plan_after_a_plugins_version_changed_says_which_trials_train_again_and_both_versions(
    make_engine: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`memsweep plan` of a study whose plugin trials this ledger finished under another version: the
    plan's note says how many train again and the plugin's identity then and now (the walkthrough's
    question; it held already: this pins it)."""
    from service.planning.plan import plan_spec

    engine, _, _ = make_engine()
    as_plugin(monkeypatch, THEN)
    study = engine.create_study(grid())
    engine.run_study(study.id)
    done = len(engine.ledger.trials(study.id, ["done"]))
    as_plugin(monkeypatch, NOW)
    planned = plan_spec(engine, grid(), calibrate=False)
    assert planned.to_run == planned.trials and planned.reused == 0
    (note,) = [n for n in planned.notes if "under other code" in n]
    assert note.startswith(
        f"{done} of the trials to run were finished in this ledger under other code (study {study.id}): the "
        f"cell memsweep-cornn plugin changed (its version or its code) since they were made (then {THEN}; now "
        f"{NOW}). They train again"
    ), note


def test_an_extension_of_trials_that_never_ran_under_a_plugin_says_both_possible_causes(
    make_engine: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No provenance tells which code a pending trial was made under: the trainer version or the plugin's."""
    engine, _, _ = make_engine()
    as_plugin(monkeypatch, THEN)
    study = engine.create_study(grid())
    as_plugin(monkeypatch, NOW)
    with pytest.raises(StudyError) as refused:
        engine.extend_study(study.id, grid(seeds=[1, 2, 3]))
    said = str(refused.value)
    assert "they were made under another trainer version (TRAINER_VERSION" in said
    assert f"or other code of the plugins they use (now {NOW})" in said and "settings" not in said


def test_a_stored_config_that_no_longer_resolves_is_refused_as_made_under_other_code(
    make_engine: Any,
) -> None:
    """A trial's stored config with a setting this code no longer has (renamed since, in a trainer version
    or a plugin) raised `ConfigError: unknown field …` out of the refusal's own message, which the API
    answered as a mistake in the extension's values."""
    engine, _, _ = make_engine()
    study = engine.create_study(grid())
    (row, *_) = engine.ledger.trials(study.id)
    config = {**row.config, "cell_params": {**row.config["cell_params"], "renamed_gain": 1.0}}
    engine.ledger.update_trial(row.id, config=config, config_hash="0" * 64)  # made under other code
    with pytest.raises(StudyError) as refused:
        engine.extend_study(study.id, grid(seeds=[1, 2, 3]))
    said = str(refused.value)
    assert said.startswith("extend would train 1 of the study's trials again beside their results: ")
    assert "they were made under another trainer version" in said and "settings (" not in said


def test_a_sampled_study_drawn_under_a_plugins_old_code_draws_no_more_under_the_new(
    make_engine: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sampled study has no enumerated trials to compare: its extension (more max_trials) and its
    resume drew new points under the plugin's edited code beside those drawn under the old, and its
    sampler and tables mixed the two (only `memsweep compare` noticed)."""
    engine, _, _ = make_engine()
    as_plugin(monkeypatch, THEN)
    study = engine.create_study(grid(sampler="random", max_trials=2, seeds=[1]))
    engine.run_study(study.id)
    drawn = len(engine.ledger.trials(study.id))
    as_plugin(monkeypatch, NOW)
    with pytest.raises(StudyError) as refused:
        engine.extend_study(study.id, grid(sampler="random", max_trials=4, seeds=[1]))
    said = str(refused.value)
    assert said.startswith(f"extend would draw new points beside {drawn} drawn under other code: ")
    assert (
        f"the cell memsweep-cornn plugin changed (its version or its code) since they were made (then {THEN}; "
        f"now {NOW})" in said
    )
    with pytest.raises(StudyError, match=r"^a run would draw new points beside"):
        engine.run_study(study.id)
    assert len(engine.ledger.trials(study.id)) == drawn  # nothing drawn, nothing trained
    as_plugin(monkeypatch, THEN)  # the code they ran put back: it extends
    assert engine.extend_study(study.id, grid(sampler="random", max_trials=4, seeds=[1])) == 2


# `memsweep run --study ID --max-trials N` said "its sampler draws the rest of max_trials M" with the
# study's budget before the extension (M < N): the study it goes on with is the one extended.


def test_an_extended_sampled_study_goes_on_with_its_new_budget(make_engine: Any) -> None:
    engine, _, _ = make_engine()
    study = engine.create_study(grid(sampler="random", max_trials=2, seeds=[1]))
    args = build_parser().parse_args(["run", "--study", study.id, "--max-trials", "4"])
    extended = _create_or_extend(args, engine, None)
    assert extended.id == study.id and extended.validated_spec().max_trials == 4


# A study whose plan's calibrations waited for the CPUs another study held showed `queued` and nothing
# more, for as long as that study ran: its answer says what it waits for (`waiting`), as `GET
# /studies/{id}` and `memsweep status` show it. In-process stand-ins for Ray and MLflow (test_lifecycle's).


def test_a_study_calibrating_behind_a_running_one_says_what_it_waits_for(
    make_engine: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import service.runner as runner_module
    from service.runner import StudyRunner

    engine, ex, _ = make_engine()
    running, planned = engine.create_study(grid(name="running")), engine.create_study(grid(name="planned"))
    training, calibrating, release = threading.Event(), threading.Event(), threading.Event()

    def plan_run(engine: Any, study_id: str, cancel: threading.Event | None) -> None:
        if study_id == planned.id:  # its calibrations wait for the CPUs the other study holds
            calibrating.set()
            assert release.wait(30)

    def holding() -> None:
        training.set()
        assert release.wait(30)

    monkeypatch.setattr(runner_module, "plan_run", plan_run)
    ex.after_unit = holding
    runner = StudyRunner(engine, workers=2)
    runner.start_ray()
    studies = StudyService(engine, runner)
    try:
        assert runner.submit(running.id) and training.wait(30)
        assert runner.submit(planned.id) and calibrating.wait(30)
        answer = studies.get(planned.id)
        assert answer.queued
        assert (
            answer.waiting
            == f"calibrating its plan: its calibrations may wait for the CPUs that study {running.id} holds"
        )
        assert studies.get(running.id).waiting is None
    finally:
        release.set()
        runner.shutdown(timeout=30)
    assert studies.get(planned.id).waiting is None  # no longer queued here


class CancelledMidUnit(InProcess):
    """Its study's user cancels while the `at`-th unit trains, once that unit's trial has its live child
    run: the driver hears no more of the unit, as of a trial Ray stops, and its trial ends `cancelled`
    with the evaluations it made."""

    def __init__(self, ledger: Any, stop: Stop, at: int) -> None:
        super().__init__()
        self.ledger, self.stop, self.at, self.units = ledger, stop, at, 0

    def _unit(self, run: str, unit: Unit, book: TrialBook) -> float | None:
        self.units += 1
        if self.units != self.at:
            return super()._unit(run, unit, book)
        book.started(run, unit)
        (member,) = unit.members

        def report(result: dict[str, Any]) -> None:
            if self.stop.event.is_set():
                return
            book.reported(run, result["events"])
            deadline = time.monotonic() + 30
            while self.ledger.trial(book.ids[member.config_hash]).mlflow_run_id is None:
                assert time.monotonic() < deadline, "its live child run was never made"
                time.sleep(0.05)
            self.stop.cancel()

        train_unit(unit, report, node="in-process")
        book.ended(run)
        return None


def four_done(name: str) -> StudySpec:
    """Four trials that all end `done`, one unit each."""
    models = {m: {"fixed": {"init": m}, "dims": {"lr": [1e-3]}} for m in ("chain", "orthogonal")}
    return grid(name=name, space={"models": models}, bundle_size=1, concurrency=1)


def tracked_engine(tmp_path: Path, mlflow_uri: str, executor: InProcess) -> Engine:
    """The engine with the real tracker on a real MLflow server, each trial's live run made at its start."""
    settings = Settings(
        home=tmp_path, mlflow_tracking_uri=mlflow_uri, mlflow_live_interval=0.0, trial_attempts=2
    )
    return Engine(settings, executor=executor)


def child_runs(engine: Engine, study_id: str) -> dict[str, list[Any]]:
    """The study's child runs in MLflow (deleted ones left out), by their trial's config hash."""
    from mlflow.tracking import MlflowClient

    study = engine.ledger.get_study(study_id)
    found = MlflowClient(engine.tracking_uri()).search_runs(
        [study.mlflow_experiment_id], filter_string=f"tags.mlflow.parentRunId = '{study.mlflow_run_id}'"
    )
    runs: dict[str, list[Any]] = {}
    for r in found:
        runs.setdefault(r.data.tags["memsweep.config_hash"], []).append(r)
    return runs


def test_a_cancelled_trial_that_takes_another_studys_result_gets_one_finished_run(
    tmp_path: Path, mlflow_uri: str
) -> None:
    """Cancelled while it trained, its child run ended KILLED (`cancelled`, a partial curve); another
    study then trained its config, and the resumed study took that result: its row read `done`, its
    run stayed KILLED, and a sync kept it so. Now every trial of the resumed study has exactly one
    child run, FINISHED with its result, the cancelled one gone."""
    stop = Stop()
    ex = CancelledMidUnit(None, stop, at=2)
    engine = tracked_engine(tmp_path, mlflow_uri, ex)
    ex.ledger = engine.ledger
    a = engine.create_study(four_done("a"))
    assert engine.run_study(a.id, stop=stop)["state"] == "cancelled"
    (cut,) = [
        t for t in engine.ledger.trials(a.id) if t.mlflow_run_id is not None and t.status == "cancelled"
    ]
    (killed,) = child_runs(engine, a.id)[cut.config_hash]
    assert killed.info.status == "KILLED" and killed.data.tags["memsweep.status"] == "cancelled"

    b = engine.create_study(four_done("b"))  # the same configs, trained to the end
    assert engine.run_study(b.id)["state"] == "done"
    assert engine.run_study(a.id)["state"] == "done"  # the resume takes b's results

    trials = engine.ledger.trials(a.id)
    assert {t.status for t in trials} == {"done"}
    runs = child_runs(engine, a.id)
    assert sorted(runs) == sorted(t.config_hash for t in trials)
    for t in trials:
        (run,) = runs[t.config_hash]  # exactly one each
        assert run.info.run_id == t.mlflow_run_id
        assert run.info.status == "FINISHED" and run.data.tags["memsweep.status"] == "done"
        assert run.data.metrics["final_val_loss"] == pytest.approx(t.final_val_loss)
    (taken,) = [t for t in trials if t.config_hash == cut.config_hash]
    assert taken.reused_from is not None and taken.runs == 1  # it took b's result after one start
    assert runs[cut.config_hash][0].data.tags["memsweep.reused_from"] == str(taken.reused_from)


def test_a_sync_remakes_a_done_trials_run_that_says_otherwise(tmp_path: Path, mlflow_uri: str) -> None:
    """A sync took any ended child run for complete, whatever its trial's status in the ledger: a done
    trial's run left KILLED and `cancelled` (by the bug above, or any other) stayed so. A sync now makes
    it again from the ledger, and leaves the runs that agree with it alone."""
    from mlflow.tracking import MlflowClient

    engine = tracked_engine(tmp_path, mlflow_uri, InProcess())
    study = engine.create_study(four_done("s"))
    assert engine.run_study(study.id)["state"] == "done"
    before = {t.config_hash: t.mlflow_run_id for t in engine.ledger.trials(study.id)}
    wrong, *right = engine.ledger.trials(study.id)
    client = MlflowClient(mlflow_uri)
    client.set_tag(wrong.mlflow_run_id, "memsweep.status", "cancelled")
    client.set_terminated(wrong.mlflow_run_id, status="KILLED")

    assert engine.sync_tracking(study.id)["mlflow_errors"] == []
    runs = child_runs(engine, study.id)
    after = {t.config_hash: t for t in engine.ledger.trials(study.id)}
    (remade,) = runs[wrong.config_hash]
    assert remade.info.run_id == after[wrong.config_hash].mlflow_run_id != wrong.mlflow_run_id
    assert remade.info.status == "FINISHED" and remade.data.tags["memsweep.status"] == "done"
    assert remade.data.metrics["final_val_loss"] == pytest.approx(wrong.final_val_loss)
    assert client.get_run(wrong.mlflow_run_id).info.lifecycle_stage == "deleted"
    for t in right:  # each agreed with the ledger: the same run as before
        assert [r.info.run_id for r in runs[t.config_hash]] == [before[t.config_hash]]
