"""The asha scheduler: a point's seeds train side by side as one unit, judged at each rung on their mean
and stopped together; a unit is never stopped between a member's last evaluation and its result; a
pruned point is Optuna's pruned trial, live and when a study resumes. The engine tests run a real
embedded Ray, a real SQLite ledger and MLflow on SQLite."""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from service.core.spec import ASHA_MAX_EVALUATIONS, Asha, StudySpec
from service.core.trial import Evaluated, Finished, Known, objective
from service.planning.plan import plan_study
from service.study.packing import bundle, pack_study
from service.study.search import Draws, grid_trials, rung_means, sampling, study_space, told
from tests.service.conftest import TINY

LONG = {**TINY, "steps": 80, "eval_every": 10}  # 8 evaluations: rungs at 1, 2, 4 (grace 1, factor 2)


def asha_spec(**kw) -> StudySpec:
    data = {
        "space": {"dims": {"lr": [1e-2, 1e-9, 1e-8]}},
        "base": LONG,
        "seeds": [1, 2],
        "scheduler": "asha",
        "asha": {"grace_period": 1, "reduction_factor": 2},
        "concurrency": 1,
    }
    data.update(kw)
    return StudySpec.model_validate(data)


# ----- what a study may ask ----------------------------------------------------------------------------


def test_asha_settings_belong_to_the_asha_scheduler_and_bundles_are_its_points():
    with pytest.raises(ValidationError, match="scheduler is 'fifo': set `scheduler: asha`"):
        asha_spec(scheduler="fifo")
    with pytest.raises(ValidationError, match="reduction_factor"):
        asha_spec(asha={"reduction_factor": 1})
    with pytest.raises(ValidationError, match="grace_period"):  # beyond every rung Ray would set
        asha_spec(asha={"grace_period": 100_001})
    # a stored fifo spec holds asha's defaults: it reads back
    fifo = asha_spec(scheduler="fifo", asha={})
    assert StudySpec.model_validate(fifo.model_dump()).scheduler == "fifo"


def test_asha_trains_the_seeds_of_a_cell_that_does_not_fuse_in_lockstep():
    """A point is judged on the mean of its seeds at each rung, so they train side by side: fused where
    they can, else in lockstep (`trainers.train_lockstep`). Such studies were refused: asha with several
    seeds needed a cell that fuses (not LSTM, GRU, JANET, the NRU, a plugin without a fused form)."""
    for spec in (asha_spec(base={**LONG, "cell": "lstm"}), asha_spec(fused=False)):
        units = pack_study(spec, grid_trials(study_space(spec, 10_000), {}))
        assert [(len(u.members), u.fused, u.lockstep) for u in units] == [(2, False, True)] * 3
    assert not any(
        u.lockstep for u in pack_study(asha_spec(), grid_trials(study_space(asha_spec(), 10_000), {}))
    )
    # a sampled point's seeds: in lockstep under asha only; under fifo one after another (each seed's
    # result recorded as it ends, one model in memory at a time)
    from service.study.search import sampling

    for scheduler, together in (("asha", True), ("fifo", False)):
        spec = asha_spec(
            base={**LONG, "cell": "lstm"}, sampler="random", max_trials=2, scheduler=scheduler,
            **({} if scheduler == "asha" else {"asha": {}}),
        )  # fmt: skip
        drawn = sampling(spec, study_space(spec, 10_000), [], 1, lambda hashes: {})
        unit = drawn.unit("default", {"lr": 1e-2})
        assert (len(unit.members), unit.fused, unit.lockstep) == (2, False, together)


@pytest.mark.parametrize("bundle_size", [None, 1, 4])
def test_under_asha_a_grid_packs_one_fused_unit_per_point(bundle_size):
    """`bundle_size` does not apply (a stored asha study may hold one: it reads back and runs)."""
    spec = StudySpec.model_validate(asha_spec(bundle_size=bundle_size).model_dump())
    units = pack_study(spec, grid_trials(study_space(spec, 10_000), {}))
    assert len(units) == 3 and all(u.fused for u in units)
    for u in units:
        assert sorted(m.params["seed"] for m in u.members) == [1, 2]
        assert len({m.params["lr"] for m in u.members}) == 1


def test_the_plan_of_an_asha_study_packs_points_and_says_what_it_assumes(tmp_path: Path):
    from service.core.settings import Settings
    from service.planning.plan import plan_spec
    from service.study.engine import Engine

    engine = Engine(Settings(home=tmp_path, mlflow_tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"))
    planned = plan_spec(engine, asha_spec(bundle_size=4), calibrate=False)
    assert planned.units == 3 and planned.bundle_sizes == {"2": 3}
    assert (
        "asha: the estimate trains every point to its end; the points asha stops cost less" in planned.notes
    )
    assert "bundle_size does not apply under asha: a unit is one point's seeds" in planned.notes
    rungs = (
        "asha: a point may be stopped after 1, 2, 4 of its 8 evaluations (grace_period 1, reduction_factor 2"
    )
    assert any(n.startswith(rungs) for n in planned.notes), planned.notes
    assert not any("lockstep" in n for n in planned.notes)
    assert not any("ranked together" in n for n in planned.notes)  # one model
    # several models: one rung ranks them all, first come first judged (a researcher's own cell, whose
    # units ran last, was stopped at every point while a worse paper model went on): the plan says so
    two = plan_spec(
        engine,
        asha_spec(space={"models": {"a": {"dims": {"lr": [1e-2]}}, "b": {"dims": {"lr": [1e-2]}}}}),
        calibrate=False,
    )
    assert any(n.startswith("asha: the points of a, b are ranked together at each rung") for n in two.notes)
    sampled = plan_spec(engine, asha_spec(base={**LONG, "cell": "lstm"}, sampler="random", max_trials=4),
                        calibrate=False)  # fmt: skip
    assert any("cannot train fused: their seeds train in lockstep" in n for n in sampled.notes), sampled.notes
    lstm = plan_spec(engine, asha_spec(base={**LONG, "cell": "lstm"}), calibrate=False)
    assert any(
        n.startswith("asha: 3 points of 3 cannot train fused: their seeds train in lockstep")
        for n in lstm.notes
    )
    late = plan_spec(engine, asha_spec(asha={"grace_period": 8}), calibrate=False)
    (never,) = [n for n in late.notes if "grace_period" in n]
    assert never.startswith(
        "asha: grace_period 8 is not before a trial's last evaluation (8): it stops nothing"
    )


# ----- what a unit reports -----------------------------------------------------------------------------


def reports_of(spec: StudySpec, fused: bool) -> tuple[list[dict], list]:
    """A unit's reports: fused, or (`fused` False) its seeds in lockstep, as asha trains them."""
    from service.study.worker import train_unit

    trials = grid_trials(spec.search_space(), {})
    reports: list[dict] = []
    train_unit(bundle(trials, fused=fused, lockstep=True), reports.append, "here")
    return reports, trials


@pytest.mark.parametrize("fused", [True, False])
def test_a_members_last_evaluation_goes_out_with_its_result(fused):
    """A scheduler decides on each report: a report holding a member's last evaluation without its result
    let ASHA stop the unit there and the member was recorded pruned after it had ended. Every round
    reports the rounds so far (the scheduler's time) and the mean over the members' latest objectives."""
    spec = StudySpec.model_validate(
        {"space": {"dims": {"lr": [1e-3]}}, "base": {**TINY, "steps": 30}, "seeds": [1, 2]}
    )  # evaluations at 10, 20, 30
    reports, _ = reports_of(spec, fused)
    for r in reports:
        steps = {e.evaluation.step for e in r["events"] if isinstance(e, Evaluated)}
        done = {e.config_hash for e in r["events"] if isinstance(e, Finished)}
        if 30 in steps:  # the last evaluation: with the member's result
            ended = {
                e.config_hash for e in r["events"] if isinstance(e, Evaluated) and e.evaluation.step == 30
            }
            assert ended <= done
    assert [r["complete"] for r in reports][-1] is True and not any(r["complete"] for r in reports[:-1])
    results = [e.result for r in reports for e in r["events"] if isinstance(e, Finished)]
    assert [r.status for r in results] == ["done", "done"]
    assert reports[-1]["objective"] == pytest.approx(
        math.fsum(objective(r.final_val_loss, r.baseline_loss, r.status) for r in results) / 2
    )
    # one report per round, fused or in lockstep: 10, 20, then 30 with both results
    assert [r["evaluations"] for r in reports] == [1, 2, 3]
    first = [e.evaluation for e in reports[0]["events"]]
    assert [e.step for e in first] == [10, 10]
    baseline = results[0].baseline_loss
    assert reports[0]["objective"] == pytest.approx(math.fsum(e.val_loss / baseline for e in first) / 2)


@pytest.mark.parametrize("fused", [True, False])
def test_an_early_stop_goes_out_with_its_result_and_the_bundle_reports_on(fused):
    spec = StudySpec.model_validate(
        {"space": {"dims": {"early_stop_loss": [10.0, None]}}, "base": {**TINY, "steps": 30}, "seeds": [1]}
    )
    reports, trials = reports_of(spec, fused)
    stops = trials[0].config_hash
    (first,) = [
        r for r in reports if any(isinstance(e, Finished) and e.config_hash == stops for e in r["events"])
    ]
    assert [e.evaluation.step for e in first["events"] if isinstance(e, Evaluated)] == [10, 10]  # held for it
    assert first["complete"] is False and reports[-1]["complete"] is True


@pytest.mark.parametrize("fused", [True, False])
def test_a_seed_that_fails_its_training_check_at_a_round_goes_out_with_that_round(fused):
    """lr 3 without clipping: its training loss is not finite at step 5, an evaluation step, so it leaves
    before that round's validation. The round (the other seed's evaluation) was sent alone, and an ASHA
    stop on it lost the failure: recorded pruned (or cancelled, and trained again)."""
    spec = StudySpec.model_validate(
        {"space": {"dims": {"lr": [1e-3, 3.0]}}, "base": {**TINY, "steps": 40, "eval_every": 5, "clip_norm": None},
         "seeds": [1]}
    )  # fmt: skip
    reports, trials = reports_of(spec, fused)
    diverges = trials[1].config_hash
    (out,) = [
        r for r in reports if any(isinstance(e, Finished) and e.config_hash == diverges for e in r["events"])
    ]
    (result,) = [e.result for e in out["events"] if isinstance(e, Finished)]
    assert result.status == "failed" and "training loss is not finite" in result.reason
    assert [e.evaluation.step for e in out["events"] if isinstance(e, Evaluated)] == [5]  # its round, with it
    assert out["evaluations"] == 1 and reports.index(out) == 0


@pytest.mark.parametrize("fused", [True, False])
def test_a_members_last_evaluation_goes_out_with_its_result_when_another_fails_in_that_round(
    fused, monkeypatch
):
    """Seed 2's training loss is NaN from step 101: it fails at its check at 150, in the last round
    (steps 200, evaluations at 100 and 200). In lockstep, seed 1 paused after its last evaluation, so
    that evaluation went out with seed 2's failure but without seed 1's result: a rung there let ASHA
    stop the unit, and seed 1 was recorded pruned after training its whole budget."""
    from trainers.tasks.addition import AdditionTask

    original = AdditionTask.loss

    def loss(self, out, y):
        self.calls = getattr(self, "calls", 0) + 1
        value = original(self, out, y)
        return value * math.nan if self.seed == 2 and self.calls > 101 + 2 else value  # +2: one validation

    monkeypatch.setattr(AdditionTask, "loss", loss)
    spec = StudySpec.model_validate(
        {"space": {"dims": {"lr": [1e-3]}}, "base": {**TINY, "steps": 200, "eval_every": 100, "n_val": 16,
         "eval_batch_size": 16}, "seeds": [1, 2]}
    )  # fmt: skip
    reports, trials = reports_of(spec, fused)
    last = [
        r for r in reports if any(isinstance(e, Evaluated) and e.evaluation.step == 200 for e in r["events"])
    ]
    (report,) = last
    ended = {e.config_hash: e.result.status for e in report["events"] if isinstance(e, Finished)}
    assert ended.get(trials[0].config_hash) == "done", [type(e).__name__ for e in report["events"]]
    assert reports[-1]["complete"] is True


@pytest.mark.parametrize("fused", [True, False])
def test_a_units_first_report_says_where_it_trains_once(fused):
    """Where the worker trains (node, device, numerics provenance) goes out once, with the unit's first
    report: the driver records it on the members a scheduler stops, whose results never come."""
    spec = StudySpec.model_validate(
        {"space": {"dims": {"lr": [1e-3]}}, "base": {**TINY, "steps": 30}, "seeds": [1, 2]}
    )
    reports, _ = reports_of(spec, fused)
    assert ["placement" in r for r in reports] == [True, False, False]
    placement = reports[0]["placement"]
    results = [e.result for r in reports for e in r["events"] if isinstance(e, Finished)]
    for result in results:  # as each member's own result records it
        assert (placement.node, placement.device) == (result.node, result.device) == ("here", "cpu")
        assert dict(placement.provenance) == _numerics(result.provenance)


def _numerics(provenance: dict[str, str]) -> dict[str, str]:
    """A result's provenance but how its fused bundle ran (`trainers.fused.loop`: its result's alone)."""
    return {k: v for k, v in provenance.items() if k != "bundle_members"}


def test_a_split_bundle_counts_evaluations_per_member_not_per_round(monkeypatch):
    """A bundle out of memory trains again in halves, one after the other; each half's rounds counted
    as the unit's rounds ran ASHA's time ahead of every seed (10 for 6 evaluations)."""
    from tests.trainers.test_fused import fake_memory

    fake_memory(monkeypatch, 2, from_step=25)
    spec = StudySpec.model_validate(
        {"space": {"dims": {"lr": [1e-3]}}, "base": {**TINY, "steps": 60}, "seeds": [1, 2, 3, 4]}
    )  # evaluations at 10, …, 60: the split after the second
    reports, _ = reports_of(spec, True)
    counts = [r["evaluations"] for r in reports]
    assert counts == sorted(counts) and counts[-1] == 6
    assert sorted(e.config_hash for r in reports for e in r["events"] if isinstance(e, Finished)) == sorted(
        t.config_hash for t in grid_trials(spec.search_space(), {})
    )


def test_a_unit_holding_a_pruned_seed_is_not_complete():
    """A sampler's repeat of a point a scheduler pruned: its seeds are known, counted from their last
    evaluations, and the unit is told as pruned at their evaluations. It was told as complete, with the
    failure objective 10."""
    from service.core.trial import Unit as UnitOf
    from service.study.worker import train_unit

    spec = StudySpec.model_validate({"space": {"dims": {"lr": [1e-3]}}, "base": TINY, "seeds": [1, 2]})
    trials = grid_trials(spec.search_space(), {})
    known = {
        trials[0].config_hash: Known(0.8, (2.0, 1.0, 0.8), 3),
        trials[1].config_hash: Known(1.2, (1.2,), 1),
    }
    reports: list[dict] = []
    train_unit(UnitOf(tuple(trials), True, known), reports.append, "here")
    # nothing trained: no evaluations (a scheduler records nothing of it again; each ran in its own unit)
    assert reports == [
        {"objective": pytest.approx(1.0), "evaluations": 0, "complete": False, "pruned_at": 3, "events": []}
    ]
    assert objective(0.25, 0.5, "pruned") == 0.5 and objective(0.25, 0.5, "failed") == 10.0


def test_a_seed_finished_before_counts_as_it_stood_after_as_many_evaluations():
    """A resumed point's earlier seeds enter each round's mean as they stood after as many evaluations
    (as in one run); they entered with their final objectives from the first round on. A seed pruned
    before any evaluation counts for nothing (it counted as 10)."""
    from types import SimpleNamespace

    from service.core.trial import known_of

    history = [{"step": s, "val_loss": v} for s, v in ((10, 1.0), (20, 0.5), (30, 0.25))]
    done = known_of(
        SimpleNamespace(status="done", final_val_loss=0.25, baseline_loss=0.5, history=history, steps=30)
    )
    assert [done.at(n) for n in (0, 1, 2, 3, 9)] == [0.5, 2.0, 1.0, 0.5, 0.5]
    at_last = known_of(
        SimpleNamespace(status="failed", final_val_loss=9.0, baseline_loss=0.5, history=history, steps=30)
    )  # failed with its last evaluation (a guard)
    assert [at_last.at(n) for n in (2, 3)] == [1.0, 10.0]
    later = known_of(
        SimpleNamespace(
            status="failed", final_val_loss=float("nan"), baseline_loss=0.5, history=history, steps=35
        )
    )  # at a training-loss check after it
    assert [later.at(n) for n in (3, 4)] == [0.5, 10.0]
    untrained = known_of(
        SimpleNamespace(status="pruned", final_val_loss=None, baseline_loss=0.5, history=[], steps=0)
    )
    assert untrained.at(1) is None and untrained.pruned_at == 0
    pruned = known_of(
        SimpleNamespace(status="pruned", final_val_loss=0.5, baseline_loss=0.5, history=history[:2], steps=20)
    )
    assert (pruned.objective, pruned.pruned_at, pruned.at(1)) == (1.0, 2, 2.0)


def test_a_resumed_grid_point_counts_the_seeds_that_finished_before(tmp_path: Path):
    """A point some seeds of which finished in an earlier run (a crash, a fault's requeued round): its
    unit counts them in the point's mean (`Unit.known`); before, the rungs judged it on the rest alone."""
    from service.core.settings import Settings
    from service.study.engine import Engine

    engine = Engine(Settings(home=tmp_path, mlflow_tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"))
    spec = asha_spec()
    study = engine.create_study(spec)
    first, second = [t for t in engine.ledger.trials(study.id) if t.params["lr"] == 1e-2]
    result = _pruned([])
    result.status, result.final_val_loss = "done", 0.1
    engine.ledger.finish_trial(engine.ledger.start_trial(study.id, first.config_hash), result)
    todo = [t.spec() for t in engine.ledger.trials(study.id, ["pending"])]
    units = {
        u.members[0].params["lr"]: u for u in engine._with_finished_seeds(study.id, pack_study(spec, todo))
    }
    assert [m.config_hash for m in units[1e-2].members] == [second.config_hash]
    (seen,) = units[1e-2].known.values()
    assert list(units[1e-2].known) == [first.config_hash] and seen.objective == pytest.approx(0.6)
    assert seen.pruned_at is None
    assert units[1e-9].known == {} and len(units[1e-9].members) == 2


def test_a_runs_scheduler_starts_with_the_rungs_of_the_points_finished_before():
    """Each run builds its scheduler; it started empty, so after a resume or an extension the first
    point to reach each rung went on whatever the earlier points had scored there."""
    from types import SimpleNamespace

    from ray.tune.schedulers import TrialScheduler

    from service.core.spec import Asha
    from service.study.ray_tune import PrimedAsha

    def decision(history, objective_now):
        scheduler = PrimedAsha(Asha(grace_period=1, reduction_factor=2), history)
        scheduler.set_search_properties("objective", "min")
        trial = SimpleNamespace(trial_id="new")
        scheduler.on_trial_add(None, trial)
        return scheduler.on_trial_result(None, trial, {"evaluations": 1, "objective": objective_now})

    before = [{1: 0.5, 2: 0.4}, {1: 0.6}]
    assert decision([], 5.0) == TrialScheduler.CONTINUE  # the first at its rung
    assert decision(before, 5.0) == TrialScheduler.STOP  # worse than those before it
    assert decision(before, 0.3) == TrialScheduler.CONTINUE


def test_rung_means_are_what_a_point_reported():
    from types import SimpleNamespace

    def seed(losses, status="done", final=None, steps=None):
        history = [{"step": 10 * (i + 1), "val_loss": v} for i, v in enumerate(losses)]
        return SimpleNamespace(history=history, baseline_loss=0.5, status=status, steps=steps or 10 * len(losses),
                               final_val_loss=final if final is not None else losses[-1])  # fmt: skip

    means = rung_means([seed([0.5, 0.25, 0.1]), seed([0.4], status="failed", final=float("nan"), steps=15)])
    assert means == {
        1: pytest.approx(0.9),
        2: pytest.approx((0.5 + 10) / 2),
        3: pytest.approx((0.2 + 10) / 2),
    }
    # a seed pruned untrained (added to a pruned point) is left out; it counted as 10
    untrained = SimpleNamespace(history=[], baseline_loss=0.5, status="pruned", final_val_loss=None, steps=0)
    assert rung_means([seed([0.45], status="pruned"), untrained]) == {1: pytest.approx(0.9)}
    assert told([seed([0.45], status="pruned"), untrained]) == (pytest.approx(0.9), 1)


# ----- a pruned point is Optuna's pruned trial ---------------------------------------------------------


def test_a_pruned_point_is_told_as_optunas_pruned_trial_live_and_on_resume(tmp_path: Path):
    from optuna.trial import TrialState

    from service.store.ledger import Ledger

    spec = asha_spec(space={"dims": {"lr": {"loguniform": [1e-4, 1e-2]}}}, sampler="random", max_trials=4)
    space = study_space(spec, 10_000)
    draws = Draws(sampling(spec, space, [], 2, lambda hashes: {}))
    draws.ask("a"), draws.ask("b")
    draws.tell("a", 0.4)
    draws.tell("b", 1.5, pruned_at=2)
    complete, pruned = draws.study.trials
    assert complete.state == TrialState.COMPLETE and complete.value == 0.4
    assert pruned.state == TrialState.PRUNED and pruned.intermediate_values == {2: 1.5}

    # Ray Tune's searcher tells a unit whose last result is not `complete` as pruned (stopped by asha)
    from service.study.ray_tune import UnitSearcher

    searcher = UnitSearcher(sampling(spec, space, [], 3, lambda hashes: {}))
    for key in "abc":
        searcher.suggest(key)
    searcher.on_trial_complete("a", {"objective": 0.5, "evaluations": 8, "complete": True})
    searcher.on_trial_complete("b", {"objective": 2.0, "evaluations": 1, "complete": False})
    searcher.on_trial_complete("c", None, error=True)
    states = [(t.state, t.value, t.intermediate_values) for t in searcher.draws.study.trials]
    assert states == [
        (TrialState.COMPLETE, 0.5, {}),
        (TrialState.PRUNED, 2.0, {1: 2.0}),
        (TrialState.FAIL, None, {}),
    ]

    # on resume, the ledger's pruned seeds (each with its last evaluation) make a pruned point again
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    study = ledger.create_study("s", spec.model_dump(mode="json"), [])
    unit = draws.sampling.unit("default", {"lr": 1e-3})
    ledger.add_trials(study.id, unit.members)
    history = [
        {"step": s, "epoch": 1.0, "train_loss": 0.3, "val_loss": 0.25, "metric": None, "seconds": 0.1}
        for s in (10, 20)
    ]
    for m in unit.members:
        ledger.finish_trial(ledger.start_trial(study.id, m.config_hash), _pruned(history))
    rows = ledger.trials(study.id)
    value, at = told(rows)
    assert at == 2 and value == pytest.approx(0.25 / rows[0].baseline_loss)
    again = Draws(sampling(spec, space, rows, 2, lambda hashes: {}))
    (past,) = again.study.trials
    assert past.state == TrialState.PRUNED and past.intermediate_values == {2: pytest.approx(value)}


def _pruned(history: list[dict]):
    import trainers
    from trainers.result import Evaluation

    return trainers.TrialResult(
        status="pruned", reason="stopped early by the scheduler", final_val_loss=0.25, steps=20,
        history=[Evaluation(**e) for e in history], baseline_loss=1 / 6,
    )  # fmt: skip


# ----- end to end, on a real Ray ---------------------------------------------------------------------


def run_by_lr(engine, spec: StudySpec) -> tuple:
    """The study run to its end: each trial trained once, some point stopped early, a point's seeds
    sharing their fate and their evaluations; (study, trials, trials by lr)."""
    study = engine.create_study(spec)
    assert engine.run_study(study.id)["state"] == "done"
    trials = engine.ledger.trials(study.id)
    assert len(trials) == 6 and all(t.runs == 1 for t in trials)
    by_lr: dict[float, list] = {}
    for t in trials:
        by_lr.setdefault(t.params["lr"], []).append(t)
    assert any(t.status == "pruned" for t in trials), "no point was stopped early"
    for lr, seeds in by_lr.items():
        assert len({(t.status, len(t.history)) for t in seeds}) == 1, lr
    return study, trials, by_lr


@pytest.mark.slow
def test_asha_prunes_whole_points_once_and_keeps_the_best_to_its_end(engine, mlflow_uri):
    """lr 1e-2 learns; 1e-9 and 1e-8 do not move from their start (objective ≈ 8 against ≈ 1.4). One unit
    at a time, each worse point is stopped at its first rung with both seeds, each trained once."""
    study, trials, by_lr = run_by_lr(engine, asha_spec())
    assert [(t.status, len(t.history)) for t in by_lr[1e-2]] == [("done", 8)] * 2
    pruned = [t for t in trials if t.status == "pruned"]
    assert all(t.baseline_loss and len(t.history) < 8 and t.final_val_loss == t.history[-1]["val_loss"]
               for t in pruned)  # fmt: skip
    total = engine.summary(study.id)["success"]["total"]
    assert total["pruned"] == len(pruned) and total["finished"] == 6
    for t in pruned:
        n = len(t.history)
        assert t.reason == f"stopped early by the scheduler after {n} evaluation{'s' * (n > 1)}"
        assert t.budget_steps == 80
    done = next(t for t in trials if t.status == "done")
    assert {t.param_count for t in pruned} == {done.param_count} and done.param_count  # it read 0
    assert all(t.final_metric is None and t.history[-1]["metric"] is None for t in pruned)  # no metric
    assert {(t.device, t.node) for t in trials} == {(done.device, done.node)} and done.node
    from mlflow.tracking import MlflowClient  # the parent run counts them too, beside failed

    parent = MlflowClient(mlflow_uri).get_run(engine.ledger.study(study.id).mlflow_run_id)
    assert parent.data.metrics["pruned"] == len(pruned) and parent.data.metrics["failed"] == 0


@pytest.mark.slow
def test_a_pruned_trial_records_its_last_metric_and_where_it_trained(engine, mlflow_uri):
    """The driver never receives a pruned trial's result, so its row (and child run) lacked what a
    finished one has: its task's metric (copy's recall accuracy) at its last evaluation, the device and
    node it trained on, and where its numbers came from (numerics mode, MKL, capability, versions)."""
    from mlflow.tracking import MlflowClient

    _, trials, _ = run_by_lr(engine, asha_spec(base={**LONG, "task": "copy", "seq_len": 24}))
    done = next(t for t in trials if t.status == "done")
    assert done.metric_name == "recall_accuracy" and done.device and done.node and done.provenance
    client = MlflowClient(mlflow_uri)
    for t in (t for t in trials if t.status == "pruned"):
        last = t.history[-1]["metric"]
        assert last is not None and t.final_metric == last
        assert (t.device, t.node) == (done.device, done.node)
        # where its numbers came from, as the finished trials' (but how their bundle ran, which its
        # trainer records with their results: `bundle_members`)
        assert t.provenance == _numerics(done.provenance)
        assert {"numerics", "capability", "torch"} <= set(t.provenance)
        run = client.get_run(t.mlflow_run_id)  # its child run's tags and metrics come from its row
        assert (run.data.tags["memsweep.device"], run.data.tags["memsweep.node"]) == (t.device, t.node)
        assert run.data.tags["memsweep.provenance.numerics"] == t.provenance["numerics"]
        assert run.data.metrics["final_metric"] == pytest.approx(last)


@pytest.mark.slow
def test_asha_judges_the_seeds_of_a_cell_that_does_not_fuse_together_each_as_it_trains_alone(engine):
    """LSTM does not fuse: a point's two seeds train in lockstep in one unit, stopped together at a rung,
    and a trial trained to its end has the numbers of the same config trained alone, bit for bit."""
    import trainers

    _, _, by_lr = run_by_lr(engine, asha_spec(base={**LONG, "cell": "lstm"}))
    assert [t.status for t in by_lr[1e-2]] == ["done"] * 2
    for t in by_lr[1e-2]:
        alone = trainers.train(t.config)
        assert (alone.final_val_loss, [e.val_loss for e in alone.history]) == (
            t.final_val_loss,
            [e["val_loss"] for e in t.history],
        )


@pytest.mark.slow
def test_a_lockstep_unit_costs_each_of_its_seeds(engine):
    """A unit that does not fuse was calibrated on its first member alone but costed as its whole unit:
    an asha point of 2 LSTM seeds was estimated at one seed's time. Its probe is one member now, and
    each member pays it: the same cached calibration costs the 2-seed units' training twice the 1-seed
    ones' beyond their set-up."""
    from service.planning.plan import plan_spec

    two = plan_spec(engine, asha_spec(base={**LONG, "cell": "lstm"}))
    one = plan_spec(engine, asha_spec(base={**LONG, "cell": "lstm"}, seeds=[1]))
    (shape,) = two.shapes
    assert (shape.fused, shape.bundle_size, shape.units) == (False, 1, 3) and one.shapes[0].key == shape.key
    assert one.shapes[0].cached  # the same shape, from the cache: one measurement prices both
    setup = 3 * shape.calibration.setup_seconds
    assert two.estimate.training_seconds - setup == pytest.approx(2 * (one.estimate.training_seconds - setup))


@pytest.mark.slow
def test_a_point_stopped_at_its_last_evaluation_is_done(engine):
    """Its only rung is its last evaluation (grace 2 of 2): the worse point, judged second, is stopped
    there, after its results went out with that evaluation. Before, it was recorded pruned."""
    spec = asha_spec(
        space={"dims": {"lr": [1e-2, 1e-9]}}, base={**TINY, "steps": 20}, asha={"grace_period": 2}
    )
    study = engine.create_study(spec)
    assert engine.run_study(study.id)["state"] == "done"
    trials = engine.ledger.trials(study.id)
    assert [(t.status, len(t.history), t.runs) for t in trials] == [("done", 2, 1)] * 4


@pytest.mark.slow
def test_a_sampled_asha_study_resumes_with_its_pruned_points_as_history(engine):
    spec = asha_spec(space={"dims": {"lr": {"loguniform": [1e-9, 1e-2]}}}, sampler="random", max_trials=8,
                     sampler_seed=3)  # fmt: skip
    study = engine.create_study(spec)
    assert engine.run_study(study.id)["state"] == "done"
    trials = engine.ledger.trials(study.id)
    assert len(trials) == 8 and all(t.status in ("done", "pruned") and t.runs == 1 for t in trials)
    points: dict[float, set] = {}
    for t in trials:
        points.setdefault(t.params["lr"], set()).add((t.status, len(t.history)))
    assert all(len(fates) == 1 for fates in points.values())
    assert engine.extend_study(study.id, spec.model_copy(update={"max_trials": 10})) == 2
    assert engine.run_study(study.id)["state"] == "done"
    again = engine.ledger.trials(study.id)
    assert len(again) == 10 and all(t.runs == 1 for t in again)


@pytest.mark.slow
def test_an_extended_asha_grid_is_judged_against_its_earlier_points(engine):
    """Run 1: lr 1e-2 goes on, 1e-9 is stopped. Extended by a point as bad as 1e-9, run 2's scheduler
    starts with run 1's rungs and stops it (an empty one let it train to its end). Extended by a seed,
    run 3 trains the new seed of the point that went on, counted with its earlier seeds, and prunes the
    new seeds of the stopped points untrained, with them."""
    spec = asha_spec(space={"dims": {"lr": [1e-2, 1e-9]}})
    study = engine.create_study(spec)
    assert engine.run_study(study.id)["state"] == "done"
    wider = spec.model_copy(
        update={"space": spec.space.model_copy(update={"dims": {"lr": [1e-2, 1e-9, 1e-8]}})}
    )
    assert engine.extend_study(study.id, wider) == 2
    assert engine.run_study(study.id)["state"] == "done"
    fates = {
        (t.params["lr"], t.params["seed"]): (t.status, len(t.history), t.runs)
        for t in engine.ledger.trials(study.id)
    }
    assert fates[(1e-8, 1)] == fates[(1e-8, 2)] == ("pruned", 1, 1)
    assert fates[(1e-2, 1)] == ("done", 8, 1)
    assert engine.extend_study(study.id, wider.model_copy(update={"seeds": [1, 2, 3]})) == 3
    plan, packed = plan_study(engine, study.id, calibrate=False)  # the two pruned points' seeds: no cost
    assert (plan.to_run, plan.reused, plan.pruned_untrained) == (1, 6, 2)
    assert packed is not None and [[m.params["lr"] for m in u.members] for u in packed] == [[1e-2]]
    assert any("2 trials are seeds added to points it stopped before" in n for n in plan.notes), plan.notes
    assert engine.run_study(study.id)["state"] == "done"
    trials = {(t.params["lr"], t.params["seed"]): t for t in engine.ledger.trials(study.id)}
    assert (trials[(1e-2, 3)].status, len(trials[(1e-2, 3)].history)) == ("done", 8)
    for lr in (1e-9, 1e-8):
        added = trials[(lr, 3)]
        # never started: its `runs` said 1, and the run's actual counted it as trained
        assert added.status == "pruned" and added.history == [] and added.runs == 0
        assert added.reason.startswith(
            "its point was stopped early by the scheduler before this seed was added"
        )
    assert all(t.runs == 1 for (lr, seed), t in trials.items() if (lr, seed) not in ((1e-9, 3), (1e-8, 3)))


def test_a_pruned_run_counts_at_a_budget_up_to_where_it_was_stopped():
    """At a budget it reached, a pruned run has its evaluation there (the run would have ended with it);
    beyond, no result. It counted as a failure even at the step where it was stopped."""
    from types import SimpleNamespace

    from service.reports.summary import state_at

    pruned = SimpleNamespace(status="pruned", steps=100, final_val_loss=0.2,
                             history=[{"step": 50, "val_loss": 0.3}, {"step": 100, "val_loss": 0.2}])  # fmt: skip
    assert state_at(pruned, 50) == ("done", 0.3) and state_at(pruned, 100) == ("done", 0.2)
    assert state_at(pruned, 150) == ("pruned", 0.2)
    failed = SimpleNamespace(**{**vars(pruned), "status": "failed"})
    assert state_at(failed, 100) == ("failed", 0.2) and state_at(failed, 50) == ("done", 0.3)


# memsweep's asha scheduler (`PrimedAsha`, on Tune's public scheduler API) decides as Ray's ASHAScheduler
# with one bracket: on random report sequences of interleaved units, unprimed against Ray's own, primed
# against Ray's with its private rungs filled the way memsweep once filled them.


def rays_asha(asha: Asha, history: Sequence[Mapping[int, float]]) -> Any:
    """Ray's ASHAScheduler, its rungs primed by writing into them (what memsweep did before)."""
    from ray.tune.schedulers import ASHAScheduler

    class Primed(ASHAScheduler):
        def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
            taken = bool(super().set_search_properties(metric, mode, **spec))
            for i, values in enumerate(history):
                for milestone, recorded in self._brackets[0]._rungs:
                    at = math.ceil(milestone)
                    if at in values:
                        recorded[f"before-{i}"] = self._metric_op * values[at]
            return taken

    return Primed(
        time_attr="evaluations", grace_period=asha.grace_period, reduction_factor=asha.reduction_factor,
        max_t=ASHA_MAX_EVALUATIONS, stop_last_trials=False,
    )  # fmt: skip


def drawn_objective(rng: random.Random) -> float:
    """Ties often (a few levels), a NaN now and then (a diverged point's mean)."""
    roll = rng.random()
    if roll < 0.05:
        return math.nan
    return rng.choice([0.1, 0.5, 1.0, 2.0]) if roll < 0.5 else rng.uniform(0.0, 3.0)


def scenario(
    seed: int, primed: bool
) -> tuple[Asha, str, list[dict[int, float]], list[tuple[str, str, dict]]]:
    """(settings, mode, history, calls): units reporting interleaved, each `evaluations` rising by 0 to
    3 at a time (passing several rungs at once), some results without the objective, each unit's last
    result told as its completion."""
    rng = random.Random(seed)
    asha = Asha(grace_period=rng.choice([1, 2, 3, 5]), reduction_factor=rng.choice([1.5, 2.0, 2.5, 3.0, 4.0]))
    history = []
    if primed:
        for _ in range(rng.randint(1, 8)):
            history.append({e: drawn_objective(rng) for e in range(1, rng.randint(1, 25) + 1)})
    units = {f"unit-{k}": (0, rng.randint(1, 30)) for k in range(rng.randint(2, 8))}
    calls: list[tuple[str, str, dict]] = []
    while units:
        unit = rng.choice(sorted(units))
        at, end = units[unit]
        at = min(end, at + rng.choice([0, 1, 1, 1, 2, 3]))
        result: dict[str, Any] = {"evaluations": at, "objective": drawn_objective(rng)}
        if rng.random() < 0.03:
            del result["objective"]
        calls.append(("result", unit, result))
        units[unit] = (at, end)
        if at == end:
            calls.append(("complete", unit, result))
            del units[unit]
    return asha, rng.choice(["min", "min", "max"]), history, calls


@pytest.mark.parametrize("primed", [False, True])
def test_primed_asha_decides_as_rays_asha(primed: bool):
    from ray.tune.schedulers import ASHAScheduler

    from service.study.ray_tune import PrimedAsha

    decided = 0
    for seed in range(300):
        asha, mode, history, calls = scenario(seed, primed)
        ours = PrimedAsha(asha, history)
        ray = (
            rays_asha(asha, history)
            if primed
            else ASHAScheduler(
                time_attr="evaluations", grace_period=asha.grace_period,
                reduction_factor=asha.reduction_factor, max_t=ASHA_MAX_EVALUATIONS, stop_last_trials=False,
            )
        )  # fmt: skip
        trials = {}
        for scheduler in (ours, ray):
            assert scheduler.set_search_properties("objective", mode)
        stopped: set[str] = set()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a rung of NaNs only: its cutoff is NaN
            for call, unit, result in calls:
                if unit in stopped:
                    continue
                if unit not in trials:
                    trials[unit] = SimpleNamespace(trial_id=unit)
                    ours.on_trial_add(None, trials[unit])
                    ray.on_trial_add(None, trials[unit])
                if call == "complete":
                    ours.on_trial_complete(None, trials[unit], dict(result))
                    ray.on_trial_complete(None, trials[unit], dict(result))
                    continue
                expected = ray.on_trial_result(None, trials[unit], dict(result))
                assert ours.on_trial_result(None, trials[unit], dict(result)) == expected, (
                    seed,
                    unit,
                    result,
                )
                decided += 1
                if expected == ASHAScheduler.STOP:  # Tune stops it and tells its last result
                    ours.on_trial_complete(None, trials[unit], dict(result))
                    ray.on_trial_complete(None, trials[unit], dict(result))
                    stopped.add(unit)
    assert decided > 3000
