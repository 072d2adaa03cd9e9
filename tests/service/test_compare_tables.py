"""Comparing studies and tables as CSV, through the REST app in-process (a real SQLite ledger; the
server runs no study, results are written to the ledger as the engine writes them — see
test_api_units.py), the Python client's DataFrame and the CLI on the local ledger."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from service.api import create_app
from service.cli import commands
from service.cli.console import failure_reasons, print_failures
from service.client import MemsweepClient
from service.core.settings import get_settings
from service.reports.summary import fisher_exact_p, newcombe_interval, wilson_interval
from service.reports.tables import read_csv
from service.store.ledger import Ledger
from tests.service.conftest import TINY
from tests.service.test_api_units import finish_all, grid, ledger_of, settings
from trainers import TRAINER_VERSION
from trainers.result import TrialResult


@pytest.fixture
def client(tmp_path: Path) -> Any:
    with TestClient(create_app(settings(tmp_path))) as c:
        yield c


def two_studies(c: TestClient) -> tuple[str, str]:
    """A: chain/orth × lr {1e-3, 1e-2} × seeds {1, 2}, finished. B: lr {1e-3, 3e-3}, created after A
    finished, so its lr = 1e-3 trials are A's runs (same config hash, reused); judged at 0.5 × baseline
    (A: threshold 0.12)."""
    a = c.post("/studies", json=grid(name="A", success_threshold=0.12)).json()["id"]
    finish_all(c, a)
    b_spec = grid(name="B")
    for m in b_spec["space"]["models"].values():
        m["dims"]["lr"] = [1e-3, 3e-3]
    b = c.post("/studies", json=b_spec).json()["id"]
    finish_all(c, b)
    return a, b


def test_newcombe_interval_matches_newcombe_1998() -> None:
    """Newcombe (Stat. Med. 17:873, 1998), Table II, example (a): 56/70 − 48/80, method 10: 0.0524 to 0.3339."""
    lo, hi = newcombe_interval(56, 70, 48, 80)
    assert (round(lo, 4), round(hi, 4)) == (0.0524, 0.3339)
    assert newcombe_interval(0, 10, 10, 10)[0] >= -1.0 and newcombe_interval(5, 0, 1, 2) == (-1.0, 1.0)


def test_a_run_both_studies_hold_is_one_run(client: TestClient) -> None:
    a, b = two_studies(client)
    ledger = ledger_of(client)
    shared = {t.config_hash for t in ledger.trials(a)} & {t.config_hash for t in ledger.trials(b)}
    assert len(shared) == 4  # 2 models × lr 1e-3 × 2 seeds, reused by B
    r = client.get("/compare", params={"studies": f"{a},{b}", "by": "model"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["reference"] == a and body["trainer_version"] == TRAINER_VERSION
    assert [s["criterion"]["name"] for s in body["studies"]] != [body["studies"][0]["criterion"]["name"]] * 2
    rows = {(r["scope"], r["group"]["model"], r["study_id"]): r for r in body["rows"]}
    for model in ("chain", "orth"):
        ra, rb = rows[("group", model, a)], rows[("group", model, b)]
        assert ra["trials"] == rb["trials"] == 4
        assert rb["shared"] == 2 and ra["shared"] is None
        assert tuple(ra["ci95"]) == pytest.approx(wilson_interval(ra["succeeded"], ra["trials"]))
        assert rb["difference"] == pytest.approx(rb["rate"] - ra["rate"])
        assert tuple(rb["difference_ci95"]) == pytest.approx(
            newcombe_interval(rb["succeeded"], 4, ra["succeeded"], 4)
        )
        pooled = rows[("group", model, None)]
        assert pooled["trials"] == 6 and pooled["shared"] == 2  # 4 + 4 trials, 2 of them the same runs
    total = rows[("total", None, None)]
    assert total["trials"] == 12 and total["shared"] == 4
    # the same counts as each study's own success table (its own criterion)
    for study in (a, b):
        own = client.get(f"/studies/{study}/success").json()["by_model"]
        for model in ("chain", "orth"):
            assert rows[("group", model, study)]["succeeded"] == own[model]["succeeded"]


def test_a_run_asha_stopped_and_a_whole_run_of_its_config_are_two_runs(client: TestClient) -> None:
    """One study's run of a config that asha stopped at step 10 and another study's run of it trained
    to step 20 were counted as one shared run, and the pooled row kept the stopped one."""
    from trainers import Evaluation

    a = client.post("/studies", json=grid(name="A")).json()["id"]
    b = client.post("/studies", json=grid(name="B")).json()["id"]  # made before A finished: its own runs
    finish_all(client, b)
    ledger = ledger_of(client)
    stopped = next(t for t in ledger.trials(a) if t.model == "chain" and t.params["seed"] == 1)
    finish_all(client, a)
    whole = next(t for t in ledger.trials(b) if t.config_hash == stopped.config_hash)
    assert whole.status == "done" and whole.final_val_loss == 0.05 and whole.reused_from is None
    with ledger.session() as s:  # A's run of it: stopped by asha at its first rung, not yet below threshold
        row = s.get(type(stopped), stopped.id)
        row.status, row.steps, row.final_val_loss = "pruned", 10, 0.5
        row.history = [Evaluation(10, 1.0, 0.5, 0.5, None, 0.0).to_dict()]
    body = client.get("/compare", params={"studies": f"{a},{b}", "by": "model"}).json()
    rows = {(r["scope"], r["group"]["model"], r["study_id"]): r for r in body["rows"]}
    assert rows[("group", "chain", b)]["shared"] == 3  # the other 3 chain runs are the same runs; not this
    pooled = rows[("group", "chain", None)]
    assert pooled["trials"] == 4 and pooled["shared"] == 3
    assert pooled["succeeded"] == rows[("group", "chain", b)]["succeeded"]  # the whole run, not the stopped


def test_a_matrix_by_any_field_and_refusals(client: TestClient) -> None:
    a, b = two_studies(client)
    body = client.get("/compare", params={"studies": [a, b], "by": "model,lr"}).json()
    groups = {(r["group"]["model"], r["group"]["lr"]) for r in body["rows"] if r["scope"] == "group"}
    assert groups == {(m, lr) for m in ("chain", "orth") for lr in ("0.001", "0.003", "0.01")}
    only_a = [r for r in body["rows"] if r["group"] == {"model": "chain", "lr": "0.01"}]
    assert [(r["study_id"], r["trials"]) for r in only_a] == [(a, 2), (b, 0), (None, 2)]
    by_config = client.get("/compare", params={"studies": f"{a},{b}", "by": "cell,seq_len,hidden"}).json()
    assert {tuple(r["group"].values()) for r in by_config["rows"] if r["scope"] == "group"} == {
        ("rnn", "20", "16")
    }
    r = client.get("/compare", params={"studies": f"{a},{b}", "by": "model,colour"})
    assert r.status_code == 422 and "by: unknown field 'colour'" in r.json()["detail"]
    assert "seq_len" in r.json()["detail"]  # the fields it can be grouped by
    r = client.get("/compare", params={"studies": a})
    assert r.status_code == 422 and "at least two" in r.json()["detail"]
    r = client.get("/compare", params={"studies": f"{a},nosuchstudy"})
    assert r.status_code == 404 and "nosuchstudy" in r.json()["detail"]
    r = client.get("/compare", params={"studies": f"{a},{b}", "fraction": 2})
    assert r.status_code == 422 and "fraction" in r.text
    # a criterion named in the query judges both studies
    same = client.get("/compare", params={"studies": f"{a},{b}", "fraction": 0.25}).json()
    assert {s["criterion"]["name"] for s in same["studies"]} == {"0.25 × baseline"}


def test_tables_as_csv_name_their_criterion_and_trainer_version(client: TestClient) -> None:
    a, b = two_studies(client)
    for how in ({"params": {"format": "csv"}}, {"headers": {"Accept": "text/csv"}}):
        r = client.get(f"/studies/{a}/success", **how)  # type: ignore[arg-type]
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
        head = dict(line[2:].split(": ", 1) for line in r.text.splitlines() if line.startswith("# "))
        assert head["criterion"] == "loss < 0.12" and head["trainer_version"] == str(TRAINER_VERSION)
        frame = read_csv(io.StringIO(r.text))
        assert frame.attrs["criterion"] == "loss < 0.12"
        json_table = client.get(f"/studies/{a}/success").json()
        chain = frame[(frame.table == "by_model") & (frame.model == "chain")].iloc[0]
        assert chain.succeeded == json_table["by_model"]["chain"]["succeeded"]
        assert chain.ci95_low == pytest.approx(json_table["by_model"]["chain"]["ci95"][0])
    assert client.get(
        f"/studies/{a}/success", params={"format": "json"}, headers={"Accept": "text/csv"}
    ).json()
    trials = client.get(f"/studies/{b}/trials", params={"format": "csv", "model": "chain"})
    frame = read_csv(io.StringIO(trials.text))
    assert len(frame) == 4 and set(frame.model) == {"chain"}
    assert {"params.lr", "params.seed", "config.task_params.seq_len", "final_val_loss"} <= set(frame.columns)
    assert frame.attrs["criterion"] == "0.5 × baseline" and frame.attrs["trainer_version"] == str(
        TRAINER_VERSION
    )
    comparison = client.get("/compare", params={"studies": f"{a},{b}"}, headers={"Accept": "text/csv"})
    frame = read_csv(io.StringIO(comparison.text))
    assert a in frame.attrs["criterion"] and "loss < 0.12" in frame.attrs["criterion"]
    assert {"difference_ci95_low", "difference_ci95_high", "shared", "group.model"} <= set(frame.columns)
    assert client.get("/compare", params={"studies": f"{a},{b}", "format": "xml"}).status_code == 422


def test_the_client_returns_a_comparison_frame(client: TestClient) -> None:
    a, b = two_studies(client)
    remote = MemsweepClient("http://testserver")
    remote._http = client  # the client's HTTP calls go to the in-process app
    frame = remote.compare([a, b], by=["model"])
    assert isinstance(frame, pd.DataFrame)
    assert frame.index.names == ["scope", "model", "study_id"]
    row = frame.loc[("group", "chain", b)]
    assert row.shared == 2 and row.trials == 4
    assert frame.loc[("group", "chain", "pooled")].trials == 6
    assert frame.attrs["reference"] == a and frame.attrs["criteria"][a] == "loss < 0.12"
    text = remote.table_csv(f"/studies/{a}/success")
    assert text.startswith("# table: success")


def test_the_cli_compares_and_writes_csv_from_the_local_ledger(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    """`memsweep` on the local ledger: its entry point in a process of its own (the first call, and an
    argparse refusal), the other commands through the same `main` in this process (each fresh process
    spends seconds importing what this one holds)."""
    with TestClient(create_app(settings(tmp_path))) as c:
        a, b = two_studies(c)
    env = {"MEMSWEEP_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    monkeypatch.setenv("MEMSWEEP_HOME", str(tmp_path))
    for name in ("MEMSWEEP_API_URL", "MEMSWEEP_MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")  # what `main` sets, undone after
    monkeypatch.setattr(commands, "prepare_ray_process", lambda settings: None)  # these commands start no Ray
    get_settings.cache_clear()  # the settings read again, from this home (and again after the test)
    request.addfinalizer(get_settings.cache_clear)

    def process(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "service.cli.commands", *args], env=env, capture_output=True, text=True,
            timeout=120, cwd=Path(__file__).parents[2],
        )  # fmt: skip

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = commands.main(list(args))
        except SystemExit as exit_:  # argparse's and the commands' refusals (2), a failure's message (1)
            if isinstance(exit_.code, int):
                code = exit_.code
            else:  # what Python does with a message: print it, exit 1
                code = 1
                print(exit_.code, file=sys.stderr)
        out, err = capsys.readouterr()
        return code, out, err

    def cli(*args: str) -> str:
        code, out, err = run(*args)
        assert code == 0, err[-2000:]
        return out

    first = process("compare", a, b, "--by", "model", "--json")
    assert first.returncode == 0, first.stderr[-2000:]
    found = json.loads(first.stdout)
    assert [r["shared"] for r in found["rows"] if r["study_id"] == b] == [2, 2, 4]
    assert json.loads(cli("compare", a, b, "--by", "model", "--json")) == found  # in-process: the same
    csv_text = cli("compare", a, b, "--csv")
    assert csv_text.startswith("# table: comparison") and f"# trainer_version: {TRAINER_VERSION}" in csv_text
    success = cli("success", a, "--csv")
    assert "# criterion: loss < 0.12" in success
    monkeypatch.setenv("COLUMNS", "200")  # rich's width: the whole table
    against = cli("success", a, "--reference", "orth")
    assert "− orth" in against and "95 % Newcombe CI" in against, against
    trials = read_csv(io.StringIO(cli("trials", b, "--csv")))
    assert len(trials) == 8 and trials.attrs["table"] == "trials"
    # the route's filters from the command line: a model, a parameter's value as written (1e-3 is 0.001)
    chain = read_csv(io.StringIO(cli("trials", b, "--model", "chain", "--param", "lr=1e-3", "--csv")))
    assert len(chain) == 2 and set(chain["model"]) == {"chain"} and set(chain["params.lr"]) == {0.001}
    code, _, err = run("trials", b, "--param", "lr")
    assert code == 2 and "--param 'lr': write KEY=VALUE" in err
    # a failed trial's reason, in the table and, grouped, as `memsweep run` ends
    monkeypatch.setenv("COLUMNS", "200")  # rich's width: the reason on one line
    failed = cli("trials", a, "--status", "failed")
    assert "reason" in failed and failed.count("training loss diverged (nan) at step 10") == 2
    rows = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}").trials(a, ["failed"])
    capsys.readouterr()
    print_failures(failure_reasons(t.reason for t in rows), a)
    said = capsys.readouterr().out
    assert "failed: 2 trial(s)\n  2 × training loss diverged (nan) at step 10\n" in said
    assert f"memsweep trials {a} --status failed" in said
    # the studies and a study's status, without a server; an unknown id names the command that lists them
    listed = json.loads(cli("studies", "--json"))
    assert {s["id"] for s in listed} == {a, b} and all(s["counts"]["total"] == 8 for s in listed)
    assert all("spec" not in s for s in listed)  # summaries: `status` has the full record
    newest = cli("studies", "--limit", "1")
    assert b in newest and a not in newest and "1–1 of 2, newest first; --offset 1 shows the next" in newest
    assert [s["id"] for s in json.loads(cli("studies", "--offset", "1", "--json"))] == [a]
    assert a in cli("studies") and b in cli("studies", "--state", "done")
    assert "no study is running" in cli("studies", "--state", "running")
    bad = process("studies", "--limit", "0")
    assert bad.returncode == 2 and "--limit: 0 is out of range; give 1 to 500" in bad.stderr
    # names that name nothing are refused by name, not answered with nothing (issue 35)
    for argv, said in (
        (("trials", a, "--status", "bogus"), "invalid choice: 'bogus' (choose from"),
        (("best", a, "--k", "0"), "--k: 0 is out of range; give 1 to 1000"),
        (("best", a, "--model", "orthh"), "model='orthh': no such model in this study; valid:"),
    ):
        code, _, err = run(*argv)
        assert code != 0 and said in err, (argv, err[-1000:])
    assert f"study {a}" in cli("status", a) and json.loads(cli("status", b, "--json"))["id"] == b
    code, _, err = run("best", "nope")
    assert code == 2 and "no study 'nope'; `memsweep studies`" in err
    assert "shared" in cli("compare", a, b)  # the rich table's header
    # a copy study's counts under Arjovsky's baseline too, as `memsweep run` ends (docs/studies.md)
    with TestClient(create_app(settings(tmp_path))) as c:  # a third study, on the same ledger
        copy = c.post("/studies", json=grid(name="C", base={**TINY, "task": "copy", "seq_len": 30})).json()
        finish_all(c, copy["id"])
    copy = copy["id"]
    assert "also under 0.5 × arjovsky baseline: chain 0/4, orth 0/4" in cli("success", copy)
    assert "also under" not in cli("success", a) and "also under" not in cli(
        "success", copy, "--fraction", "0.25"
    )
    assert "criterion" in json.loads(cli("success", copy, "--baseline", "arjovsky", "--json"))


def test_a_comparison_logged_to_a_database_uri_keeps_its_artifacts_in_the_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a database as the tracking URI, `?log=true` was refused as "MLflow does not answer" (it
    probed the URI as a server), and its artifacts would have gone to `./mlruns`."""
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with TestClient(create_app(settings(tmp_path / "home", mlflow_tracking_uri=uri))) as c:
        a, b = two_studies(c)
        r = c.get("/compare", params={"studies": f"{a},{b}", "by": "model", "log": "true"})
    assert r.status_code == 200, r.text
    assert list((tmp_path / "home" / "mlflow" / "mlartifacts").rglob("comparison.csv"))
    assert not list(workdir.iterdir())


def test_a_comparison_is_logged_to_a_real_mlflow_over_rest_and_from_the_cli(
    tmp_path: Path, mlflow_uri: str
) -> None:
    """`GET /compare?log=true` and `memsweep compare --mlflow`: a run of its own in MLflow, holding each
    study's rate and interval as metrics, the table (the CSV the API serves) and the figure."""
    from mlflow.tracking import MlflowClient

    with TestClient(create_app(settings(tmp_path, mlflow_tracking_uri=mlflow_uri))) as c:
        a, b = two_studies(c)
        r = c.get("/compare", params={"studies": f"{a},{b}", "by": "model", "log": "true"})
        assert r.status_code == 200, r.text
        links = r.json()["mlflow"]
        served_csv = c.get("/compare", params={"studies": f"{a},{b}", "by": "model", "format": "csv"}).text
    mlflow = MlflowClient(mlflow_uri)
    run = mlflow.get_run(links["run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["memsweep.kind"] == "comparison"
    assert run.data.tags["memsweep.studies"] == f"{a},{b}"
    assert run.data.tags["memsweep.trainer_version"] == str(TRAINER_VERSION)
    body = r.json()
    for row in body["rows"]:  # every row's rate, under its study and group
        where = row["group"]["model"] if row["scope"] == "group" else "total"
        assert run.data.metrics[f"success_rate.{row['study_id'] or 'pooled'}.{where}"] == pytest.approx(
            row["rate"]
        )
    assert {f.path for f in mlflow.list_artifacts(run.info.run_id)} == {
        "comparison.csv",
        "comparison.json",
        "plots",
    }
    logged = Path(mlflow.download_artifacts(run.info.run_id, "comparison.csv", str(tmp_path))).read_text()
    assert read_csv(io.StringIO(logged)).equals(read_csv(io.StringIO(served_csv)))
    assert [f.path for f in mlflow.list_artifacts(run.info.run_id, "plots")] == ["plots/comparison.png"]

    env = {
        "MEMSWEEP_HOME": str(tmp_path),
        "MEMSWEEP_MLFLOW_TRACKING_URI": mlflow_uri,
        "PATH": "/usr/bin:/bin",
    }
    out = subprocess.run(
        [sys.executable, "-m", "service.cli.commands", "compare", a, b, "--by", "model", "--mlflow", "--json"],
        env=env, capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    cli_run = json.loads(out.stdout)["mlflow"]["run_id"]
    assert cli_run != links["run_id"] and f"/runs/{cli_run}" in out.stderr
    assert mlflow.get_run(cli_run).data.metrics == run.data.metrics


def test_a_comparison_says_when_the_studies_numerics_differ(client: TestClient) -> None:
    """Each study lists the numerics modes its trials computed with and the machines its numbers came
    from (their provenance); the notes say when modes differ, or when native numerics ran on two CPUs."""
    a, b = two_studies(client)  # both the default mode: nothing to note
    same = client.get("/compare", params={"studies": f"{a},{b}"}).json()
    assert [s["numerics"] for s in same["studies"]] == [["portable"], ["portable"]] and same["notes"] == []

    native = client.post("/studies", json={**grid(name="N"), "numerics": "native"}).json()["id"]
    client.app.state.runner.cancel(native)  # type: ignore[attr-defined]
    ledger = ledger_of(client)
    for i, t in enumerate(ledger.trials(native)):
        assert t.config["numerics"] == "native"
        ledger.start_trial(native, t.config_hash)
        cpu = ("CPU one", "CPU two")[i % 2]
        ledger.finish_trial(
            t.id,
            TrialResult(
                final_val_loss=0.1,
                baseline_loss=1 / 6,
                steps=20,
                provenance={"cpu": cpu, "capability": "AVX2"},
            ),
        )
    body = client.get("/compare", params={"studies": f"{a},{native}"}).json()
    assert body["studies"][1]["numerics"] == ["native"]
    assert body["studies"][1]["machines"] == ["CPU one (AVX2)", "CPU two (AVX2)"]
    assert len(body["notes"]) == 2, body["notes"]
    assert "different numerics modes" in body["notes"][0] and f"{native}: native" in body["notes"][0]
    # the printed table says them too (only `--json` showed them)
    from service.cli.console import print_comparison

    with contextlib.redirect_stdout(io.StringIO()) as printed:
        print_comparison(body)
    assert all(f"note: {note}" in " ".join(printed.getvalue().split()) for note in body["notes"])
    assert "native numerics ran on different machines" in body["notes"][1]


def test_a_model_set_against_another_in_one_study(client: TestClient) -> None:
    """`?reference=MODEL`: each model's rate minus the reference model's, with Newcombe's interval from
    the two cells' counts (the models' trials are disjoint runs); the reference itself differs by 0; a
    name that is no model is refused naming the models; the CSV carries the differences."""
    a, _ = two_studies(client)
    table = client.get(f"/studies/{a}/success", params={"reference": "orth"}).json()
    assert table["reference"] == "orth" and set(table["differences"]) == set(table["by_model"]) == {
        "chain",
        "orth",
    }
    chain, orth = table["by_model"]["chain"], table["by_model"]["orth"]
    d = table["differences"]["chain"]
    assert d["difference"] == pytest.approx(chain["rate"] - orth["rate"]) and d["difference"] != 0
    assert tuple(d["ci95"]) == pytest.approx(
        newcombe_interval(chain["succeeded"], chain["trials"], orth["succeeded"], orth["trials"])
    )
    assert d["ci95"][0] <= d["difference"] <= d["ci95"][1]
    # itself: marked the reference, no difference (it read 0 [0, 0], a measured difference of none)
    assert table["differences"]["orth"] == {"difference": None, "ci95": None, "p": None, "is_reference": True}
    assert d["is_reference"] is False
    assert d["p"] == pytest.approx(
        fisher_exact_p(chain["succeeded"], chain["finished"], orth["succeeded"], orth["finished"])
    )
    assert client.get(f"/studies/{a}/success").json()["differences"] is None
    bad = client.get(f"/studies/{a}/success", params={"reference": "chian"})
    assert bad.status_code in (400, 422) and "chian" in bad.text and "chain" in bad.text, bad.text
    assert "reference='chian': no such model" in bad.text  # the parameter it came in (it said model=)
    frame = read_csv(
        io.StringIO(client.get(f"/studies/{a}/success", params={"reference": "orth", "format": "csv"}).text)
    )
    assert frame.attrs["reference"].startswith("orth")
    row = frame[(frame.table == "by_model") & (frame.model == "chain")].iloc[0]
    assert row.difference == pytest.approx(d["difference"]) and not row.is_reference
    own = frame[(frame.table == "by_model") & (frame.model == "orth")].iloc[0]
    assert own.is_reference and pd.isna(own.difference) and pd.isna(own.difference_ci95_low)


def test_a_comparison_says_when_a_plugins_code_differs_between_its_studies():
    """Two studies of one plugin cell at two versions: their rows set one code's runs beside the other's
    under one name, and nothing said so."""
    from types import SimpleNamespace

    from service.reports.compare import plugin_notes

    def trial(identity: str | None) -> Any:
        provenance = {"cpu": "x"} | ({"plugin.cell": identity} if identity else {})
        return SimpleNamespace(provenance=provenance, config={"cell": "leaky" if identity else "rnn"})

    same = {"a": [trial("memsweep-leaky==1.0+aa"), trial(None)], "b": [trial("memsweep-leaky==1.0+aa")]}
    assert plugin_notes(same) == []
    edited = {"a": [trial("memsweep-leaky==1.0+aa")], "b": [trial("memsweep-leaky==1.0+bb")]}
    (note,) = plugin_notes(edited)
    # the cell by the name studies use (it said "the cell memsweep-leaky plugin", its distribution's)
    assert note.startswith("the cell leaky (plugin memsweep-leaky) ran different code in these studies (")
    assert "memsweep-leaky==1.0+aa: a; memsweep-leaky==1.0+bb: b" in note


def test_a_comparison_says_when_a_groups_studies_trained_it_under_different_settings(
    client: TestClient,
) -> None:
    """Orhan's copy at T = 50 beside SRNN's at T = 20 are both `model=rnn`: a comparison by model set
    their rates against each other, and their difference, without a word. The notes name the settings
    the studies hold at different values within a group (not what a study varies there, its grid's lr),
    and the way to set them apart; grouped by them too, nothing is said."""
    a, b = two_studies(client)  # one protocol, each study's own lr grid: nothing to note
    assert client.get("/compare", params={"studies": f"{a},{b}"}).json()["notes"] == []
    longer = client.post("/studies", json=grid(name="C", base={**TINY, "seq_len": 30, "hidden": 8})).json()[
        "id"
    ]
    finish_all(client, longer)
    body = client.get("/compare", params={"studies": f"{a},{longer}"}).json()
    (note,) = body["notes"]
    assert note.startswith(
        f"model=chain; model=orth: the studies trained it under different settings, hidden ({a}: 16, "
        f"{longer}: 8); task.seq_len ({a}: 20, {longer}: 30): its rows set one protocol's runs beside "
        "another's"
    ), note
    assert "(by=model,hidden,task.seq_len)" in note
    apart = client.get(
        "/compare", params={"studies": f"{a},{longer}", "by": "model,hidden,task.seq_len"}
    ).json()
    assert apart["notes"] == []
    # a dimension each study ran one value of is still what its rate is over, not its protocol
    one_lr = []
    for lr in (1e-3, 3e-3):
        spec = grid(name=f"lr{lr}")
        for m in spec["space"]["models"].values():
            m["dims"]["lr"] = [lr]
        one_lr.append(client.post("/studies", json=spec).json()["id"])
        finish_all(client, one_lr[-1])
    assert client.get("/compare", params={"studies": ",".join(one_lr)}).json()["notes"] == []


def test_the_printed_comparison_leaves_out_a_study_with_no_trial_in_a_group_and_links_mlflow_once(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Study B holds no trial of lr 0.01: its row read `0/0 – [0.000, 1.000]`; with `--mlflow` the run's
    link was printed twice."""
    a, b = two_studies(client)
    found = client.get("/compare", params={"studies": f"{a},{b}", "by": "model,lr"}).json()
    found["mlflow"] = {"run_id": "r1", "run_url": "http://mlflow/#/runs/r1"}

    class Studies:
        def __enter__(self) -> Studies:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def comparison(self, *args: Any, **kw: Any) -> dict[str, Any]:
            return found

    monkeypatch.setattr(commands, "studies_for", lambda args: Studies())
    monkeypatch.setenv("COLUMNS", "250")
    assert commands.main(["compare", a, b, "--by", "model,lr", "--mlflow"]) == 0
    out, err = capsys.readouterr()
    assert "0/0" not in out and "a study with no trial in a group has no row in it" in out
    assert (out + err).count("http://mlflow/#/runs/r1") == 1


# The success table's CSV export dropped the table's `notes`: a researcher who exported a count at a budget
# past every run's end lost the note that each run was counted at its end. The notes are a `# notes:`
# header line, beside the criterion's; pandas reads the table as before (`comment="#"`), `tables.read_csv`
# has them in `frame.attrs`.


def test_the_success_csv_carries_the_tables_notes_and_reads_cleanly(client: TestClient) -> None:
    study = client.post("/studies", json=grid(name="notes")).json()["id"]
    finish_all(client, study)  # every run trained 20 steps
    table = client.get(f"/studies/{study}/success", params={"at_step": 99_999}).json()
    (note,) = table["notes"]
    assert "counted at its end" in note
    text = client.get(f"/studies/{study}/success", params={"at_step": 99_999, "format": "csv"}).text
    assert f"# notes: {note}\n" in text
    frame = read_csv(io.StringIO(text))
    assert frame.attrs["notes"] == note
    plain = pd.read_csv(io.StringIO(text), comment="#")
    assert list(plain.columns) == list(frame.columns) and "notes" not in plain.columns
    assert len(plain) == 1 + len(table["by_model"]) + sum(
        len(values) for fields in table["by_value"].values() for values in fields.values()
    )
    assert plain[plain.table == "total"].iloc[0].succeeded == table["total"]["succeeded"]
    without = client.get(f"/studies/{study}/success", params={"format": "csv"}).text
    assert "# notes:" not in without  # a table without notes has no such line


def test_a_misspelt_field_to_group_by_is_said_with_the_nearest_in_the_syntax_it_was_asked_in(
    tmp_path: Path,
    client: TestClient,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    """`memsweep compare A B --by lr_drop_epoch` had no "did you mean", and said `?by=cell,seq_len`,
    the REST query's syntax, to the command line."""
    a, b = two_studies(client)
    r = client.get("/compare", params={"studies": f"{a},{b}", "by": "model,lr_drop_epoch"})
    detail = r.json()["detail"]
    assert r.status_code == 422 and detail.startswith(
        "by: unknown field 'lr_drop_epoch'; did you mean 'lr_drop_epochs'? these studies' trials can be "
        "grouped by "
    )
    assert detail.endswith("(comma-separated, e.g. ?by=cell,seq_len)")
    monkeypatch.setenv("MEMSWEEP_HOME", str(tmp_path))  # the CLI on this ledger, as the client's
    monkeypatch.delenv("MEMSWEEP_API_URL", raising=False)
    monkeypatch.setattr(commands, "prepare_ray_process", lambda settings: None)  # compare starts no Ray
    get_settings.cache_clear()
    request.addfinalizer(get_settings.cache_clear)
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        commands.main(["compare", a, b, "--by", "model,lr_drop_epoch"])
    err = capsys.readouterr().err
    assert refused.value.code == 2
    assert err.startswith(
        "error: --by: unknown field 'lr_drop_epoch'; did you mean 'lr_drop_epochs'? these studies' trials "
        "can be grouped by "
    )
    assert err.rstrip().endswith("(comma-separated, e.g. --by cell,seq_len)") and "?by=" not in err
