"""The REST app in-process (FastAPI's TestClient, a real SQLite ledger), without Ray or MLflow: the server
runs no study here (MEMSWEEP_MAX_PARALLEL_STUDIES=0), and trial results are written to the ledger as the
engine would write them. The real server under uvicorn, with Ray and MLflow, is in test_api.py."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from pydantic import SecretStr

import trainers
from search_spaces import UnknownPresetError, get_preset
from service.api import create_app
from service.api.routes import docs
from service.client import MemsweepAPIError, MemsweepClient
from service.core.settings import Settings
from service.core.spec import StudySpec
from service.core.states import QUEUED, StudyState, TrialStatus
from service.reports.summary import best_configs, success_table
from service.store.ledger import Ledger, TrialSort
from tests.plugin_dists import memsweep, toy_cell, write_dist
from tests.service.conftest import TINY
from trainers import Criterion, Evaluation, TrialResult
from trainers.registry import UnknownNameError

TOKEN = "s3cret-token-for-tests"


def grid(**kw: Any) -> dict[str, Any]:
    spec = {
        "name": "unit-grid",
        "space": {
            "models": {
                "chain": {"fixed": {"init": "chain"}, "dims": {"lr": [1e-3, 1e-2]}},
                "orth": {"fixed": {"init": "orthogonal"}, "dims": {"lr": [1e-3, 1e-2]}},
            }
        },
        "base": TINY,
        "seeds": [1, 2],
    }
    spec.update(kw)
    return spec


def settings(home: Path, **kw: Any) -> Settings:
    return Settings(
        **{"home": home, "max_parallel_studies": 0, "mlflow_tracking_uri": "http://127.0.0.1:9", **kw}
    )


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(settings(tmp_path))) as c:
        yield c


def ledger_of(c: TestClient) -> Ledger:
    ledger: Ledger = c.app.state.engine.ledger  # type: ignore[attr-defined]
    return ledger


def finish_all(c: TestClient, study_id: str, state: str = "done") -> None:
    """Write results the way the engine does: a loss per trial, success judged from loss and threshold."""
    c.app.state.runner.cancel(study_id)  # type: ignore[attr-defined]  # this server runs nothing
    ledger = ledger_of(c)
    for t in ledger.trials(study_id):
        lr, seed = t.params["lr"], t.params["seed"]
        diverged = lr == 1e-2 and t.model == "orth"
        loss = 0.05 * seed if t.model == "chain" else 0.1 + lr * seed
        result = TrialResult(
            status="failed" if diverged else "done",
            reason="training loss diverged (nan) at step 10" if diverged else None,
            final_val_loss=None if diverged else loss,
            baseline_loss=1 / 6,
            steps=20,
            seconds=0.1 * t.id,
            history=[
                Evaluation(10, 1.0, loss * 2, loss * 2, None, 0.0),
                Evaluation(20, 2.0, loss, loss, None, 0.0),
            ],
        )
        ledger.start_trial(study_id, t.config_hash)
        ledger.finish_trial(t.id, result)
    ledger.update_study(study_id, state=state)


# ----- studies ---------------------------------------------------------------------------------------
def test_a_study_another_process_runs_has_an_eta_from_its_plan_and_its_pace(client: TestClient) -> None:
    """`memsweep status` in one terminal of a study `memsweep run` trains in another said "ETA –": only a
    runner knew. A reader of the ledger alone now says it at the pace the study's trials have finished
    since its run's plan was kept, or by that plan's estimate before any has."""
    from datetime import UTC, datetime, timedelta

    from service.application.reads import NoRuns, StudyReads

    study_id = client.post("/studies", json=grid()).json()["id"]
    client.app.state.runner.cancel(study_id)  # type: ignore[attr-defined]  # this server runs nothing
    ledger = ledger_of(client)
    rows = ledger.trials(study_id)
    assert len(rows) == 8
    reads = StudyReads(ledger, client.app.state.engine.settings, NoRuns(None))  # type: ignore[attr-defined]
    planned_at = (datetime.now(UTC) - timedelta(seconds=100)).isoformat()
    plan = {
        "planned_at": planned_at,
        "unfinished_ids": [t.id for t in rows],
        "planned": {"estimate": {"wall_seconds": 400.0}},
    }
    ledger.update_study(study_id, state="running", plan=plan)
    by_plan = reads.get(study_id).eta_seconds
    assert by_plan is not None and 290 < by_plan <= 300  # its estimate, 100 s of it gone
    for t in rows[:2]:
        ledger.start_trial(study_id, t.config_hash)
        ledger.finish_trial(t.id, TrialResult(final_val_loss=0.1, baseline_loss=1 / 6, steps=20))
    by_pace = reads.get(study_id).eta_seconds
    assert by_pace is not None and 300 <= by_pace < 310  # 6 left at 2 in 100 s
    ledger.update_study(study_id, plan={**plan, "planned_at": None})
    assert reads.get(study_id).eta_seconds is None  # no plan kept: not known
    ledger.update_study(study_id, state="done")
    assert reads.get(study_id).eta_seconds is None


def test_health_and_ready_without_a_runner(client: TestClient) -> None:
    assert client.get("/health").json()["status"] == "ok"
    ready = client.get("/ready")
    assert ready.status_code == 200 and ready.json()["checks"]["database"] == {"ok": True, "detail": "sqlite"}


def test_a_preset_with_overrides_is_queued_and_listed(client: TestClient) -> None:
    spec = {"preset": "orhan2020-copy500", "models": ["chain"], "dims": {"lr": [1e-4]}, "seeds": [1, 2]}
    r = client.post("/studies", json=spec)
    assert r.status_code == 201, r.text
    study = r.json()
    assert study["state"] == "pending" and study["queued"] is True
    assert study["counts"]["total"] == study["expected_trials"] == 7 * 2  # 7 α values × 1 lr × 2 seeds
    assert study["name"] == "orhan2020-copy500" and study["eta_seconds"] is None
    assert study["created_at"].endswith("Z")
    listed = client.get("/studies").json()
    assert listed["total"] == 1 and listed["items"][0]["id"] == study["id"]
    assert client.get("/studies", params={"state": "done"}).json()["total"] == 0
    assert client.get(f"/studies/{study['id']}").json()["counts"] == study["counts"]


SUMMARY_FIELDS = {
    "id", "name", "state", "error", "queued", "waiting", "active", "counts", "expected_trials", "created_at", "updated_at",
}  # fmt: skip


def test_the_study_list_pages_summaries_in_two_queries(client: TestClient) -> None:
    """Issue 35 item 7: `GET /studies` answered every study's full record (spec, plan: 140 KB for 25
    studies) and read each study's trials twice (96 ms, 200 calls at once a median 8.3 s). It answers a
    page of summaries, in the same few queries whatever the page's size; `GET /studies/{id}` keeps the rest."""
    from sqlalchemy import event

    ledger = ledger_of(client)
    ids = [client.post("/studies", json=grid(name=f"s{i}")).json()["id"] for i in range(3)]
    finish_all(client, ids[0])
    page = client.get("/studies", params={"limit": 2}).json()
    assert (page["total"], page["offset"], page["limit"]) == (3, 0, 2)
    assert [s["id"] for s in page["items"]] == ids[:0:-1]  # newest first
    assert all(set(s) == SUMMARY_FIELDS for s in page["items"])  # no spec, plan, links or ETA
    for s in client.get("/studies").json()["items"]:
        full = client.get(f"/studies/{s['id']}").json()
        assert {k: full[k] for k in SUMMARY_FIELDS} == s
    assert client.get("/studies", params={"limit": 2, "offset": 2}).json()["items"][0]["id"] == ids[0]
    past = client.get("/studies", params={"offset": 3}).json()
    assert past["total"] == 3 and past["items"] == []
    done = client.get("/studies", params={"state": "done"}).json()
    assert done["total"] == 1 and [s["id"] for s in done["items"]] == [ids[0]]
    assert done["items"][0]["counts"]["succeeded"] == 2 and done["items"][0]["counts"]["finished"] == 8

    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(ledger.database, "before_cursor_execute", count)
    try:
        client.get("/studies")
        three = len(statements)
        for i in range(3, 9):
            finish_all(client, client.post("/studies", json=grid(name=f"s{i}")).json()["id"])
        statements.clear()
        assert client.get("/studies").json()["total"] == 9
    finally:
        event.remove(ledger.database, "before_cursor_execute", count)
    assert len(statements) == three <= 2, statements  # not one or two more per study


def test_the_same_page_asked_at_once_is_read_once_and_never_stale(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 calls at once took a median 8.3 s: each read the same page. Calls that arrive while a page is
    being read share the next reading, which starts after they all arrived: none misses a study
    created before it asked."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    studies = client.app.state.studies  # type: ignore[attr-defined]
    for i in range(2):
        client.post("/studies", json=grid(name=f"s{i}"))
    real, reads, lock = studies.ledger.page_studies, [], threading.Lock()
    reading = threading.Event()

    def slow(*args: Any, **kwargs: Any) -> Any:
        found = real(*args, **kwargs)  # the snapshot, then a slow rest
        with lock:
            reads.append(found[0])
        reading.set()
        time.sleep(0.3)
        return found

    monkeypatch.setattr(studies.ledger, "page_studies", slow)
    calls = 40
    barrier = threading.Barrier(calls)

    def one(_: int) -> int:
        barrier.wait()
        return int(studies.list_studies(None, 0, 50).total)

    with ThreadPoolExecutor(calls) as pool:
        totals = list(pool.map(one, range(calls)))
    assert totals == [2] * calls
    assert len(reads) <= 4, reads  # one reading, then one for all that came during it (a slow start: more)

    reads.clear()
    reading.clear()
    with ThreadPoolExecutor(1) as pool:
        earlier = pool.submit(studies.list_studies, None, 0, 50)
        assert reading.wait(10)  # its snapshot is taken: a study created now is not in it
        client.post("/studies", json=grid(name="new"))
        assert studies.list_studies(None, 0, 50).total == 3  # … but in the answer of a call made after
        assert earlier.result().total == 2


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/studies/nope"),
        ("GET", "/studies/nope/trials"),
        ("GET", "/studies/nope/best"),
        ("GET", "/studies/nope/success"),
        ("POST", "/studies/nope/cancel"),
        ("POST", "/studies/nope/resume"),
        ("GET", "/presets/nope"),
    ],
)
def test_unknown_ids_are_404_with_where_to_look(client: TestClient, method: str, path: str) -> None:
    r = client.request(method, path)
    assert r.status_code == 404
    assert "'nope'" in r.json()["detail"] and (
        "GET /studies" in r.json()["detail"] or "presets:" in r.json()["detail"]
    )
    r = client.post("/studies/nope/extend", json={"seeds": [1, 2, 3]})
    assert r.status_code == 404


def test_trials_filter_sort_and_paginate(client: TestClient) -> None:
    study = client.post("/studies", json=grid()).json()
    finish_all(client, study["id"])
    base = f"/studies/{study['id']}/trials"
    page = client.get(base, params={"limit": 3}).json()
    assert page["total"] == 8 and len(page["items"]) == 3 and page["items"][0]["history"] is None
    rest = client.get(base, params={"limit": 3, "offset": 6}).json()["items"]
    assert len(rest) == 2
    failed = client.get(base, params={"status": "failed"}).json()
    assert failed["total"] == 2 and all(t["model"] == "orth" and t["reason"] for t in failed["items"])
    both = client.get(base, params=[("status", "failed"), ("status", "done")]).json()
    assert both["total"] == 8
    wins = client.get(base, params={"success": "true"}).json()["items"]
    assert [t["params"]["seed"] for t in wins] == [1, 1] and all(t["model"] == "chain" for t in wins)
    assert client.get(base, params={"success": "false"}).json()["total"] == 6
    by_loss = client.get(base, params={"sort": "final_val_loss", "order": "desc"}).json()["items"]
    losses = [t["final_val_loss"] for t in by_loss]
    assert losses[-2:] == [None, None]  # empty values last
    assert losses[:6] == sorted(losses[:6], reverse=True)
    with_history = client.get(base, params={"limit": 1, "history": "true"}).json()["items"][0]
    assert [e["step"] for e in with_history["history"]] == [10, 20]
    assert with_history["runs"] == 1 and with_history["config"]["task"] == "addition"


def test_a_running_trial_answers_where_it_has_got_to(
    client: TestClient, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its evaluations so far, as the engine writes them while it trains: the latest in every answer
    (`last_evaluation`), all of them with ?history=true, and a column of the CLI's table."""
    from service.cli.console import print_trials

    study = client.post("/studies", json=grid()).json()
    client.app.state.runner.cancel(study["id"])  # type: ignore[attr-defined]  # this server runs nothing
    ledger = ledger_of(client)
    row = ledger.trials(study["id"])[0]
    ledger.start_trial(study["id"], row.config_hash)
    evaluations = [Evaluation(10, 1.0, 0.4, 0.3, None, 0.5), Evaluation(20, 2.0, 0.2, 0.125, None, 1.0)]
    ledger.record_evaluations(study["id"], {row.id: evaluations})
    base = f"/studies/{study['id']}/trials"
    page = client.get(base, params={"status": "running"}).json()
    (running,) = page["items"]
    assert running["last_evaluation"]["step"] == 20 and running["last_evaluation"]["val_loss"] == 0.125
    assert running["history"] is None and running["final_val_loss"] is None
    full = client.get(base, params={"status": "running", "history": "true"}).json()["items"][0]
    assert [e["step"] for e in full["history"]] == [10, 20]
    pending = client.get(base, params={"status": "pending", "limit": 1}).json()["items"][0]
    assert pending["last_evaluation"] is None
    monkeypatch.setenv("COLUMNS", "200")
    capsys.readouterr()
    print_trials(client.get(base).json())
    table = capsys.readouterr().out
    assert "latest (step: val loss)" in table and "20: 0.125" in table


def test_a_pending_trial_names_the_study_that_trains_it_now(
    client: TestClient, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A study waiting for a trial another running study trains (the same config) showed it only as
    pending, 0 runs, for as long as the other took: its trials now name that study (`trained_by`)."""
    from service.cli.console import print_trials
    from service.study.claim import this_process

    ledger = ledger_of(client)
    a, b = (client.post("/studies", json=grid()).json() for _ in range(2))
    for study in (a, b):
        client.app.state.runner.cancel(study["id"])  # type: ignore[attr-defined]  # this server runs nothing
        ledger.update_study(study["id"], state="running", owner=this_process(), owner_beat=time.time())
    shared, *_ = ledger.trials(a["id"])
    ledger.start_trial(a["id"], shared.config_hash)  # A trains it now
    base = f"/studies/{b['id']}/trials"
    named = {t["config_hash"]: t["trained_by"] for t in client.get(base).json()["items"]}
    assert named.pop(shared.config_hash) == a["id"] and set(named.values()) == {None}
    monkeypatch.setenv("COLUMNS", "200")
    capsys.readouterr()
    print_trials(client.get(base).json())
    assert f"study {a['id']} trains it now" in capsys.readouterr().out
    # A's own trial, and B's once B is no longer running, name no one
    assert {t["trained_by"] for t in client.get(f"/studies/{a['id']}/trials").json()["items"]} == {None}
    ledger.update_study(b["id"], state="cancelled", owner=None)
    assert {t["trained_by"] for t in client.get(base).json()["items"]} == {None}


def test_a_table_written_to_a_pipe_cuts_no_value(
    client: TestClient, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Piped (`memsweep trials ID | grep`), rich's 80 columns cut the params (`lr=0.00…`) and a failed
    trial's reason: a table written to no terminal is PIPE_WIDTH wide."""
    from service.cli.console import print_trials

    monkeypatch.delenv("COLUMNS", raising=False)
    study = client.post("/studies", json=grid()).json()
    finish_all(client, study["id"])
    capsys.readouterr()
    print_trials(client.get(f"/studies/{study['id']}/trials").json())
    table = capsys.readouterr().out
    for t in ledger_of(client).trials(study["id"]):
        assert " ".join(f"{k}={v}" for k, v in t.params.items()) in table, table
    assert "…" not in table and "training loss diverged (nan) at step 10" in table


def test_trials_filter_by_model_and_by_the_points_values(client: TestClient) -> None:
    study = client.post("/studies", json=grid()).json()
    finish_all(client, study["id"])
    base = f"/studies/{study['id']}/trials"
    orth = client.get(base, params={"model": "orth"}).json()
    assert orth["total"] == 4 and {t["model"] for t in orth["items"]} == {"orth"}
    one_lr = client.get(base, params=[("model", "orth"), ("param", "lr=0.001")]).json()
    assert one_lr["total"] == 2 and all(t["params"]["lr"] == 1e-3 for t in one_lr["items"])
    seed = client.get(base, params=[("param", "lr=0.01"), ("param", "seed=2"), ("success", "false")]).json()
    assert seed["total"] == 2 and {(t["model"], t["params"]["seed"]) for t in seed["items"]} == {
        ("chain", 2),
        ("orth", 2),
    }
    assert client.get(base, params={"param": "lr"}).status_code == 422  # FIELD=VALUE
    # values compare as numbers where they are numbers (as text, lr=1e-3 found nothing)
    for same in ("1e-3", "0.0010", "1E-03"):
        assert client.get(base, params={"param": f"lr={same}"}).json()["total"] == 4, same
    assert client.get(base, params=[("param", "seed=2.0"), ("model", "orth")]).json()["total"] == 2
    # a model or a field the study does not have is named, with the ones it has (it filtered to nothing)
    r = client.get(base, params={"model": "orthh"})
    assert r.status_code == 422 and "'orthh'" in r.json()["detail"] and "chain, orth" in r.json()["detail"]
    r = client.get(base, params={"param": "lrr=0.001"})
    assert r.status_code == 422 and "'lrr'" in r.json()["detail"] and "lr, seed" in r.json()["detail"]
    # a value no trial holds is named, with the study's values (`lr=abc` answered 200 and nothing)
    for value in ("abc", "0.002"):
        r = client.get(base, params={"param": f"lr={value}"})
        assert (
            r.status_code == 422 and f"param=lr={value}: no trial of this study has it" in r.json()["detail"]
        )
        assert "its values: 0.001, 0.01 " in r.json()["detail"]


def test_a_value_copied_from_a_table_in_six_digits_filters_to_the_one_it_shortens(client: TestClient) -> None:
    """Tables print a sampled value in six digits (`lr=0.00160519`), and the trials filter took it for no
    value of the study: it is the one value it shortens, and two that read alike are named."""
    lrs = [0.0016051911333587634, 3.172841e-4, 3.172838e-4]
    space = {"models": {"chain": {"fixed": {"init": "chain"}, "dims": {"lr": lrs}}}}
    study = client.post("/studies", json=grid(space=space)).json()
    finish_all(client, study["id"])
    base = f"/studies/{study['id']}/trials"
    one = client.get(base, params={"param": "lr=0.00160519"}).json()
    assert one["total"] == 2 and {t["params"]["lr"] for t in one["items"]} == {lrs[0]}
    r = client.get(base, params={"param": "lr=0.000317284"})
    assert r.status_code == 422 and r.json()["detail"] == (
        "param=lr=0.000317284: 2 values of this study read so in six digits: 0.0003172838, 0.0003172841; "
        "give one of them whole"
    )
    assert client.get(base, params={"param": "lr=0.0003172841"}).json()["total"] == 2


def test_two_sampled_values_that_agree_in_six_digits_are_two_labels():
    """Tables printed floats in six digits: two sampled learning rates 3.172841e-4 and 3.172838e-4
    were one row of the by-value table, and `param=lr=0.000317284` matched both."""
    from service.core.values import repr_value, value_matches

    a, b = 3.172841e-4, 3.172838e-4
    assert repr_value(a) != repr_value(b) and float(repr_value(a)) == a
    assert value_matches(a, repr_value(a)) and not value_matches(b, repr_value(a))
    assert [repr_value(v) for v in (1.0, 1e-3, 3e-5, 1.02, 100.0)] == ["1", "0.001", "3e-05", "1.02", "100"]


def test_a_query_parameter_a_route_does_not_take_is_refused_naming_what_it_takes(client: TestClient) -> None:
    """FastAPI ignores a query parameter a route does not declare: `?state=failed` on /trials (the
    name /studies uses) or `?params=lr=0.1` answered every trial, as if they had been filtered."""
    study = client.post("/studies", json=grid()).json()
    finish_all(client, study["id"])
    base = f"/studies/{study['id']}/trials"
    for query, said in (
        ({"state": "failed"}, "query.state: not a query parameter here; did you mean 'status'? GET"),
        ({"params": "lr=0.1"}, "query.params: not a query parameter here; did you mean 'param'? GET"),
        ({"foo": "1"}, "query.foo: not a query parameter here; GET"),
    ):
        r = client.get(base, params=query)
        assert r.status_code == 422 and r.json()["message"].startswith(said), r.text
        assert "/trials takes format, history, limit, model" in r.json()["message"]
        assert r.json()["detail"][0]["loc"] == ["query", next(iter(query))]
    assert client.get(base, params={"status": "done"}).status_code == 200
    assert client.get("/studies", params={"state": "done"}).status_code == 200
    assert client.get("/health", params={"x": "1"}).status_code == 422  # "it takes none"


def test_best_and_success_are_the_ledger_summaries(client: TestClient) -> None:
    study = client.post("/studies", json=grid()).json()
    finish_all(client, study["id"])
    trials = ledger_of(client).trials(study["id"])
    best = client.get(f"/studies/{study['id']}/best", params={"k": 2}).json()
    assert best == [b.model_dump(mode="json") for b in best_configs(trials, k=2)]
    assert best[0]["model"] == "chain" and best[0]["seeds"] == [1, 2] and best[0]["succeeded"] == 1
    only_orth = client.get(f"/studies/{study['id']}/best", params={"model": "orth"}).json()
    assert [b["params"]["lr"] for b in only_orth] == [1e-3]  # lr 1e-2 failed on every seed
    typo = client.get(f"/studies/{study['id']}/best", params={"model": "orthh"})  # not an empty list
    assert typo.status_code == 422 and "no such model in this study; valid: chain, orth" in typo.text
    table = client.get(f"/studies/{study['id']}/success").json()
    expected = success_table(trials)
    assert table["by_model"]["chain"]["succeeded"] == 2 and table["by_model"]["orth"]["failed"] == 2
    for model, cell in expected.by_model.items():
        assert table["by_model"][model]["ci95"] == pytest.approx(list(cell.ci95))
    assert table["by_value"]["orth"]["lr"]["0.01"]["failed"] == 2
    assert set(table["by_value"]["chain"]) == {"lr"}  # seeds are pooled, not a hyperparameter


def test_success_is_judged_by_the_study_and_recounted_under_any_criterion_or_budget(
    client: TestClient,
) -> None:
    study = client.post("/studies", json=grid()).json()
    # chain, either lr: 0.05 and 0.10 by seed; orth lr 1e-3: 0.101, 0.102; every history 2× then 1× that
    finish_all(client, study["id"])
    sid, trials = study["id"], ledger_of(client).trials(study["id"])
    own = client.get(f"/studies/{sid}/success").json()
    assert own["criterion"] == {
        "name": "0.5 × baseline",
        "fraction": 0.5,
        "threshold": None,
        "baseline": "task",
    }
    assert own["at_step"] is None and own["total"]["succeeded"] == 2
    loose = client.get(f"/studies/{sid}/success", params={"fraction": 0.7}).json()  # threshold 0.1167
    assert loose["total"]["succeeded"] == 6 == success_table(trials, Criterion(fraction=0.7)).total.succeeded
    assert loose["criterion"]["name"] == "0.7 × baseline"
    early = client.get(f"/studies/{sid}/success", params={"at_step": 10}).json()  # losses were doubled then
    assert early["at_step"] == 10 and early["total"]["succeeded"] == 0
    assert (
        client.get(f"/studies/{sid}/success", params={"at_step": 10, "fraction": 1.0}).json()["total"][
            "succeeded"
        ]
        == 2
    )  # chain seed 1 at 0.10 < 1/6
    by_loss = client.get(f"/studies/{sid}/success", params={"threshold": 0.5}).json()
    assert (
        by_loss["total"]["succeeded"] == 6 and by_loss["criterion"]["name"] == "loss < 0.5"
    )  # every done trial
    for bad in ({"fraction": 5}, {"fraction": 0}, {"fraction": "nan"}, {"threshold": "inf"}, {"at_step": 0}):
        assert client.get(f"/studies/{sid}/success", params=bad).status_code == 422, bad
    budget = client.get(f"/studies/{sid}/success/budget").json()
    assert budget["steps"] == [10, 20]
    assert [r["succeeded"] for r in budget["by_model"]["chain"]] == [0, 2]
    page = client.get(f"/studies/{sid}/trials").json()
    assert page["criterion"]["fraction"] == 0.5
    assert sum(bool(t["success"]) for t in page["items"]) == 2
    assert all(t["success_threshold"] == pytest.approx(1 / 12) for t in page["items"])


def test_the_criterion_is_the_studys_and_no_part_of_a_trial(client: TestClient) -> None:
    default = client.post("/studies", json=grid()).json()
    strict = client.post("/studies", json=grid(success_fraction=0.25)).json()
    via_base = client.post("/studies", json=grid(base={**TINY, "success_fraction": 0.25})).json()
    assert via_base["spec"]["success_fraction"] == 0.25 and "success_fraction" not in via_base["spec"]["base"]
    hashes = [
        sorted(t.config_hash for t in ledger_of(client).trials(s["id"])) for s in (default, strict, via_base)
    ]
    assert hashes[0] == hashes[1] == hashes[2]  # studies that differ only in the criterion share their runs
    twice = client.post("/studies", json=grid(success_fraction=0.5, base={**TINY, "success_fraction": 0.25}))
    assert twice.status_code == 422 and "given twice" in twice.text
    both = client.post("/studies", json=grid(success_fraction=0.5, success_threshold=0.1))
    assert both.status_code == 422 and "not both" in both.text


def test_idempotency_key_gives_the_same_study_back(client: TestClient) -> None:
    first = client.post("/studies", json=grid(), headers={"Idempotency-Key": "k-1"})
    again = client.post("/studies", json=grid(), headers={"Idempotency-Key": "k-1"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    other = client.post("/studies", json=grid(seeds=[3]), headers={"Idempotency-Key": "k-1"})
    assert other.status_code == 422 and "different study spec" in other.json()["detail"]
    assert client.post("/studies", json=grid()).json()["id"] != first.json()["id"]  # no key: a new study
    refused = client.post("/studies", json=grid(base={"seq_lenn": 3}), headers={"Idempotency-Key": "k-2"})
    assert refused.status_code == 422
    fixed = client.post("/studies", json=grid(), headers={"Idempotency-Key": "k-2"})
    assert fixed.status_code == 201  # a refused request does not hold on to its key
    assert client.get("/studies").json()["total"] == 3


def test_a_key_whose_creator_died_before_its_study_was_made_is_taken_over_by_a_retry(
    client: TestClient,
) -> None:
    """A server killed while it made a study (minutes, for a big grid or a plugin's check) left its
    key claimed with no study: every retry was answered 409 "still being processed" for ever."""
    import subprocess
    import sys
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import update

    from service.application.study_service import KEY_LEASE_SECONDS, spec_digest
    from service.core import processes
    from service.store.models import IdempotencyKey

    ledger = ledger_of(client)
    digest = spec_digest(StudySpec.model_validate(grid()))
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = processes.started(child.pid)
    child.wait()
    dead = f"{socket.gethostname()}/{child.pid}/{started}"
    assert ledger.claim_key("k-dead", digest, dead)[0]
    retry = client.post("/studies", json=grid(), headers={"Idempotency-Key": "k-dead"})
    assert retry.status_code == 201, retry.text
    again = client.post("/studies", json=grid(), headers={"Idempotency-Key": "k-dead"})
    assert again.status_code == 200 and again.json()["id"] == retry.json()["id"]
    # on another host: its creator counts as alive for the lease, then as gone
    assert ledger.claim_key("k-far", digest, "elsewhere/12/34")[0]
    busy = client.post("/studies", json=grid(), headers={"Idempotency-Key": "k-far"})
    assert busy.status_code == 409 and "still being processed" in busy.json()["detail"]
    long_ago = datetime.now(UTC) - timedelta(seconds=KEY_LEASE_SECONDS + 60)
    with ledger.session() as s:
        s.execute(update(IdempotencyKey).where(IdempotencyKey.key == "k-far").values(created_at=long_ago))
    assert client.post("/studies", json=grid(), headers={"Idempotency-Key": "k-far"}).status_code == 201
    assert client.get("/studies").json()["total"] == 2


def test_a_request_whose_answer_failed_after_its_study_was_made_gives_that_study_on_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The study was made and queued, then the answer failed (here the study's read back; a database
    that timed out): the key was released and the client's retry made and ran a second copy of the
    grid. The key is now bound in the study's own transaction."""
    from service.application.study_service import StudyService

    real, failures = StudyService._get, [1]

    def get_once_failing(self: StudyService, study_id: str) -> Any:
        if failures:
            failures.pop()
            raise ConnectionError("the ledger timed out (simulated)")
        return real(self, study_id)

    monkeypatch.setattr(StudyService, "_get", get_once_failing)
    with TestClient(create_app(settings(tmp_path)), raise_server_exceptions=False) as client:
        lost = client.post("/studies", json=grid(), headers={"Idempotency-Key": "k-lost"})
        assert lost.status_code == 500
        retry = client.post("/studies", json=grid(), headers={"Idempotency-Key": "k-lost"})
        assert retry.status_code == 200  # the first request's study, not a new one
        assert client.get("/studies").json()["total"] == 1 == len(ledger_of(client).list_studies())


def test_bad_input_is_422_naming_the_field_the_allowed_values_and_the_fix(client: TestClient) -> None:
    r = client.post("/studies", json=grid(sampler="bayes", colour="red"))
    assert r.status_code == 422
    body = r.json()
    assert "body.sampler: Input should be 'grid', 'random', 'tpe', 'cmaes' or 'qmc'" in body["message"]
    extra = next(e for e in body["detail"] if e["loc"] == ["body", "colour"])
    assert "sampler" in extra["allowed"] and "seeds" in extra["allowed"]
    assert "send the request again" in body["message"]
    r = client.post("/studies", json={"preset": "orhan2020-copy999"})
    assert r.status_code == 422 and "orhan2020-copy500" in r.json()["detail"]  # the valid presets
    assert (
        r.json()["message"] == r.json()["detail"]
    )  # every error answer has `message`, one shape for clients
    missing = client.get("/studies/nope")
    assert missing.status_code == 404 and missing.json()["message"] == missing.json()["detail"]
    r = client.post("/studies", json=grid(base={**TINY, "seq_lenn": 20}))
    assert r.status_code == 422 and "unknown config field 'seq_lenn'" in r.json()["detail"]
    assert "seq_len" in r.json()["detail"]  # the valid fields
    r = client.post("/studies", json=grid(space={"models": {"a": {"fixd": {"init": "chain"}}}}))
    assert r.status_code == 422 and r.json()["detail"][0]["allowed"] == ["fixed", "dims"]
    r = client.post("/studies", json={"space": {"dims": {"init": ["chain", "spiral"]}}, "base": TINY})
    assert r.status_code == 422 and "spiral" in r.json()["detail"]
    r = client.post("/studies", json={"preset": "orhan2020-copy500", "sampler": "tpe"})
    assert r.status_code == 422 and "max_trials" in r.json()["message"]
    study = client.post("/studies", json=grid()).json()["id"]
    for seeds, said in (([1, "2"], "seed [1] = '2' is text"), ([True], "seed [0] = True is a bool"),
                        ([1.5], "seed [0] = 1.5 is a float")):  # fmt: skip
        r = client.post("/studies", json={"preset": "orhan2020-copy500", "seeds": seeds})  # "2" was read as 2
        assert r.status_code == 422 and f"body.seeds: {said}: a seed is a whole number" in r.json()["message"]
        r = client.post(f"/studies/{study}/extend", json={"seeds": seeds})  # the same refusal
        assert r.status_code == 422 and said in r.json()["message"], r.text
    r = client.get("/studies/x/trials", params={"status": "finished"})
    assert r.status_code == 422 and "'pending', 'running', 'done'" in r.json()["message"]
    assert client.get("/studies/x/best", params={"k": 0}).status_code == 422
    # a body that is no JSON object says what to send (it was 422 "body.1: JSON decode error", and a
    # form "Input should be a valid dictionary…"; docs/rest.md promises 400)
    for body, headers, said in (
        (b"{not json", {"content-type": "application/json"}, "the body is not JSON (at character 1)"),
        (b"preset=orhan2020-copy500", {"content-type": "application/x-www-form-urlencoded"},
         "the body came as content type application/x-www-form-urlencoded; send the JSON object with "
         "`Content-Type: application/json`"),
        (b"[1, 2]", {"content-type": "application/json"}, "the body is JSON but not an object"),
    ):  # fmt: skip
        r = client.post("/studies", content=body, headers=headers)
        assert r.status_code == 400 and r.json()["message"].startswith(said), r.text
    assert client.get("/studies").status_code == 200


def test_a_grid_over_the_limit_is_refused_with_its_size_and_the_limit(tmp_path: Path) -> None:
    with TestClient(create_app(settings(tmp_path, max_grid_size=100))) as c:
        r = c.post("/studies", json={"preset": "orhan2020-copy500"})
        assert r.status_code == 422
        assert "2112 trials" in r.json()["detail"] and "limit of 100" in r.json()["detail"]
        assert "MEMSWEEP_MAX_GRID_SIZE" in r.json()["detail"]
        assert c.get("/studies").json()["total"] == 0


def test_resources_this_machine_can_never_give_are_refused_by_the_plan_and_the_door(tmp_path: Path) -> None:
    """An embedded Ray is this machine: a dry run asking 100 CPUs (here: 2) calibrated for 180 s, then
    answered 200 with the reason buried in a shape's error; a study asking them was accepted while Ray
    was not up yet, to fail when it started. Both are refused at once, naming what the machine has."""
    import time

    from service.study.nodes import embedded_resources

    runs = settings(tmp_path, max_parallel_studies=1)  # a server that runs its studies on this machine
    have_cpus, have_gpus = embedded_resources(runs)
    cpus, gpus = int(have_cpus), int(have_gpus)
    with TestClient(create_app(runs)) as client:
        for resources in ({"cpus": cpus + 1}, {"cpus": 1, "gpus": gpus + 1}):
            for dry_run in ("true", "false"):
                began = time.monotonic()
                r = client.post("/studies", params={"dry_run": dry_run}, json=grid(resources=resources))
                assert r.status_code == 422, r.text
                assert time.monotonic() - began < 30
                detail = r.json()["detail"]
                assert detail.startswith("resources: this machine's embedded Ray cannot run a trial asking")
                assert f"(it has {cpus} CPUs" in detail and f"and {gpus} GPUs)" in detail
                assert "MEMSWEEP_RAY_ADDRESS" in detail
        assert client.get("/studies").json()["total"] == 0
    # a server that runs no studies queues them for a runner elsewhere on its ledger: not judged here
    with TestClient(create_app(settings(tmp_path / "queue"))) as queue:
        r = queue.post("/studies", json=grid(resources={"cpus": 1, "gpus": gpus + 1}))
        assert r.status_code == 201, r.text


def test_where_a_trial_runs_is_its_resources_and_a_setting_they_cannot_serve_is_refused(
    client: TestClient,
) -> None:
    """Issue 35: `device: cuda` with no GPU asked (Ray hides every GPU from such a unit: each trial
    failed), a GPU index past the unit's, and `threads` other than the unit's CPUs (silently replaced)
    are refused at the door with the fix; nothing is stored. Issue 37: so is `backend: persistent`
    (a GPU kernel) with no GPU asked."""
    base = grid()["base"]
    for extra, said in (
        (
            {"base": {**base, "device": "cuda"}},
            "base: device = 'cuda' needs a GPU, but the study's units ask none",
        ),
        (
            {"base": {**base, "device": "cuda:1"}, "resources": {"cpus": 1, "gpus": 1}},
            "sees 1 GPU(s), cuda:0",
        ),
        ({"base": {**base, "threads": 1000}}, "threads = 1000, but a trial's threads are its unit's CPUs"),
        (
            {"space": {"models": {"a": {"fixed": {"device": "cuda"}}}}},
            "model 'a': device = 'cuda' needs a GPU",
        ),
        (
            {"base": {**base, "backend": "persistent"}},
            "base: backend = 'persistent' is a GPU kernel, but the study's units ask no GPU",
        ),
        (
            {"space": {"models": {"a": {"dims": {"cell.backend": ["scan", "persistent"]}}}}},
            "model 'a' dims: backend = 'persistent' is a GPU kernel",
        ),
    ):
        r = client.post("/studies", json=grid(**extra))
        assert r.status_code == 422 and said in r.json()["detail"], (extra, r.text)
        assert "resources" in r.json()["detail"]
    assert client.get("/studies").json()["total"] == 0
    assert client.post("/studies", json=grid(base={**base, "threads": 1, "device": "cpu"})).status_code == 201


def test_a_resume_meets_the_plugin_checks_at_the_door(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume after a plugin the study uses was edited answered 200 `queued`, then the study failed
    with "… then submit again"; an extension was refused at once. The resume is too, in its words."""
    from service.application import study_service
    from service.core.errors import StudyError

    sid = client.post("/studies", json=grid()).json()["id"]
    client.post(f"/studies/{sid}/cancel")
    seen: list[str] = []

    def refused(space: Any, nodes: Any = None, again: str = "submit again") -> None:
        seen.append(again)
        raise StudyError(f"the cell plugin 'x' changed on disk …, then {again}")

    monkeypatch.setattr(study_service, "admit_plugins", refused)
    r = client.post(f"/studies/{sid}/resume")
    assert r.status_code == 422 and r.json()["detail"].endswith(f"then resume study {sid} again"), r.text
    assert seen and client.get(f"/studies/{sid}").json()["state"] == "cancelled"  # left as it was


def test_illegal_state_changes_are_409(client: TestClient) -> None:
    sid = client.post("/studies", json=grid()).json()["id"]
    r = client.post(f"/studies/{sid}/resume")
    assert r.status_code == 409 and "queued already" in r.json()["detail"]
    r = client.post(f"/studies/{sid}/extend", json={"seeds": [1, 2, 3]})
    assert r.status_code == 409 and "cancel" in r.json()["detail"]
    r = client.post(f"/studies/{sid}/cancel")
    assert r.status_code == 200 and r.json()["state"] == "cancelled" and r.json()["queued"] is False
    r = client.post(f"/studies/{sid}/cancel")
    assert (
        r.status_code == 409 and "nothing to cancel" in r.json()["detail"] and "resume" in r.json()["detail"]
    )
    r = client.post(f"/studies/{sid}/extend", json={"seeds": [1, 2, 3]})
    assert r.status_code == 200 and r.json()["added"] == 4 and r.json()["study"]["counts"]["total"] == 12
    assert r.json()["study"]["queued"] is True and r.json()["study"]["spec"]["seeds"] == [1, 2, 3]
    client.post(f"/studies/{sid}/cancel")
    r = client.post(f"/studies/{sid}/extend", json={"sampler": "tpe"})
    assert r.status_code == 422 and r.json()["detail"][0]["allowed"]  # extend takes only the growing fields
    resumed = client.post(f"/studies/{sid}/resume").json()
    assert resumed["queued"] is True and resumed["state"] == "pending"
    client.post(f"/studies/{sid}/cancel")
    finish_all(client, sid)
    r = client.post(f"/studies/{sid}/resume")
    assert r.status_code == 409 and "every trial finished" in r.json()["detail"]
    r = client.post(f"/studies/{sid}/cancel")
    assert r.status_code == 409 and "done" in r.json()["detail"]
    ledger_of(client).update_study(sid, state="running")  # as another process would leave it
    r = client.post(f"/studies/{sid}/resume")
    assert r.status_code == 409 and "another process" in r.json()["detail"]


# ----- security and limits ---------------------------------------------------------------------------
#: the routes open without the token: /health, and the API's pages with what they load
OPEN = ("/health", "/docs", "/docs/static/{name}", "/redoc", "/openapi.json")


def concrete(path: str) -> str:
    if path == "/docs/static/{name}":  # Swagger UI's script, which /docs loads (routes/docs.py)
        return "/docs/static/swagger-ui-bundle.js"
    return path.replace("{study_id}", "abc123").replace("{name}", "orhan2020-copy500")


def test_with_a_token_every_route_but_health_and_the_api_pages_answers_401_without_it(tmp_path: Path) -> None:
    app = create_app(settings(tmp_path, api_token=SecretStr(TOKEN)))
    documented = [(m.upper(), path) for path, ops in app.openapi()["paths"].items() for m in ops]
    hidden = [(m, r.path) for r in docs.router.routes if isinstance(r, APIRoute) for m in r.methods]
    routes = documented + hidden
    paths = {p for _, p in routes}
    assert {
        "/openapi.json",
        "/docs",
        "/redoc",
        "/studies",
        "/studies/{study_id}/extend",
        "/ready",
        "/plugins",
    } <= paths
    assert len(routes) == 21  # 17 documented + the 4 docs routes (/docs's own files among them)
    with TestClient(app) as c:
        for method, path in routes:
            url = concrete(path)
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
                r = c.request(method, url, headers=headers, json={})
                if path in OPEN:  # a browser opens the pages
                    assert r.status_code == 200
                else:
                    assert r.status_code == 401, (method, path, headers, r.status_code)
                    assert r.headers["www-authenticate"] == "Bearer"
            r = c.request(method, url, headers={"Authorization": f"Bearer {TOKEN}"}, json={})
            assert r.status_code != 401, (method, path)
        schema = c.get("/openapi.json").json()
        assert "HTTPBearer" in schema["components"]["securitySchemes"]  # Swagger UI's Authorize button
        assert "swagger-ui" in c.get("/docs").text


def test_request_body_limit(tmp_path: Path) -> None:
    with TestClient(create_app(settings(tmp_path, max_request_bytes=2_000))) as c:
        big = grid(base={**TINY, "n_train": 1, "pad": "x" * 3_000})
        r = c.post("/studies", json=big)
        assert r.status_code == 413 and "limit of 2,000 bytes" in r.json()["detail"]
        assert c.post("/studies", json=grid()).status_code == 201
        chunked = c.post(  # no Content-Length: counted as it streams
            "/studies",
            content=iter([b'{"name": "', b"x" * 3_000, b'"}']),
            headers={"content-type": "application/json"},
        )
        assert chunked.status_code == 413 and "limit" in chunked.json()["detail"]


def test_cors_is_off_unless_configured(tmp_path: Path) -> None:
    origin = {"Origin": "https://lab.example"}
    with TestClient(create_app(settings(tmp_path / "a"))) as c:
        assert "access-control-allow-origin" not in c.get("/health", headers=origin).headers
    with TestClient(create_app(settings(tmp_path / "b", cors_origins=["https://lab.example"]))) as c:
        assert (
            c.get("/health", headers=origin).headers["access-control-allow-origin"] == "https://lab.example"
        )
        evil = c.get("/health", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in evil.headers
        pre = c.options(
            "/studies",
            headers={
                **origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization",
            },
        )
        assert pre.status_code == 200


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MEMSWEEP_CORS_ORIGINS", "https://a.example, https://b.example")
    monkeypatch.setenv("MEMSWEEP_API_TOKEN", TOKEN)
    monkeypatch.setenv("MEMSWEEP_HOME", str(tmp_path))
    s = Settings()
    assert s.cors_origins == ["https://a.example", "https://b.example"]
    assert s.api_token is not None and s.api_token.get_secret_value() == TOKEN
    assert TOKEN not in repr(s) and TOKEN not in str(s.model_dump())


def test_the_home_is_made_absolute_whatever_the_working_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`MEMSWEEP_HOME=~/msw` from a .env made a literal `./~` folder; a relative home moved with the
    working directory (and the MLflow server, started in its folder, resolved it a second time)."""
    tmp_path = tmp_path.resolve()
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMSWEEP_HOME", "~/msw")
    assert Settings().home == tmp_path / "user" / "msw"
    monkeypatch.setenv("MEMSWEEP_HOME", "rel/home")
    home = Settings().home
    assert home == tmp_path / "rel" / "home" and home.is_absolute()
    assert Settings().resolved_database_url() == f"sqlite:///{tmp_path}/rel/home/ledger.db"


def test_openapi_documents_examples_errors_and_schema_families(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    create = schema["paths"]["/studies"]["post"]
    examples = create["requestBody"]["content"]["application/json"]["examples"]
    assert {"preset", "space", "tpe"} <= set(examples)
    assert {"200", "201", "409", "413", "422"} <= set(create["responses"])
    assert {"404", "409"} <= set(schema["paths"]["/studies/{study_id}/cancel"]["post"]["responses"])
    names = set(schema["components"]["schemas"])
    assert {
        "StudySpec",
        "StudyPublic",
        "TrialPublic",
        "TrialPage",
        "SuccessTable",
        "BestConfig",
        "PresetPublic",
    } <= names
    assert schema["components"]["schemas"]["StudyPublic"]["examples"]


def test_the_api_serves_the_one_list_of_states(client: TestClient, tmp_path: Path) -> None:
    """The OpenAPI schema's states and sort keys are the enums the ledger counts and sorts by."""
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    for enum in (StudyState, TrialStatus, TrialSort):
        assert schema[enum.__name__]["enum"] == [s.value for s in enum]
    counts = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}").counts("none")
    assert set(counts) == {s.value for s in TrialStatus} | {"total", "succeeded"}


def test_presets_list_and_detail(client: TestClient) -> None:
    presets = client.get("/presets").json()
    copy = next(p for p in presets if p["name"] == "orhan2020-copy500")
    assert copy["size"] == 2112 and copy["size_per_model"]["chain"] == 462 and "Orhan" in copy["citation"]
    detail = client.get("/presets/orhan2020-copy500").json()
    assert detail["models"]["chain"]["dims"]["scale"]["values"][0] == 0.99 and detail["seeds"] == [
        1,
        2,
        3,
        4,
        5,
        6,
    ]


def test_a_presets_detail_counts_each_models_parameters(client: TestClient) -> None:
    """A count to hold against the paper's needed each model's settings written out by hand (and
    `trainers describe` takes Orhan's defaults: SRNN's copy model came out at 2,962 for 3,746). Each
    model's distinct counts over its points, by hand here: nn.RNN's 128·2 + 128² + 2·128 and the readout's
    129; the uRNN's 8·128, its `itoh` 256·2 and a readout from 256; SGORNN's paper's 1,411; Emami's
    students over their hidden sizes n = 2…14 (an RNN's n² + 2n + n and a 2-output readout); PTB's
    vocabulary comes from its files: none."""
    addition = client.get("/presets/srnn2020-addition").json()["models"]
    assert addition["rnn"]["param_counts"] == [128 * 2 + 128**2 + 2 * 128 + 129]
    assert addition["urnn"]["param_counts"] == [8 * 128 + 256 * 2 + 257]
    assert client.get("/presets/srnn2020-copy").json()["models"]["srnn"]["param_counts"] == [3746]
    assert client.get("/presets/sgornn2022-addition").json()["models"]["sgornn"]["param_counts"] == [1411]
    emami = client.get("/presets/emami2019-gaussian20db").json()["models"]["rnn"]["param_counts"]
    assert emami == [n * n + 2 * n + n + 2 * n + 2 for n in range(2, 15, 2)]
    assert client.get("/presets/orhan2020-lstm-ptbchar").json()["models"]["lstm-plain"]["param_counts"] == []


def test_an_unknown_preset_is_answered_with_the_nearest_name_and_where_the_list_is(
    client: TestClient, capsys: pytest.CaptureFixture[str]
) -> None:
    """GET /presets/orhan2020-copy50 answered 404 with every name and no `did you mean`, where a study's
    unknown preset (POST /studies) had one; the client's preset call and `memsweep presets NAME` alike."""
    from service.cli.commands import main
    from service.cli.console import EXIT_REFUSED

    for name in ("orhan2020-copy50", "Orhan2020-Copy500"):  # misspelt; and the case (compared without it)
        r = client.get(f"/presets/{name}")
        said = r.json()["message"]
        assert r.status_code == 404 and said.startswith(
            f"unknown preset {name!r}; did you mean 'orhan2020-copy500'? GET /presets lists them with their "
            "sizes and citations; presets: "
        ), said
        assert "nru2019-copy100" in said  # the names still, for a reader of curl
    assert "did you mean" not in client.get("/presets/nope").json()["message"]
    # a name with a slash reached no route (a bare "Not Found"); a trailing slash still redirects, to the
    # list and to the preset, as before the route took slashes
    for path, to in (("/presets/", "/presets"), ("/presets/srnn2020-copy/", "/presets/srnn2020-copy")):
        moved = client.get(path, follow_redirects=False)
        assert moved.status_code == 307 and moved.headers["location"].endswith(to), (path, moved.headers)
        assert client.get(path).status_code == 200
    r = client.get("/presets/orhan2020/copy500")
    assert r.status_code == 404 and r.json()["message"].startswith(
        "unknown preset 'orhan2020/copy500'; did you"
    )
    with pytest.raises(
        MemsweepAPIError, match=r"→ 404: unknown preset 'orhan2020-copy50'; did you mean"
    ) as err:
        MemsweepClient("http://testserver", http=client).preset("orhan2020-copy50")
    assert err.value.status == 404
    with pytest.raises(ValueError, match=r"name '' is empty: give a preset's name \(`client.presets\(\)`"):
        MemsweepClient("http://testserver", http=client).preset("")  # GET /presets/: the list, as one preset
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        main(["presets", "orhan2020-copy50"])
    assert refused.value.code == EXIT_REFUSED
    assert str(refused.value).startswith(
        "error: unknown preset 'orhan2020-copy50'; did you mean 'orhan2020-copy500'? `memsweep presets` lists "
        "them with their sizes and citations; presets: "
    ), str(refused.value)


# ----- the Python client -------------------------------------------------------------------------------
def test_client_submits_pages_and_builds_dataframes(tmp_path: Path) -> None:
    with TestClient(create_app(settings(tmp_path, api_token=SecretStr(TOKEN)))) as c:
        client = MemsweepClient("http://testserver", token=TOKEN, http=c)
        study = client.submit(grid(), idempotency_key="same")
        assert client.submit(grid(), idempotency_key="same")["id"] == study["id"]
        finish_all(c, study["id"])
        assert client.wait(study["id"], poll=0.01, progress=False)["state"] == "done"
        trials = client.iter_trials(study["id"], page=3)
        assert [t["id"] for t in trials] == list(range(1, 9))  # three pages
        assert len(client.trials(study["id"], status=["done"], limit=5)) == 5
        assert client.best(study["id"], k=1)[0]["model"] == "chain"
        frame = client.success_table(study["id"])
        assert list(frame.index) == ["chain", "orth"]
        assert frame.loc["chain", "succeeded"] == 2 and frame.loc["orth", "failed"] == 2
        assert (
            0 < frame.loc["chain", "ci95_low"] < frame.loc["chain", "rate"] < frame.loc["chain", "ci95_high"]
        )
        by_value = client.success_table(study["id"], by="value")
        assert by_value.loc[("orth", "lr", "0.01"), "failed"] == 2
        with pytest.raises(ValueError, match=r"by='lr': give 'model'.*or 'value'.*frame\.xs\(FIELD"):
            client.success_table(study["id"], by="lr")  # type: ignore[arg-type]  # was every field's rows
        # against a reference model: the differences REST gives (the frame dropped them)
        against = client.success_table(study["id"], reference="chain")
        rest = client.success(study["id"], reference="chain")["differences"]["orth"]
        assert against.attrs["reference"] == "chain" and against.loc["chain", "is_reference"]
        assert math.isnan(against.loc["chain", "difference"])  # itself: no difference (it read 0.0 [0, 0])
        assert not against.loc["orth", "is_reference"]
        assert against.loc["orth", "difference"] == rest["difference"] == -0.5
        assert (
            against.loc["orth", "difference_ci95_low"],
            against.loc["orth", "difference_ci95_high"],
        ) == tuple(rest["ci95"])
        with pytest.raises(MemsweepAPIError) as err:
            client.submit({"preset": "nope"})
        assert err.value.status == 422 and "presets:" in str(err.value)
        with pytest.raises(MemsweepAPIError, match="401"):
            MemsweepClient("http://testserver", token="wrong", http=c).get(study["id"])
        assert client.ready()["ready"] is True
        page = client.studies_page(limit=1)
        assert page["total"] == 1 and page["items"][0]["id"] == study["id"] and "spec" not in page["items"][0]
        assert client.studies(state="done")[0]["counts"]["finished"] == 8 and client.studies(offset=1) == []


# ----- the CLI ---------------------------------------------------------------------------------------------
def test_a_reader_that_goes_away_ends_the_cli_quietly(tmp_path: Path) -> None:
    """`memsweep status ID | head -1` ended with a BrokenPipeError traceback; it ends as a command a
    closed pipe stopped does, 128 + SIGPIPE, saying nothing."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "MEMSWEEP_HOME": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli.commands", "studies"], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the command writes
    err = proc.stderr.read().decode()
    assert proc.wait(120) == 141 and "Traceback" not in err and "Exception ignored" not in err, err


def test_serve_on_a_taken_port_says_so_before_starting_anything(tmp_path: Path) -> None:
    """A second `memsweep serve` on a taken port migrated a ledger and started Ray, then uvicorn said
    "address already in use" (it binds after the app's start-up): the port is bound first."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        env = {**os.environ, "MEMSWEEP_HOME": str(tmp_path / "home")}
        done = subprocess.run(
            [sys.executable, "-m", "service.cli.commands", "serve", "--port", str(port)], env=env,
            capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2],
        )  # fmt: skip
    assert done.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in done.stderr, done.stderr
    assert "--port" in done.stderr and not (tmp_path / "home").exists()  # no ledger, no Ray, no MLflow


def test_cli_help_lists_the_service_commands(capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli.commands import main

    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert all(cmd in out for cmd in ("serve", "submit", "status", "studies", "best", "success", "run"))
    with pytest.raises(SystemExit, match="--url"):
        main(["submit", "orhan2020-copy500"])  # submitting needs a server


def test_the_preset_list_names_each_preset_whole_on_a_narrow_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On 80 columns the names were cut (`orhan2020-addition7…`): what `memsweep run` takes could not be
    copied from the list."""
    from search_spaces import list_presets
    from service.cli.commands import main

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert all(f" {name} " in out for name in list_presets()), out


def test_memsweep_presets_name_shows_what_the_preset_runs(
    client: TestClient, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`memsweep presets nru2019-copy100` was refused ("unrecognized arguments"): what each model fixes
    (its hidden size), the shared settings and the seeds were GET /presets/{name}'s alone."""
    from service.cli.commands import main

    assert main(["presets", "nru2019-copy100", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == client.get("/presets/nru2019-copy100").json()
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["presets", "nru2019-copy100"]) == 0
    out = capsys.readouterr().out
    for said in (
        "cell=nru, hidden=80, memory_size=64",
        "cell=gru, hidden=82",
        "optimizer=keras_adam",
        "seeds: 1",
    ):
        assert said in out, out
    assert "trials: 7 (points × seeds)" in out, out
    assert main(["presets", "orhan2020-copy500"]) == 0
    out = capsys.readouterr().out
    assert "lr: 0.0008, 0.0005" in out and "seeds: 1, 2, 3, 4, 5, 6" in out and "trials: 2112" in out, out


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["--set", "success_fraction=2"],
            "error: success_fraction: Input should be less than or equal to 1\n",
        ),
        (["--concurrency", "0"], "error: concurrency: Input should be greater than or equal to 1\n"),
        (["--cpus", "0"], "error: resources.cpus: Input should be greater than 0\n"),  # was taken as 1
        (
            ["--seeds", "1,x"],
            "error: --seeds 1,x: give whole numbers separated by commas, e.g. --seeds 1,2,3\n",
        ),
    ],
)
def test_the_cli_names_a_bad_flag_in_memsweeps_words(
    args: list[str],
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Not pydantic's dump (its error count, input_value and URL), nor Python's int() message."""
    from service.cli.commands import main

    monkeypatch.setenv("MEMSWEEP_HOME", str(tmp_path))
    assert main(["plan", "orhan2020-copy500", *args]) == 2
    assert capsys.readouterr().err == said


def test_the_cli_names_a_bad_spec_file_and_its_unknown_fields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from service.cli.commands import main

    monkeypatch.setenv("MEMSWEEP_HOME", str(tmp_path))
    typo, broken = tmp_path / "typo.yaml", tmp_path / "broken.yaml"
    typo.write_text("preset: orhan2020-copy500\nsede: 3\n")
    broken.write_text("preset: [a\n")
    assert main(["plan", str(typo)]) == 2
    assert capsys.readouterr().err.startswith(  # the file named, as the Python client names it
        f"error: {typo}: sede: unknown field; did you mean 'seeds'? valid fields here: name, preset, space"
    )
    assert main(["plan", str(tmp_path / "missing.yaml")]) == 2  # was a traceback
    assert (
        capsys.readouterr().err
        == f"error: {tmp_path / 'missing.yaml'}: cannot read the spec file (No such file or directory)\n"
    )
    assert main(["plan", str(broken)]) == 2  # was a traceback
    assert capsys.readouterr().err.startswith(f"error: {broken}: not YAML or JSON: expected ',' or ']'")


def test_a_spec_files_numbers_are_numbers_and_a_number_given_as_text_is_refused(
    client: TestClient, tmp_path: Path
):
    """The README's own spec file wrote `lr: [1e-3, 3e-4]`: PyYAML (YAML 1.1) read `1e-3` as text, so
    the study's points held "1e-3" (the trainer read it as a number): a table row "1e-3" beside 0.001
    after an extension from the CLI, `?param=lr=0.001` found nothing, the best config said '1e-3'.
    Text for a number in a body (JSON's "1e-3", a quoted YAML value) is refused at the door."""
    from service.core.spec import load_spec

    spec_file = tmp_path / "my-study.yaml"
    spec_file.write_text(
        "preset: orhan2020-copy500\nmodels: [chain]\ndims: {lr: [1e-3, 3e-4, 2E-2, 1.5e-3], scale: [1.0]}\n"
        "base: {seq_len: 50, steps: 2000, eval_every: 500, early_stop_loss: 1e-12}\nseeds: [1]\n"
        "name: run 1e3x\n"
    )
    spec = load_spec(spec_file)
    assert spec.dims == {"lr": [1e-3, 3e-4, 2e-2, 1.5e-3], "scale": [1.0]} and spec.name == "run 1e3x"
    assert spec.base["early_stop_loss"] == 1e-12
    body = {"space": {"dims": {"lr": [3e-4, "1e-3"], "init": ["chain"]}}, "base": {**TINY, "seq_len": 20}}
    for dry_run in ("true", "false"):
        r = client.post("/studies", params={"dry_run": dry_run}, json=body)
        assert r.status_code == 422 and r.json()["message"].startswith(
            "dims.lr[1] = '1e-3' is text, and lr is a number: write it as one (1e-3, not quoted)"
        ), r.text
    body["space"]["dims"]["lr"] = [3e-4, 1e-3]  # and text where the setting is text is text: init
    assert client.post("/studies", params={"dry_run": "true"}, json=body).status_code == 200


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({"dims": {"lr": [float("nan")]}}, "dims.lr[0]"),
        ({"dims": {"lr": [float("inf")]}}, "dims.lr[0]"),
        ({"base": {"lr": float("-inf")}}, "base.lr"),
        ({"success_fraction": float("inf")}, "success_fraction"),
        ({"success_fraction": 5}, "success_fraction"),
        ({"success_fraction": 0}, "success_fraction"),
        ({"base": {"seq_len": 20}}, "too short for layout 'total'"),
        ({"base": {"seq_len": 0}}, "too short for layout 'total'"),
        ({"base": {"seq_len": -1}}, "too short for layout 'total'"),
        ({"models": []}, "models: [] selects no model"),
        ({"base": {"lr": 1e-3}}, "base.lr"),  # the preset varies lr: a base value would be ignored
        ({"base": {"init": "orthogonal"}}, "base.init"),  # … and model chain fixes init = chain
        ({"name": "a\x00b"}, "name"),
        ({"name": "x" * 10_000}, "name"),
    ],
)
def test_a_201_means_the_study_can_run_every_probe_is_a_422_naming_its_field(
    client: TestClient, change: dict[str, Any], names: str
) -> None:
    """Issue 16's probes: each used to be accepted (201) and fail later, or be stored as null."""
    spec = {
        "preset": "orhan2020-copy500",
        "models": ["chain"],
        "dims": {"lr": [1e-3], "scale": [1.0]},
        **change,
    }
    r = client.post("/studies", content=json.dumps(spec), headers={"content-type": "application/json"})
    assert r.status_code == 422, (change, r.status_code, r.text[:300])
    assert names in r.text, r.text[:500]
    assert client.get("/studies").json()["total"] == 0  # nothing stored


def test_extending_with_nothing_new_changes_nothing(client: TestClient) -> None:
    study = client.post("/studies", json=grid()).json()
    finish_all(client, study["id"])
    before = client.get(f"/studies/{study['id']}").json()
    r = client.post(f"/studies/{study['id']}/extend", json={"seeds": [1, 2]}).json()
    after = client.get(f"/studies/{study['id']}").json()
    assert r["added"] == 0 and after["state"] == before["state"] == "done" and after["spec"] == before["spec"]


@pytest.mark.parametrize(
    ("change", "said", "fix"),
    [
        ({"seeds": [2, 3]}, "seed: 1", "(e.g. seeds: [1, 2, 3], or --seeds 1,2,3)"),
        ({"seeds": [3]}, "seed: 1, 2", "(e.g. seeds: [1, 2, 3], or --seeds 1,2,3)"),
        ({"dims": {"lr": [0.1]}}, "lr: 0.001, 0.01", "(e.g. dims: {lr: [old values…, new]}, or --dim lr="),
    ],
)
def test_an_extension_that_leaves_out_the_studys_points_is_refused(
    client: TestClient, change: dict[str, Any], said: str, fix: str
) -> None:
    """`extend {"seeds": [2, 3]}` made the spec say seeds 2 and 3 while the study still held seed 1's
    trials: its tables and resume kept them, its spec no longer listed them. The fix names the seeds to
    give when they are what is left out (it showed only `dims: {lr: …}`)."""
    study = client.post("/studies", json=grid(space={"dims": {"lr": [1e-3, 1e-2]}})).json()
    finish_all(client, study["id"])
    before = client.get(f"/studies/{study['id']}").json()
    r = client.post(f"/studies/{study['id']}/extend", json=change)
    assert r.status_code == 422, r.text
    assert f"leaves out values its trials hold ({said})" in r.json()["message"], r.text
    assert fix in r.json()["message"] and ("seeds:" in fix) == ("seeds:" in r.json()["message"]), r.text
    after = client.get(f"/studies/{study['id']}").json()
    assert after["spec"] == before["spec"] and after["counts"] == before["counts"]


def test_an_extension_may_write_a_number_the_study_holds_in_its_other_spelling(client: TestClient) -> None:
    """`scale: [1.0, 1.02]` extended with `[1, 1.02, 1.05]` (JavaScript's JSON writes 1.0 as 1) was
    refused as leaving out scale 1: one config hash, one value."""
    study = client.post("/studies", json=grid(space={"dims": {"lr": [1e-3], "scale": [1.0, 1.02]}})).json()
    finish_all(client, study["id"])
    r = client.post(f"/studies/{study['id']}/extend", json={"dims": {"scale": [1, 1.02, 1.05]}})
    assert r.status_code == 200 and r.json()["added"] == 2, r.text


def test_an_extension_that_adds_a_dimension_its_trials_do_not_set_names_it():
    """A spec given a new dimension (through the engine: REST and the CLI replace only a space's own
    dimensions) left the trials that ran at its default out of the spec."""
    from types import SimpleNamespace

    from service.study.engine import dropped_values

    def trial(h: str, **params: Any) -> Any:
        return SimpleNamespace(config_hash=h, model="m", params=params)

    held = [trial("a", lr=1e-3, seed=1)]
    assert dropped_values(held, [trial("b", lr=1e-3, hidden=16, seed=1)]) == {"hidden": ["(its default)"]}
    # the default written as a value: the same config, so the same hash: kept
    assert (
        dropped_values(held, [trial("a", lr=1e-3, hidden=64, seed=1), trial("b", lr=1e-3, hidden=16, seed=1)])
        == {}
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"dims": {"lr": [NaN]}}', "dims.lr[0] is not a finite number; give a finite value"),
        ('{"dims": {"lr": [1e999]}}', "dims.lr[0] is not a finite number; give a finite value"),  # → inf
        ('{"dims": {"lr": {"loguniform": [NaN, 0.1]}}}', "dims.lr.loguniform[0] is not a finite number"),
        ('{"base": {"steps": NaN}}', "base.steps is not a finite number; give a finite value"),
        ('{"seeds": [1, NaN]}', "body.seeds.1: not a finite number; give a finite value"),
    ],
)
def test_an_extension_with_nan_is_refused_in_memsweeps_words(
    client: TestClient, body: str, message: str
) -> None:
    """Issue 35 item 7: `/extend` answered pydantic's own text (`1 validation error for StudySpec …
    https://errors.pydantic.dev/…`); it answers as `POST /studies` does: the field, and the fix."""
    study = client.post("/studies", json=grid()).json()
    finish_all(client, study["id"])
    before = client.get(f"/studies/{study['id']}").json()
    r = client.post(
        f"/studies/{study['id']}/extend", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 422, r.text
    for pydantics in ("errors.pydantic.dev", "validation error for", "Value error", "input_value"):
        assert pydantics not in r.text, r.text
    answer = r.json()
    assert answer["message"].startswith(message) and answer["message"].endswith(
        "(schemas and examples: GET /docs)."
    )
    assert answer["detail"][0]["loc"][0] == "body"
    after = client.get(f"/studies/{study['id']}").json()
    assert after["spec"] == before["spec"] and after["counts"] == before["counts"]  # left as it was
    # the same value refused at creation reads the same
    created = client.post(
        "/studies",
        content='{"preset": "orhan2020-copy500", ' + body[1:],
        headers={"content-type": "application/json"},
    )
    assert created.status_code == 422 and created.json()["message"] == answer["message"]


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        ({"preset": "orhan2020-copy500", "dims": {"lr": []}}, "dims.lr"),
        ({"preset": "orhan2020-copy500", "dims": {"lr": {"values": []}}}, "dims.lr"),
        ({"space": {"dims": {"lr": []}}, "base": TINY}, "space.dims.lr"),
        (
            {"space": {"models": {"a": {"fixed": {"init": "chain"}, "dims": {"lr": []}}}}, "base": TINY},
            "space.models.a.dims.lr",
        ),
    ],
)
def test_an_empty_dimension_is_refused_by_its_path(
    client: TestClient, spec: dict[str, Any], path: str
) -> None:
    """Issue 35 item 7: `dims.lr: []` said `a Values dimension needs at least one value`, naming no field."""
    r = client.post("/studies", json=spec)
    assert r.status_code == 422, r.text
    assert r.json()["message"].startswith(f"{path} has no values: give one or more, e.g. lr: ["), r.text
    assert f"or leave {path} out" in r.json()["message"]


@pytest.mark.parametrize("values", [[], [""]])
def test_an_extension_to_an_empty_dimension_is_refused_by_its_path(
    client: TestClient, values: list[Any]
) -> None:
    """`[""]` is what `--dim lr=` sends: it was taken, and each new trial refused `lr = ''` (not a number)."""
    study = client.post("/studies", json=grid()).json()
    finish_all(client, study["id"])
    r = client.post(f"/studies/{study['id']}/extend", json={"dims": {"lr": values}})
    assert r.status_code == 422, r.text
    assert r.json()["message"].startswith("dims.lr has no values: give one or more, e.g. lr: ["), r.text
    assert "(on the command line: --dim lr=" in r.json()["message"]


def test_a_sampled_study_keeps_the_arms_it_draws_apart() -> None:
    """`space: {dims: {init: [chain, orthogonal], …}}` drawn by a sampler: each trial's model is its
    initialiser (it used to be "default" for all, so the success table could not separate them)."""
    from search_spaces import Model, SearchSpace, Uniform, Values
    from service.study.search import point_trials

    model = Model(
        "default", {}, {"lr": Uniform(1e-4, 1e-2, log=True), "init": Values(("chain", "orthogonal"))}
    )
    space = SearchSpace("s", (model,), seeds=(1,), base={"task": "addition", "seq_len": 20})
    arms = {
        point_trials(space, model, {"lr": 1e-3, "init": init}, {})[0].model
        for init in ("chain", "orthogonal")
    }
    assert arms == {"chain", "orthogonal"}


def test_a_sync_while_mlflow_is_down_is_a_quick_503_that_keeps_everything(client: TestClient) -> None:
    """MLflow's client retries a refused connection for minutes; a sync probes first and answers 503
    at once, saying the ledger keeps every result (this client's MLflow, port 9, never answers)."""
    import time

    study = client.post("/studies", json=grid()).json()
    finish_all(client, study["id"])
    before = [t.final_val_loss for t in ledger_of(client).trials(study["id"])]
    started = time.monotonic()
    r = client.post(f"/studies/{study['id']}/sync")
    assert r.status_code == 503, r.text
    assert time.monotonic() - started < 15
    assert "does not answer" in r.text and "ledger keeps every result" in r.text
    assert [t.final_val_loss for t in ledger_of(client).trials(study["id"])] == before
    assert client.get(f"/studies/{study['id']}").json()["state"] == "done"


def test_a_sync_of_a_study_another_process_runs_is_a_409_that_touches_nothing(client: TestClient) -> None:
    """A study queued here but claimed by another process (a `memsweep run` on the same ledger) is that
    process's to write: a sync refuses, naming it, instead of rebuilding (and deleting) the child runs
    that process is writing, or marking its parent run ended."""
    import time

    study = client.post("/studies", json=grid()).json()
    finish_all(client, study["id"])
    other = f"elsewhere/7/{time.time()}"
    assert Ledger(ledger_of(client).url).claim_study(study["id"], other, lambda owner, beat: False) is None
    r = client.post(f"/studies/{study['id']}/sync")
    assert r.status_code == 409, r.text
    assert f"being run by another process ({other}" in r.text and "nothing was synced here" in r.text
    row = ledger_of(client).study(study["id"])
    assert row.owner == other and row.mlflow_run_id is None and row.error is None


def test_a_huge_grid_is_refused_from_its_size_before_any_trial_is_made(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """10¹² trials (10⁴ learning rates × 10⁴ scales × 10⁴ seeds): the size is a product of the
    dimensions' lengths, so the refusal makes no trial (it once made millions, for minutes)."""
    from service.study import search

    made: list[int] = []
    materialize = search.materialize

    def counted(settings: Any) -> Any:
        made.append(1)
        assert len(made) < 1000, "trials are being made for a grid its size refuses"
        return materialize(settings)

    monkeypatch.setattr(search, "materialize", counted)
    n = 10_000
    values = [round(1e-4 * (1 + i / n), 12) for i in range(n)]
    spec = {"preset": "orhan2020-copy500", "models": ["chain"], "dims": {"lr": values, "scale": values}}
    r = client.post("/studies", json={**spec, "seeds": list(range(n))})
    assert r.status_code == 422, r.text
    assert f"{n**3} trials" in r.json()["detail"] and "limit of 50000" in r.json()["detail"]
    assert made == []
    r = client.post("/studies", json={"preset": "orhan2020-copy500", "seeds": list(range(100_000))})
    assert r.status_code == 422 and made == []
    # a space is checked with one seed per value (a sampled study's ranges, too), not every seed
    space = StudySpec.model_validate(
        {**spec, "dims": {"lr": values[:3], "scale": [1.0]}, "seeds": list(range(1000))}
    )
    search.check_space(space.search_space())
    assert 0 < len(made) <= 3  # the first point, and each other value of each dimension


def test_an_unknown_baseline_is_refused_naming_the_ones_there_are(client: TestClient) -> None:
    copy = client.post(
        "/studies",
        json={
            "preset": "orhan2020-copy500",
            "models": ["chain"],
            "seeds": [1],
            "dims": {"lr": [1e-3], "scale": [1.0]},
        },
    ).json()
    addition = client.post("/studies", json=grid()).json()
    r = client.get(f"/studies/{copy['id']}/success", params={"baseline": "arjovksy"})
    assert (
        r.status_code == 422 and "'arjovksy'" in r.json()["detail"] and "task, arjovsky" in r.json()["detail"]
    )
    assert client.get(f"/studies/{copy['id']}/success", params={"baseline": "arjovsky"}).status_code == 200
    assert client.get(f"/studies/{copy['id']}/success", params={"baseline": "task"}).status_code == 200
    r = client.get(f"/studies/{addition['id']}/success", params={"baseline": "arjovsky"})
    assert r.status_code == 422 and "valid: task " in r.json()["detail"]  # addition reports none
    r = client.get(
        "/compare", params={"studies": f"{copy['id']},{addition['id']}", "by": "model", "baseline": "bogus"}
    )
    assert r.status_code == 422 and copy["id"] in r.json()["detail"] and "'bogus'" in r.json()["detail"]
    extra = {"extra_criteria": [{"fraction": 0.5, "baseline": "arjovksy"}]}
    r = client.post("/studies", json={"preset": "orhan2020-copy500", **extra})
    assert r.status_code == 422 and "extra_criteria[0].baseline" in r.json()["message"]


@pytest.mark.parametrize(
    ("change", "named"),
    [({"dims": {"lr": [1e308]}}, "lr = 1e+308 cannot be represented in float32"),
     ({"base": {**TINY, "clip_norm": -1e39}}, "clip_norm"),
     ({"seeds": [1, 10**30]}, "64-bit integer"), ({"base": {**TINY, "seq_len": 2**64}}, "seq_len")],
)  # fmt: skip
def test_a_value_the_trials_dtype_cannot_hold_is_refused_at_the_door(
    client: TestClient, change: dict[str, Any], named: str
) -> None:
    """lr = 1e308 was accepted, and every trial then failed ("value cannot be converted to type float
    without overflow"): a trial computes in float32 and stores integers in 64 bits."""
    r = client.post("/studies", json=grid(**change))
    assert r.status_code == 422 and named in r.json().get("message", r.json()["detail"]), r.text
    assert client.get("/studies").json()["total"] == 0


def test_a_body_nested_too_deeply_is_named_so(client: TestClient) -> None:
    deep = b"[" * 10_000 + b"]" * 10_000  # JSON, but deeper than the parser goes
    r = client.post("/studies", content=deep, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "nested too deeply" in r.json()["detail"], r.text


def test_a_request_validates_its_studys_spec_once(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stored spec is JSON; each request that reads a study validates it once, however many
    answers it derives from it (criterion, baselines, sampler, expected trials)."""
    study = client.post("/studies", json=grid(extra_criteria=[{"fraction": 0.25}])).json()
    finish_all(client, study["id"])
    validated: list[int] = []
    validate = StudySpec.model_validate

    def counted(data: Any, **kw: Any) -> StudySpec:
        validated.append(1)
        return validate(data, **kw)

    monkeypatch.setattr(StudySpec, "model_validate", counted)
    for path in ("", "/success", "/best", "/trials", "/success?fraction=0.3", "/trials?param=lr=0.001"):
        validated.clear()
        r = client.get(f"/studies/{study['id']}{path}")
        assert r.status_code == 200, r.text
        assert len(validated) == 1, (path, len(validated))


def test_an_unwritable_ledger_is_a_quick_503_and_ready_says_so(tmp_path: Path) -> None:
    """Issue 35: with the ledger's SQLite refusing writes (a read-only file, directory or mount; here
    its connections in query_only mode, the same refusal: "attempt to write a readonly database"),
    POST /studies held its client 116 s, then answered 500 and reset the connection, while /ready said
    `database: ok`. Now the request waits the request's patience, answers 503 naming the refusal and
    stores nothing, /ready says the database refuses writes, and both recover with the database."""
    from sqlalchemy import event

    from service.api.limits import REQUEST_LEDGER_PATIENCE

    def read_only(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.execute("PRAGMA query_only = ON")

    with TestClient(create_app(settings(tmp_path))) as c:
        database = c.app.state.engine.ledger.database  # type: ignore[attr-defined]
        assert c.post("/studies", json=grid(name="before")).status_code == 201
        event.listen(database, "connect", read_only)
        database.dispose()  # every connection from here on is read-only
        try:
            ready = c.get("/ready").json()["checks"]["database"]
            assert (
                not ready["ok"] and "refuses writes (attempt to write a readonly database)" in ready["detail"]
            )
            started = time.monotonic()
            r = c.post("/studies", json=grid(name="refused"))
            waited = time.monotonic() - started
            assert r.status_code == 503, r.text
            assert (
                "did not take the request (attempt to write a readonly database); nothing was stored"
                in r.text
            )
            assert waited < REQUEST_LEDGER_PATIENCE + 10, waited
            assert [s["name"] for s in c.get("/studies").json()["items"]] == ["before"]  # reads still answer
        finally:
            event.remove(database, "connect", read_only)
            database.dispose()
        assert c.get("/ready").json()["checks"]["database"]["ok"]
        assert c.post("/studies", json=grid(name="after")).status_code == 201


def test_a_value_given_twice_is_refused_by_the_plan_and_the_door_and_they_agree_once_it_is_not(
    client: TestClient,
) -> None:
    """`lr: [1e-3, 0.001]`: the plan said 6 trials, the study held 3, its spec `lr: [0.001, 0.001]`."""
    twice = {"space": {"dims": {"lr": [1e-3, 0.001]}}, "base": TINY, "seeds": [1, 2, 3]}
    for dry_run in ("true", "false"):
        r = client.post("/studies", params={"dry_run": dry_run}, json=twice)
        assert r.status_code == 422 and "space.dims.lr[0] = 0.001 and space.dims.lr[1] = 0.001" in r.text
    assert client.get("/studies").json()["total"] == 0
    once = {**twice, "space": {"dims": {"lr": [1e-3, 3e-4]}}}
    planned = client.post("/studies", params={"dry_run": "true"}, json=once).json()["trials"]
    made = client.post("/studies", json=once).json()
    assert planned == made["counts"]["total"] == 6
    # a study stored before the rule, holding a value twice, still reads and extends (its space.dims are
    # no field an extension may change): its stored values are taken once
    client.app.state.runner.cancel(made["id"])  # type: ignore[attr-defined]  # this server runs nothing
    ledger = ledger_of(client)
    ledger.update_study(made["id"], spec={**made["spec"], "space": {"dims": {"lr": [1e-3, 0.001, 3e-4]}}})
    assert client.get(f"/studies/{made['id']}").status_code == 200
    r = client.post(f"/studies/{made['id']}/extend", json={"seeds": [1, 2, 3, 4]})
    assert r.status_code == 200, r.text
    assert client.get(f"/studies/{made['id']}").json()["spec"]["space"]["dims"]["lr"] == [1e-3, 3e-4]


def test_the_client_submits_a_spec_file_read_as_the_cli_reads_it(tmp_path: Path) -> None:
    """`client.submit("mine.yaml")` was sent as `{"preset": "mine.yaml"}`."""
    mine = tmp_path / "mine.yaml"
    mine.write_text("space:\n  dims:\n    lr: [1e-3, 3e-4]\nbase: {task: addition, seq_len: 20, steps: 2}\n")
    with TestClient(create_app(settings(tmp_path / "home"))) as c:
        client = MemsweepClient("http://testserver", http=c)
        for spec in (mine, str(mine)):
            study = client.submit(spec, seeds=[1, 2])
            assert study["spec"]["space"]["dims"]["lr"] == [1e-3, 3e-4] and study["counts"]["total"] == 4
        assert client.plan(mine)["trials"] == 2
        typo = tmp_path / "typo.yml"
        typo.write_text("preset: orhan2020-copy500\nsede: 3\n")
        with pytest.raises(
            ValueError, match=f"^{typo}: sede: unknown field; did you mean 'seeds'\\? valid fields here: name"
        ):
            client.submit(typo)
        with pytest.raises(ValueError, match=f"^{tmp_path / 'gone.json'}: cannot read the spec file"):
            client.submit(str(tmp_path / "gone.json"))
        assert c.get("/studies").json()["total"] == 2


# `GET /studies?state=` listed the study states written out a second time (a Literal beside `StudyState`),
# so a state added to `StudyState` would have been refused as a filter. It is made of `StudyState`'s values
# and `queued`: a state added there is a filter value at once, and the OpenAPI schema stays an enum of
# those values.


#: in a fresh interpreter: `service.core.states` with one more study state, then the filter's values
WITH_A_NEW_STATE = """
import json, sys, types
from pathlib import Path
import service.core
source = Path(service.core.__file__).with_name("states.py").read_text()
source = source.replace('    CANCELLED = "cancelled"\\n', '    CANCELLED = "cancelled"\\n    PAUSED = "paused"\\n', 1)
states = types.ModuleType("service.core.states")
states.__file__ = "states.py"
sys.modules["service.core.states"] = states
exec(compile(source, "states.py", "exec"), states.__dict__)
from typing import get_args
from service.api.routes.studies import ListedState
print(json.dumps(list(get_args(ListedState))))
"""


def test_the_listings_filter_is_every_study_state_and_queued(tmp_path: Path) -> None:
    with TestClient(create_app(settings(tmp_path))) as c:
        (param,) = [p for p in c.get("/openapi.json").json()["paths"]["/studies"]["get"]["parameters"]
                    if p["name"] == "state"]  # fmt: skip
        enum, none = param["schema"]["anyOf"]
        assert enum == {"type": "string", "enum": [*StudyState, QUEUED]} and none == {"type": "null"}
        for state in enum["enum"]:
            assert c.get("/studies", params={"state": state}).status_code == 200, state
        assert c.get("/studies", params={"state": "paused"}).status_code == 422


def test_a_new_study_state_is_a_filter_value_at_once() -> None:
    out = subprocess.run(
        [sys.executable, "-c", WITH_A_NEW_STATE], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert json.loads(out.splitlines()[-1]) == [*StudyState, "paused", QUEUED]


# A misspelt name gets the nearest valid one (`did you mean 'x'?`, search_spaces.did_you_mean's rule)
# wherever it is given: a spec's fields, a preset, a model, a cell or a task, in the CLI and over REST
# alike (one validation); and a plugin that could not join is named beside the valid cells, not left out.


def test_a_misspelt_spec_field_preset_model_cell_or_task_is_answered_with_the_nearest_name(
    tmp_path: Path,
) -> None:
    with TestClient(create_app(settings(tmp_path))) as c:
        seed = c.post("/studies?dry_run=true", json={**grid(), "seed": [1]})
        cell = c.post(
            "/studies?dry_run=true", json={"preset": "orhan2020-copy500", "models": ["chain", "lstn"]}
        )
    assert (
        seed.status_code == 422
        and "seed: unknown field; did you mean 'seeds'? valid fields here: " in seed.text
    )
    assert cell.status_code == 422 and "unknown cell 'lstn'; did you mean 'lstm'? valid cells: " in cell.text
    with pytest.raises(ValueError, match=r"unknown cell 'chian'; did you mean 'chain'\? valid cells: "):
        StudySpec.model_validate({"preset": "orhan2020-copy500", "models": ["chian"]}).search_space()
    with pytest.raises(ValueError, match=r"has no model 'ortho'; did you mean 'orth'\? models: chain, orth"):
        StudySpec.model_validate({**grid(), "models": ["ortho"]}).search_space()
    with pytest.raises(UnknownPresetError, match=r"did you mean 'orhan2020-copy500'\? presets: "):
        get_preset("orhan2020-copy50")
    with pytest.raises(UnknownNameError, match=r"unknown task 'coppy'; did you mean 'copy'\? valid tasks: "):
        trainers.resolve(trainers.TrainConfig(task="coppy"))


def test_a_cell_name_near_a_refused_plugins_says_it_was_refused(tmp_path: Path) -> None:
    """The plugin's entry point is `cornn` but its class says `coRNN`: refused, and left out of "valid
    cells", so `models: [conrn]` (a typo of the right name) pointed nowhere."""
    dist = write_dist(
        tmp_path / "cornn",
        "memsweep-cornn",
        "0.1.0",
        {"memsweep.cells": {"cornn": "memsweep_cornn:ToyCell"}},
        {"memsweep_cornn/__init__.py": toy_cell("coRNN")},
    )
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"preset": "orhan2020-copy500", "models": ["chain", "conrn"]}))
    done = memsweep("plan", str(spec), paths=(dist,), environ={"MEMSWEEP_HOME": str(tmp_path / "home")})
    assert done.returncode != 0
    assert "unknown cell 'conrn'; did you mean 'cornn'? valid cells: " in done.stderr, done.stderr
    assert "(refused: cornn — see `memsweep plugins`)" in done.stderr
