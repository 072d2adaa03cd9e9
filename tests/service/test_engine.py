"""The study engine end to end: a real local Ray, a real MLflow server on loopback, a real SQLite ledger."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from service.core.spec import StudySpec
from tests.runs import child_runs
from tests.service.cluster import ray_head
from tests.service.conftest import TINY
from trainers.numerics import default_mode

pytestmark = pytest.mark.slow


def grid_spec(**kw) -> StudySpec:
    data = {
        "name": "tiny-grid",
        "space": {
            "models": {
                "chain": {"fixed": {"init": "chain"}, "dims": {"lr": [1e-3, 50.0]}},
                "orth": {"fixed": {"init": "orthogonal"}, "dims": {"lr": [1e-3, 50.0]}},
            }
        },
        "base": {**TINY, "clip_norm": None},  # lr 50 without clipping goes non-finite: failed trials
        "seeds": [1, 2],
        "success_threshold": 1 / 3,  # a loose criterion (2 × baseline), so that some trials succeed
    }
    data.update(kw)
    return StudySpec.model_validate(data)


def test_grid_runs_every_point_and_seed_once_and_mlflow_agrees(engine, mlflow_uri):
    study = engine.create_study(grid_spec())
    summary = engine.run_study(study.id)
    trials = engine.ledger.trials(study.id)
    assert len(trials) == 8 and summary["state"] == "done"
    assert all(t.runs == 1 for t in trials)  # exactly once
    assert {(t.model, t.params["lr"], t.params["seed"]) for t in trials} == {
        (m, lr, s) for m in ("chain", "orth") for lr in (1e-3, 50.0) for s in (1, 2)
    }
    failed = [t for t in trials if t.status == "failed"]
    assert (
        failed
        and all("not finite" in t.reason for t in failed)
        and all(t.params["lr"] == 50.0 for t in failed)
    )
    done = [t for t in trials if t.status == "done"]
    assert all(t.history and t.final_val_loss == t.history[-1]["val_loss"] for t in done)
    criterion = StudySpec.model_validate(study.spec).criterion()
    won = [t for t in trials if t.succeeded(criterion)]
    assert won and all(t.status == "done" and t.final_val_loss < 1 / 3 for t in won)
    assert summary["success"]["criterion"]["name"] == "loss < 0.333333"

    # where each trained: this host, its Ray node told apart from another on the same host by its id
    assert all(
        re.fullmatch(rf"{re.escape(socket.gethostname())}/[\d.]+ \([0-9a-f]{{8}}\)", t.node or "")
        for t in trials
    )
    exp_id, parent = summary["mlflow"]["experiment_id"], summary["mlflow"]["run_id"]
    runs = child_runs(mlflow_uri, exp_id, parent)
    assert sorted(r.data.tags["memsweep.config_hash"] for r in runs) == sorted(t.config_hash for t in trials)
    # where each trial's numbers came from, under one name: its config's mode, computed so by a Ray
    # worker, in the ledger and on its MLflow child run
    assert {t.config["numerics"] for t in trials} == {default_mode()}
    assert all(t.provenance and t.provenance["numerics"] == default_mode() for t in trials)
    by_hash = {t.config_hash: t.provenance for t in trials}
    for r in runs:
        tagged = {
            k.removeprefix("memsweep.provenance."): v for k, v in r.data.tags.items() if "provenance." in k
        }
        assert tagged == by_hash[r.data.tags["memsweep.config_hash"]]
    client = MlflowClient(mlflow_uri)
    parent_metrics = client.get_run(parent).data.metrics
    succeeded_children = [r for r in runs if r.data.metrics.get("success") == 1.0]
    assert parent_metrics["succeeded"] == len(succeeded_children) == summary["counts"]["succeeded"] > 0
    # the last count of finished runs is the study's end (it was the last throttled progress write's)
    assert parent_metrics["finished"] == len(trials) == summary["success"]["total"]["finished"]
    for model in ("chain", "orth"):
        n = sum(r.data.tags["memsweep.model"] == model for r in succeeded_children)
        assert parent_metrics[f"success_count.{model}"] == n
    assert {r.info.status for r in runs if r.data.tags["memsweep.status"] == "failed"} == {"FAILED"}
    # its summary.json says how it ended (it said "running": written before the ledger's row was)
    written = json.loads(
        Path(client.download_artifacts(parent, "summary.json", str(engine.settings.home))).read_text()
    )
    assert written["state"] == "done" == summary["state"]
    arts = {a.path for a in client.list_artifacts(parent, "plots")}
    assert {
        "plots/success_per_model.png",
        "plots/success_vs_budget.png",
        "plots/best_config_curves.png",
        "plots/weight_profiles.png",
    } <= arts
    # successes against budget: a metric per model whose steps are the budgets (the UI draws the curve)
    curve = client.get_metric_history(parent, "success_vs_budget.chain")
    assert [m.step for m in sorted(curve, key=lambda m: m.step)] == [10, 20]
    assert max(curve, key=lambda m: m.step).value == parent_metrics["success_count.chain"]  # at the end
    assert client.get_run(parent).data.tags["memsweep.criterion"] == "loss < 0.333333"
    # Orhan Table 2 / Figs. 5-6 on the parent run: Henrici index and weight profiles of successful trials
    chain_ok = [t for t in won if t.model == "chain"]
    assert chain_ok and all(len(t.profile) == 2 * TINY["hidden"] - 1 for t in chain_ok)
    mean_h = sum(t.henrici_index for t in chain_ok) / len(chain_ok)
    assert parent_metrics["henrici_mean.chain"] == pytest.approx(mean_h)
    assert any(
        a.path == "recurrent_matrix.json" for a in client.list_artifacts(succeeded_children[0].info.run_id)
    )
    assert succeeded_children[0].data.metrics["henrici_index"] >= 0


def test_runs_leave_no_experiment_folder_and_register_one_trainable_per_resource_shape(engine, monkeypatch):
    """Tune's experiment folder (its state, which nothing reads: the ledger resumes a study) goes once
    its run ends, and `run_unit` is registered under one name per resource shape: before, every run left
    a folder under ~/.memsweep/ray_results and a new name in Tune's process-wide registry."""
    from ray import tune

    names: list[str] = []
    register = tune.register_trainable
    monkeypatch.setattr(
        tune, "register_trainable", lambda name, *a, **kw: (names.append(name), register(name, *a, **kw))
    )
    for seed in (1, 2):
        study = engine.create_study(
            grid_spec(name=f"left-{seed}", seeds=[seed], space={"dims": {"lr": [1e-3]}})
        )
        assert engine.run_study(study.id)["state"] == "done"
    assert len(names) == 2 and len(set(names)) == 1, names
    results = engine.settings.home / "ray_results"
    assert not results.exists() or list(results.iterdir()) == []


def test_extend_runs_only_new_points_and_identical_configs_are_reused(engine):
    study = engine.create_study(grid_spec())
    engine.run_study(study.id)
    before = {t.config_hash: (t.final_val_loss, t.runs) for t in engine.ledger.trials(study.id)}
    added = engine.extend_study(study.id, grid_spec(seeds=[1, 2, 3]))
    assert added == 4
    engine.run_study(study.id)
    after = engine.ledger.trials(study.id)
    assert len(after) == 12 and all(t.status in ("done", "failed") for t in after)
    for t in after:
        if t.config_hash in before:
            assert (t.final_val_loss, t.runs) == before[t.config_hash]  # not run again
        else:
            assert t.runs == 1 and t.params["seed"] == 3
    # a new study with the same configs reuses the finished results instead of training again
    again = engine.create_study(grid_spec())
    engine.run_study(again.id)
    reused = engine.ledger.trials(again.id)
    assert all(t.runs == 0 and t.reused_from is not None for t in reused if t.status == "done")
    assert sum(t.status == "done" for t in reused) == sum(
        before_status == "done" for before_status in [t.status for t in after if t.params["seed"] < 3]
    )


def test_a_study_under_another_criterion_recounts_without_training_anything(engine):
    """The criterion is the study's: a second study of the same grid that differs only in it reuses
    every finished run (no trial trains: runs stay 0) and counts them under its own criterion."""
    from service.reports.summary import success_table
    from trainers import Criterion

    first = engine.create_study(
        grid_spec(space={"dims": {"lr": [1e-3, 3e-3], "init": ["chain", "orthogonal"]}})
    )
    engine.run_study(first.id)
    done = engine.ledger.trials(first.id)
    assert all(t.status == "done" for t in done)
    strict = engine.create_study(
        grid_spec(
            space={"dims": {"lr": [1e-3, 3e-3], "init": ["chain", "orthogonal"]}},
            success_threshold=None,
            success_fraction=0.6,
        )
    )
    summary = engine.run_study(strict.id)
    trials = engine.ledger.trials(strict.id)
    assert len(trials) == 8 and all(
        t.runs == 0 and t.reused_from is not None for t in trials
    )  # nothing trained
    assert summary["success"]["criterion"]["fraction"] == 0.6
    # their MLflow child runs say whose result they carry (they read as trained runs)
    runs = child_runs(
        engine.settings.mlflow_tracking_uri, summary["mlflow"]["experiment_id"], summary["mlflow"]["run_id"]
    )
    by_hash = {t.config_hash: t for t in trials}
    assert sorted(r.data.tags["memsweep.reused_from"] for r in runs) == sorted(
        str(t.reused_from) for t in trials
    )
    assert all(
        r.data.tags["memsweep.reused_from"] == str(by_hash[r.data.tags["memsweep.config_hash"]].reused_from)
        for r in runs
    )
    expected = success_table(done, Criterion(fraction=0.6)).model_dump(mode="json")
    assert summary["success"]["by_model"] == expected["by_model"]
    assert engine.summary(first.id)["success"]["criterion"]["name"] == "loss < 0.333333"  # each its own


def test_the_issues_addition_run_recovers_and_succeeds_solo_fused_and_in_a_study(engine):
    """Issue 14's example: addition T = 100, identity λ = 1, N = 100, lr 1e-3, seed 1. Its first 50
    steps average a training loss far above 1,000 × the baseline (the old divergence stop failed it
    there); Keras trains on, and so does memsweep: it ends below half the baseline, alone and as a member
    of a fused bundle in a study (one bundle of both learning rates: the same numbers as alone)."""
    from service.study.search import materialize
    from trainers import HALF_BASELINE, train

    point = {"task": "addition", "seq_len": 100, "init": "identity", "scale": 1.0, "hidden": 100, "steps": 1000,
             "eval_every": 50, "seed": 1}  # fmt: skip
    solo = train(materialize({**point, "lr": 1e-3}))
    assert solo.history[0].train_loss > 1e3 * solo.baseline_loss, solo.history[0]
    assert solo.status == "done" and HALF_BASELINE.judge_result(solo), [e.val_loss for e in solo.history]
    spec = StudySpec.model_validate(
        {
            "space": {"dims": {"lr": [1e-3, 3e-4]}},
            "base": {k: v for k, v in point.items() if k != "seed"},
            "seeds": [1],
            "bundle_size": 2,  # the two points in one fused bundle
        }
    )
    study = engine.create_study(spec)
    engine.run_study(study.id)
    (row,) = [t for t in engine.ledger.trials(study.id) if t.params["lr"] == 1e-3]
    assert row.final_val_loss == solo.final_val_loss and row.succeeded(HALF_BASELINE)
    assert [e["val_loss"] for e in row.history] == [e.val_loss for e in solo.history]
    assert (row.provenance or {}).get("bundle_members") == "2"  # a member of a bundle of two


def test_mlflow_is_a_projection_a_sync_rebuilds_from_the_ledger(engine, mlflow_uri):
    """Runs lost or left incomplete in MLflow (it was down, or its store was reset) are rebuilt from the
    ledger: every finished trial ends with exactly one complete child run, with its matrices; a child
    run no trial owns is deleted; the parent run gets its summary again."""
    study = engine.create_study(grid_spec(space={"dims": {"lr": [1e-3], "init": ["chain", "orthogonal"]}}))
    summary = engine.run_study(study.id)
    exp_id, parent = summary["mlflow"]["experiment_id"], summary["mlflow"]["run_id"]
    client = MlflowClient(mlflow_uri)
    curves = [k for k in client.get_run(parent).data.metrics if k.startswith("success_vs_budget.")]
    points = {k: [(m.step, m.value) for m in client.get_metric_history(parent, k)] for k in curves}
    assert curves and all(points.values())
    trials = engine.ledger.trials(study.id)
    lost, torn = trials[0], trials[1]
    client.delete_run(lost.mlflow_run_id)  # gone from MLflow
    client.update_run(torn.mlflow_run_id, status="RUNNING")  # an outage between its first and last write
    stray = client.create_run(exp_id, tags={"mlflow.parentRunId": parent}).info.run_id  # no trial's
    client.set_terminated(stray)
    client.update_run(parent, status="RUNNING")
    synced = engine.sync_tracking(study.id)
    assert synced["mlflow_errors"] == []
    runs = child_runs(mlflow_uri, exp_id, parent)
    after = engine.ledger.trials(study.id)
    assert sorted(r.data.tags["memsweep.config_hash"] for r in runs) == sorted(t.config_hash for t in after)
    assert {r.info.run_id for r in runs} == {t.mlflow_run_id for t in after} and stray not in {
        r.info.run_id for r in runs
    }
    assert all(r.info.status in ("FINISHED", "FAILED") for r in runs)
    rebuilt = {t.config_hash: t.mlflow_run_id for t in after}
    assert rebuilt[lost.config_hash] != lost.mlflow_run_id and rebuilt[torn.config_hash] != torn.mlflow_run_id
    for run_id in (rebuilt[lost.config_hash], rebuilt[torn.config_hash]):
        paths = {a.path for a in client.list_artifacts(run_id)}
        assert "recurrent_matrix.json" in paths and client.get_run(run_id).data.metrics["final_val_loss"] > 0
    assert (
        client.get_run(parent).info.status == "FINISHED"
        and client.get_run(parent).data.metrics["trials"] == 4
    )
    assert engine.ledger.get_study(study.id).error is None
    # the curve of successes against budget, unchanged, is not written again: the UI draws every point
    # of a metric's history, and each sync (each end of a run) added the counts once more at each budget
    assert {k: [(m.step, m.value) for m in client.get_metric_history(parent, k)] for k in curves} == points


def test_tpe_study_runs_through_optuna_search(engine):
    spec = StudySpec.model_validate(
        {
            "space": {"dims": {"lr": {"loguniform": [1e-4, 1e-2]}, "init": ["chain", "orthogonal"]}},
            "base": TINY,
            "seeds": [1, 2],
            "sampler": "tpe",
            "max_trials": 6,
            "concurrency": 2,
        }
    )
    study = engine.create_study(spec)
    assert engine.ledger.counts(study.id)["total"] == 0  # points are sampled as the study runs
    engine.run_study(study.id)
    trials = engine.ledger.trials(study.id)
    assert len(trials) == 6 and all(t.status == "done" for t in trials)
    points = {(t.params["lr"], t.params["init"]) for t in trials}
    assert len(points) == 3 and all(1e-4 <= lr <= 1e-2 for lr, _ in points)
    for point in points:  # every sampled point ran for every seed
        assert sorted(t.params["seed"] for t in trials if (t.params["lr"], t.params["init"]) == point) == [
            1,
            2,
        ]
    # extended, the sampler draws on from its history (Ray's OptunaSearch refused a define-by-run
    # space's history: every resumed or extended sampled study failed) and trains only new points
    assert engine.extend_study(study.id, spec.model_copy(update={"max_trials": 8})) == 2
    assert engine.run_study(study.id)["state"] == "done"
    again = engine.ledger.trials(study.id)
    assert len(again) == 8 and all(t.status == "done" and t.runs == 1 for t in again)


def test_a_point_drawn_again_while_it_trains_runs_once_under_ray(engine):
    """Ray Tune asks for two units at once, and this seeded sampler draws the same point for both (a
    discrete space: Optuna's samplers repeat): the second waits for the first and is then counted from
    the ledger. Before, both trained it at once: its row started twice, and the later unit's reports
    crashed the driver's book or overwrote the result."""
    spec = StudySpec.model_validate(
        {
            "space": {"dims": {"init": ["chain", "orthogonal"]}},
            "base": {**TINY, "steps": 400, "eval_every": 100},  # long enough to overlap
            "seeds": [1],
            "sampler": "random",
            "sampler_seed": 1,  # draws orthogonal, orthogonal, chain, …
            "max_trials": 5,
            "concurrency": 2,
        }
    )
    study = engine.create_study(spec)
    assert engine.run_study(study.id)["state"] == "done"
    trials = engine.ledger.trials(study.id)
    assert sorted(t.params["init"] for t in trials) == ["chain", "orthogonal"]
    assert all(t.status == "done" and t.runs == 1 for t in trials)


def test_a_unit_whose_ray_worker_dies_trains_again_in_the_same_run(engine, monkeypatch, caplog):
    """A unit's Ray worker killed mid-unit (as a lost node would) sends its members back, and they train
    again in the same Tune run, on the next free slot (`UnitQueue`); before, they waited for the round's
    last unit, then a second round. Each trial is recorded once: the killed one started twice. The log
    says so in one line (Tune logged the traceback as an ERROR, and "Trials did not complete")."""
    import logging
    import threading

    from service.core.processes import ray_workers

    class Kept(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.said: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.said.append(f"{record.levelname} {record.getMessage()}")

    tune_said = Kept()
    tune_logs = [logging.getLogger(n) for n in ("ray.tune.tune", "ray.tune.execution.tune_controller")]
    for logger in tune_logs:
        logger.addHandler(tune_said)
    caplog.set_level(logging.WARNING, logger="service.study.ray_tune")

    spec = grid_spec(base={**TINY, "steps": 3000, "eval_every": 500}, bundle_size=1, seeds=[1], concurrency=1,
                     space={"dims": {"lr": [1e-3, 3e-4, 1e-4]}})  # fmt: skip
    study = engine.create_study(spec)
    runs, run = [], engine.executor.run
    monkeypatch.setattr(
        engine.executor, "run", lambda request, book: (runs.append(request), run(request, book))
    )
    ran = threading.Thread(target=engine.run_study, args=(study.id,))
    ran.start()
    killed, seen, deadline = None, None, time.monotonic() + 240
    try:
        while killed is None:  # a unit trains for about 3 s here: its worker is killed 1 s in
            assert time.monotonic() < deadline and ran.is_alive(), "no unit was ever seen training"
            running = [t for t in engine.ledger.trials(study.id) if t.status == "running"]
            workers = ray_workers(os.getpid())
            seen = (seen or time.monotonic()) if running and len(workers) == 1 else None
            if seen is not None and time.monotonic() - seen > 1.0:
                os.kill(workers[0], signal.SIGKILL)
                killed = running[0].config_hash
            time.sleep(0.05)
    finally:
        ran.join(300)
        for logger in tune_logs:
            logger.removeHandler(tune_said)
    assert not ran.is_alive()
    lost = [r.getMessage() for r in caplog.records if "lost its Ray worker" in r.getMessage()]
    assert len(lost) == 1 and lost[0].endswith("; 1 of them run again"), lost
    assert not [s for s in tune_said.said if s.startswith("ERROR")], tune_said.said
    trials = {t.config_hash: t for t in engine.ledger.trials(study.id)}
    assert len(runs) == 1  # one Tune run: no second round
    assert all(t.status == "done" for t in trials.values()), [(t.status, t.reason) for t in trials.values()]
    assert trials[killed].runs == 2 and all(t.runs == 1 for k, t in trials.items() if k != killed)
    assert engine.ledger.study(study.id).state == "done"


def test_a_running_trial_shows_its_evaluations_as_it_trains(engine, monkeypatch):
    """REST, the client and the CLI read the ledger: a trial's evaluations reach its row while it trains
    (at most every LIVE_INTERVAL seconds, here 0.2), not only at its end. What it showed was its curve so
    far: the finished row holds every evaluation, those first."""
    import threading

    from service.application.reads import trial_public
    from service.study import recorder
    from trainers import HALF_BASELINE

    monkeypatch.setattr(recorder, "LIVE_INTERVAL", 0.2)
    spec = grid_spec(base={**TINY, "steps": 4000, "eval_every": 250}, bundle_size=1, seeds=[1],
                     space={"dims": {"lr": [1e-3]}})  # fmt: skip
    study = engine.create_study(spec)
    ran = threading.Thread(target=engine.run_study, args=(study.id,))
    ran.start()
    shown: list[list[int]] = []  # the steps of the evaluations its row held, each time they grew
    try:
        while ran.is_alive():
            (row,) = engine.ledger.trials(study.id)
            if row.status == "running" and row.history and (not shown or len(row.history) > len(shown[-1])):
                shown.append([e["step"] for e in row.history])
                latest = trial_public(row, HALF_BASELINE).last_evaluation
                assert latest is not None and latest.step == shown[-1][-1]
            time.sleep(0.02)
    finally:
        ran.join(300)
    (row,) = engine.ledger.trials(study.id)
    assert row.status == "done", row.reason
    steps = [e["step"] for e in row.history]
    # live (a part of its curve before its end) and more than once; the last live write may hold every
    # evaluation, when it lands before the trial's result does
    assert len(shown) >= 2 and len(shown[0]) < len(steps), (shown, steps)
    assert all(seen == steps[: len(seen)] for seen in shown)


def memsweep(*args: str, env: dict[str, str], **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "service.cli.commands", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)  # fmt: skip


def test_a_killed_run_resumes_with_only_the_rest(tmp_path: Path, mlflow_uri: str):
    from service.store.ledger import Ledger

    spec = grid_spec(base={**TINY, "steps": 1500, "eval_every": 500}, bundle_size=2,
                     space={"dims": {"lr": [1e-3, 3e-4, 1e-4], "init": ["chain", "orthogonal"]}})  # fmt: skip
    path = tmp_path / "spec.json"
    path.write_text(spec.model_dump_json())
    env = {
        **os.environ,
        "MEMSWEEP_HOME": str(tmp_path / "home"),
        "MEMSWEEP_MLFLOW_TRACKING_URI": mlflow_uri,
        "MEMSWEEP_RAY_NUM_CPUS": "2",
    }
    proc = memsweep("run", str(path), "--json", env=env)
    ledger = None
    deadline = time.monotonic() + 240
    done_before: dict[str, float] = {}
    refused = ""
    while time.monotonic() < deadline:
        time.sleep(0.5)
        db = tmp_path / "home" / "ledger.db"
        if ledger is None and db.exists():
            ledger = Ledger(f"sqlite:///{db}")
        if ledger is None or not ledger.list_studies():
            continue
        study_id = ledger.list_studies()[0].id
        if not refused and ledger.study(study_id).owner is not None:
            # a second run of the running study is refused, naming the process that runs it, before it
            # starts anything (before, it ran the study's trials again beside the first)
            second = memsweep("run", "--study", study_id, "--json", env=env)
            out, err = second.communicate(timeout=120)
            refused = err
            assert second.returncode == 1 and "is being run by another process" in err, err[-3000:]
            assert f"/{proc.pid}/" in err  # the first run's process, by host, pid and start time
        if ledger.counts(study_id)["done"] >= 3:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver and its embedded Ray, mid-study
            proc.wait()
            done_before = {t.config_hash: t.final_val_loss for t in ledger.trials(study_id, ["done"])}
            break
    assert done_before, "the study never got three trials done"
    assert refused, "the study was never seen claimed by its run"
    assert ledger.counts(study_id)["total"] == 12 > len(done_before)
    resumed = memsweep("run", "--study", study_id, "--json", env=env)
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]
    final = json.loads(out.strip().splitlines()[-1])
    assert final["study_id"] == study_id and final["done"] == 12
    trials = ledger.trials(study_id)
    for t in trials:
        assert t.status == "done"
        if t.config_hash in done_before:
            assert t.runs == 1 and t.final_val_loss == done_before[t.config_hash]  # not run again
        else:
            assert t.runs in (1, 2)  # at most the interrupted ones started twice
    assert sum(t.runs for t in trials) <= 12 + 4  # 2 fused bundles of 2 at once: at most four interrupted


def test_joins_a_ray_cluster_started_with_ray_start(tmp_path: Path, mlflow_uri: str):
    with ray_head(tmp_path, "--num-cpus=2") as (env, port):
        spec = grid_spec(space={"dims": {"lr": [1e-3]}}, seeds=[1, 2])
        path = tmp_path / "spec.json"
        path.write_text(spec.model_dump_json())
        run_env = {**env, "MEMSWEEP_HOME": str(tmp_path / "home"), "MEMSWEEP_MLFLOW_TRACKING_URI": mlflow_uri,
                   "MEMSWEEP_RAY_ADDRESS": f"127.0.0.1:{port}"}  # fmt: skip
        proc = memsweep("run", str(path), "--json", env=run_env)
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        final = json.loads(out.strip().splitlines()[-1])
        assert final["done"] == 2 and final["trials"] == 2
        assert f"127.0.0.1:{port}" in err or "Connecting to existing Ray cluster" in err


def test_a_study_that_leaves_the_clusters_gpu_idle_is_told_so_with_its_cost_there(
    tmp_path: Path, mlflow_uri: str
):
    """Issue 34: a study that asks no GPU trains on the CPUs even where the cluster has a GPU (Ray hides
    it from a task that asks none); its plan says so, with the plan of the same study at one GPU a
    unit (calibrated on the node that declares the GPU: this machine has none, so it trains on the
    CPU there). A study that asks the GPU is not told."""
    with ray_head(tmp_path, "--num-cpus=2", "--num-gpus=1") as (env, port):
        run_env = {**env, "MEMSWEEP_HOME": str(tmp_path / "home"), "MEMSWEEP_MLFLOW_TRACKING_URI": mlflow_uri,
                   "MEMSWEEP_RAY_ADDRESS": f"127.0.0.1:{port}"}  # fmt: skip
        notes = {}
        for gpus in (0.0, 1.0):
            spec = grid_spec(
                space={"dims": {"lr": [1e-3]}}, seeds=[1, 2], resources={"cpus": 1, "gpus": gpus}
            )
            path = tmp_path / f"spec-{gpus}.json"
            path.write_text(spec.model_dump_json())
            proc = memsweep("plan", str(path), "--json", env=run_env)
            out, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, err[-3000:]
            notes[gpus] = json.loads(out.strip().splitlines()[-1])["notes"]
        idle = [n for n in notes[0.0] if "GPU stays idle" in n]
        assert len(idle) == 1 and "the cluster has 1 GPU(s) and this study asks none" in idle[0], notes[0.0]
        assert (
            "`resources: {gpus: 1}`" in idle[0] and "would take about" in idle[0] and "on the CPUs" in idle[0]
        )
        assert not any("GPU stays idle" in n for n in notes[1.0]), notes[1.0]


def test_fused_bundles_give_each_trial_exactly_its_solo_result(tmp_path: Path, mlflow_uri: str, caplog):
    """A grid packed into fused bundles (the default) and the same grid one trial per Ray trial:
    the same ledger rows, bit for bit, and each bundle member still its own MLflow child run."""
    import logging

    from service.core.settings import Settings
    from service.study.engine import Engine

    results = {}
    for fused in (True, False):
        engine = Engine(Settings(home=tmp_path / str(fused), mlflow_tracking_uri=mlflow_uri, ray_num_cpus=2))
        study = engine.create_study(grid_spec(name=f"fused-{fused}", fused=fused, seeds=[1, 2, 3]))
        with caplog.at_level(logging.INFO, logger="service.study.engine"):
            summary = engine.run_study(study.id)
        trials = engine.ledger.trials(study.id)
        assert len(trials) == 12 and all(t.runs == 1 for t in trials)
        results[fused] = {
            t.config_hash: (
                t.status,
                t.final_val_loss,
                t.henrici_index,
                [e["val_loss"] for e in t.history or []],
            )
            for t in trials
        }
        runs = child_runs(mlflow_uri, summary["mlflow"]["experiment_id"], summary["mlflow"]["run_id"])
        assert sorted(r.data.tags["memsweep.config_hash"] for r in runs) == sorted(results[fused])
    assert results[True] == results[False]  # bit for bit, failures (lr 50 diverges) included
    assert sum(v[0] == "failed" for v in results[True].values()) == 6
    # 12 trials, 2 slots: chain and orth each cut into bundles of 6 → 2 Ray units instead of 12
    assert "12 trials in 2 Ray units" in caplog.text


SGORNN_ADDITION = {"steps": 60, "eval_every": 20, "hidden": 32}  # its T × lr grid at T = 30, 60 steps
SRNN_CUT = {"steps": 60, "eval_every": 20, "hidden": 32, "n_val": 64, "batch_size": 16}


@pytest.mark.parametrize(
    ("preset", "model", "dims", "base", "seeds"),
    [
        # SGORNN addition (Taylor-Melanson et al. Table 1) for each of its fused cells: T = 30, 60 steps
        ("sgornn2022-addition", "sgornn", {"seq_len": [30]}, SGORNN_ADDITION, [1, 2]),
        ("sgornn2022-addition", "vprnn", {"seq_len": [30]}, SGORNN_ADDITION, [1, 2]),
        ("sgornn2022-addition", "fastrnn", {"seq_len": [30]}, SGORNN_ADDITION, [1, 2]),
        # SRNN addition (Rotman & Wolf Fig. 3; one lr in the grid, so six seeds) for srnn: T = 20 (their copy
        # embeds its inputs, as their code does, and their uRNN is Arjovsky's: those trials train alone)
        ("srnn2020-addition", "srnn", {"seq_len": [20]}, SRNN_CUT, [1, 2, 3, 4, 5, 6]),
        # Emami's projected uRNN (its preset's teacher task is costly to build): addition T = 20, 3 learning
        # rates × 2 seeds. The numerics pass runs this one again under `native` (the engine's workers take
        # the mode): each fused cell's members equal to their solo runs under both modes is test_fused's
        pytest.param(
            None, "urnn", {"lr": [1e-3, 2e-3, 5e-4]}, {"cell": "urnn", "task": "addition", "seq_len": 20, **SRNN_CUT},
            [1, 2], marks=pytest.mark.numerics,
        ),
        # the contractive uRNN has no paper preset: the copy task, 3 learning rates × 2 seeds
        (
            None, "crnn", {"lr": [1e-3, 2e-3, 5e-4]},
            {"cell": "crnn", "task": "copy", "seq_len": 30, **SRNN_CUT}, [1, 2],
        ),
    ],
)  # fmt: skip
def test_every_fused_cell_runs_in_bundles_through_the_engine_and_equals_its_solo_runs(
    tmp_path: Path, mlflow_uri: str, caplog, preset, model, dims, base, seeds
):
    """Each cell that fuses, in a paper's preset where it has one (shortened budget), through the
    engine in fused bundles and one trial per Ray trial: the same ledger rows bit for bit (every
    evaluation's train and validation loss)."""
    import logging

    from service.core.settings import Settings
    from service.study.engine import Engine

    results = {}
    for fused in (True, False):
        engine = Engine(Settings(home=tmp_path / str(fused), mlflow_tracking_uri=mlflow_uri, ray_num_cpus=2))
        where = {"preset": preset, "models": [model], "dims": dims} if preset else {"space": {"dims": dims}}
        spec = StudySpec.model_validate(
            {**where, "base": base, "seeds": seeds, "name": f"{model}-{fused}", "fused": fused}
        )
        study = engine.create_study(spec)
        with caplog.at_level(logging.INFO, logger="service.study.engine"):
            engine.run_study(study.id)
        trials = engine.ledger.trials(study.id)
        assert len(trials) == 6 and all(t.runs == 1 and t.status == "done" for t in trials)
        results[fused] = {
            t.config_hash: [(e["train_loss"], e["val_loss"]) for e in t.history or []] for t in trials
        }
    assert results[True] == results[False]
    assert all(len(history) == 3 for history in results[True].values())
    assert "6 trials in 2 Ray units" in caplog.text  # two bundles of three, not six units


def test_an_nru_preset_runs_through_the_engine_on_the_nru_kernel(engine):
    """NRU's copy preset (Chandar et al. Fig. 2; shortened: T = 20, 40 steps, 2 seeds) through the
    engine: every trial done, each bit for bit what `trainers.train` gives in this process (the NRU cell
    runs its recurrence as `trainers.kernels_nru.NRUScan`, whose backward the trainers' tests check)."""
    import trainers
    from trainers.kernels_nru import NRUScan

    spec = StudySpec.model_validate({
        "name": "nru-copy", "preset": "nru2019-copy100", "models": ["nru"],
        "base": {"seq_len": 20, "steps": 40, "eval_every": 20, "n_train": 256, "n_val": 64},
        "seeds": [1, 2],
    })  # fmt: skip
    study = engine.create_study(spec)
    engine.run_study(study.id)
    trials = engine.ledger.trials(study.id)
    assert len(trials) == len(engine.ledger.trials(study.id)) >= 2
    assert all(t.status == "done" and t.runs == 1 for t in trials)
    used = []
    apply = NRUScan.apply
    NRUScan.apply = lambda *a: used.append(1) or apply(*a)  # the kernel is what the cell calls
    try:
        direct = trainers.train(trials[0].spec().resolved)
    finally:
        NRUScan.apply = apply
    assert used
    assert [(e.train_loss, e.val_loss) for e in direct.history] == [
        (e["train_loss"], e["val_loss"]) for e in trials[0].history or []
    ]
