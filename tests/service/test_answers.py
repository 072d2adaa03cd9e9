"""What a study's answers say of the trials behind them, over REST (FastAPI's TestClient, a real SQLite
ledger, no study run: results are written as the engine writes them) and in the CLI's words on the same
ledger: a best configuration some seed of which did not train to its end, a model asha stopped whole,
the reference model of a success table, successes against budget under another criterion, a sampled
study's progress against its budget."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.api import create_app
from service.cli import commands
from service.client import MemsweepClient
from service.core.settings import get_settings
from service.core.spec import StudySpec
from service.study.search import execution, point_trials
from tests.service.conftest import TINY
from tests.service.test_api_units import finish_all, grid, ledger_of, settings
from trainers import Evaluation, TrialResult

Cli = Callable[..., str]


@pytest.fixture
def served(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> Iterator[tuple[TestClient, Cli]]:
    """The REST app on a home, and `memsweep` on the same home's ledger (its printed output)."""
    monkeypatch.setenv("MEMSWEEP_HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    for name in ("MEMSWEEP_API_URL", "MEMSWEEP_DATABASE_URL", "MEMSWEEP_MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(commands, "prepare_ray_process", lambda settings: None)  # these commands start no Ray
    get_settings.cache_clear()  # the CLI's settings read again, from this home (and again after the test)
    request.addfinalizer(get_settings.cache_clear)

    def cli(*args: str) -> str:
        capsys.readouterr()
        code = commands.main(list(args))
        out, err = capsys.readouterr()
        assert code == 0, err[-2000:]
        return " ".join(out.split())  # one space between words, whatever the table's layout

    with TestClient(create_app(settings(tmp_path))) as c:
        yield c, cli


def finish(
    c: TestClient, study_id: str, outcome: Callable[[str, float, int], tuple[str, float] | None]
) -> None:
    """Each trial's end as the engine records it: `outcome(model, lr, seed)` → (status, final loss), or
    None to leave it pending."""
    c.app.state.runner.cancel(study_id)  # type: ignore[attr-defined]  # this server runs nothing
    ledger = ledger_of(c)
    for t in ledger.trials(study_id):
        ended = outcome(t.model, t.params["lr"], t.params["seed"])
        if ended is None:
            continue
        status, loss = ended
        evaluations = [Evaluation(10, 1.0, loss, loss, None, 0.1)]
        result = TrialResult(
            status=status,
            reason="stopped early by the scheduler after 1 evaluation" if status == "pruned" else None,
            final_val_loss=loss,
            baseline_loss=1 / 6,
            steps=10,
            seconds=0.1,
            history=evaluations,
        )
        ledger.start_trial(study_id, t.config_hash)
        ledger.finish_trial(t.id, result)
    ledger.update_study(study_id, state="done")


def asha_stopped_some(model: str, lr: float, seed: int) -> tuple[str, float] | None:
    """chain lr 1e-2: every seed done; chain lr 1e-3: the lowest loss, but seed 2 pruned and seed 3
    never run; orth: every trial pruned."""
    if model == "orth":
        return "pruned", 0.3
    if lr == 1e-2:
        return "done", 0.05 * seed
    return {1: ("done", 0.01), 2: ("pruned", 0.02), 3: None}[seed]


def test_a_best_configuration_says_which_seeds_its_mean_leaves_out_and_why(
    served: tuple[TestClient, Cli],
) -> None:
    """A point some seed of which was pruned, failed or has not run is ranked after the complete ones,
    and nothing in its row or in `memsweep best` said so; a model asha stopped whole printed "no
    finished trial yet", as if the finished study had not run."""
    c, cli = served
    sid = c.post("/studies", json=grid(seeds=[1, 2, 3], scheduler="asha")).json()["id"]
    finish(c, sid, asha_stopped_some)
    best = c.get(f"/studies/{sid}/best").json()
    assert [(r["params"]["lr"], r["seeds"], r["missing_seeds"]) for r in best] == [
        (1e-2, [1, 2, 3], {}),
        (1e-3, [1], {"pending": 1, "pruned": 1}),  # its mean, 0.01, is the lowest: ranked after, said why
    ]
    assert c.get(f"/studies/{sid}/best", params={"model": "orth"}).json() == []

    printed = cli("best", sid)
    assert "1 of 3 *" in printed
    assert (
        "* seeds not in the mean, ranked after the points whose every seed trained to its end: "
        "chain lr=0.001: 1 not run yet, 1 stopped early by asha"
    ) in printed
    assert "all 6 trials of orth were stopped early by asha; none trained to its end" in printed
    only_orth = cli("best", sid, "--model", "orth")
    assert only_orth == "all 6 trials of orth were stopped early by asha; none trained to its end"
    assert "orth" not in cli("best", sid, "--model", "chain")  # the model asked for, only


def test_a_model_none_of_whose_trials_ended_is_told_apart_from_one_not_run_yet(
    served: tuple[TestClient, Cli],
) -> None:
    c, cli = served
    sid = c.post("/studies", json=grid()).json()["id"]
    finish(c, sid, lambda model, lr, seed: ("failed", math.nan) if lr == 1e-2 else None)
    printed = cli("best", sid)
    for model in ("chain", "orth"):
        assert (
            f"none of the 4 trials of {model} trained to its end: 2 failed, 2 not ended (pending, running "
            "or cancelled)"
        ) in printed
    fresh = c.post("/studies", json=grid(name="fresh")).json()["id"]
    assert "no trial of chain has ended yet (4 pending, running or cancelled)" in cli("best", fresh)


def test_the_reference_model_is_marked_the_reference_not_a_difference_of_zero(
    served: tuple[TestClient, Cli],
) -> None:
    """`?reference=MODEL` gave the reference's own row 0.0 [0, 0], a difference measured as none: it is
    marked the reference, with no difference, in REST, the client's frame and the CLI."""
    c, cli = served
    sid = c.post("/studies", json=grid()).json()["id"]
    finish_all(c, sid)  # chain 2 of 4 succeed, orth none
    table = c.get(f"/studies/{sid}/success", params={"reference": "chain"}).json()
    assert table["differences"]["chain"] == {
        "difference": None,
        "ci95": None,
        "p": None,
        "is_reference": True,
    }
    assert table["differences"]["orth"]["difference"] == -0.5
    assert table["differences"]["orth"]["is_reference"] is False
    frame = MemsweepClient("http://testserver", http=c).success_table(sid, reference="chain")
    assert frame.loc["chain", "is_reference"] and math.isnan(frame.loc["chain", "difference"])
    assert not frame.loc["orth", "is_reference"] and frame.loc["orth", "difference"] == -0.5
    printed = cli("success", sid, "--reference", "chain")
    assert "│ chain │ 4 │ 4 │ 0 │ 2 │ 0.500 │ [0.150, 0.850] │ reference │ │" in printed  # was empty cells
    assert "│ orth │ 4 │ 4 │ 2 │ 0 │ 0.000 │ [0.000, 0.490] │ -0.500 │ [-0.850, +0.102] │" in printed


def test_success_against_budget_takes_the_criterion_success_takes(served: tuple[TestClient, Cli]) -> None:
    """`/success/budget` took no criterion (`?fraction=` was refused as a parameter it does not take),
    while `/success` recounts under any: it takes the same, as does the client."""
    c, _ = served
    sid = c.post("/studies", json=grid()).json()["id"]
    finish_all(c, sid)  # histories: 2× the final loss at step 10, the final loss at 20
    route = f"/studies/{sid}/success/budget"
    own = c.get(route).json()
    assert own["criterion"]["name"] == "0.5 × baseline"
    assert [r["succeeded"] for r in own["by_model"]["chain"]] == [0, 2]
    loose = c.get(route, params={"fraction": 1.0}).json()
    assert loose["criterion"]["name"] == "1 × baseline"
    assert [r["succeeded"] for r in loose["by_model"]["chain"]] == [2, 4]
    at_end = c.get(f"/studies/{sid}/success", params={"fraction": 1.0}).json()["by_model"]["chain"]
    assert loose["by_model"]["chain"][-1]["succeeded"] == at_end["succeeded"]  # the same recount
    by_loss = c.get(route, params={"threshold": 0.5}).json()
    assert by_loss["criterion"]["name"] == "loss < 0.5" and by_loss["by_model"]["orth"][-1]["succeeded"] == 2
    client = MemsweepClient("http://testserver", http=c)
    assert client.success_vs_budget(sid, fraction=1.0) == loose
    for bad in ({"fraction": 5}, {"threshold": "inf"}):
        r = c.get(route, params=bad)
        assert r.status_code == 422 and next(iter(bad)) in r.text, r.text
    r = c.get(route, params={"baseline": "arjovsky"})
    assert r.status_code == 422 and "baseline" in r.text and "task" in r.text, r.text


def test_a_sampled_study_shows_its_progress_against_its_budget(
    served: tuple[TestClient, Cli], capsys: pytest.CaptureFixture[str]
) -> None:
    """`memsweep studies` showed a sampled study's finished trials of those drawn so far (2/2 while its
    sampler had 6 more to draw); a finished one over a smaller space, of its trials (not 2/8)."""
    c, cli = served
    spec = {"name": "drawn", "space": {"dims": {"lr": [1e-3]}}, "base": TINY, "seeds": [1, 2],
            "sampler": "random", "max_trials": 8}  # fmt: skip
    sid = c.post("/studies", json=spec).json()["id"]
    c.app.state.runner.cancel(sid)  # type: ignore[attr-defined]  # this server runs nothing
    engine = c.app.state.engine  # type: ignore[attr-defined]
    validated = StudySpec.model_validate(spec)
    space = engine.space(validated)
    ledger = ledger_of(c)
    ledger.add_trials(sid, point_trials(space, space.models[0], {"lr": 1e-3}, execution(validated)))
    for t in ledger.trials(sid):  # the sampler's first draw, trained
        ledger.start_trial(sid, t.config_hash)
        ledger.finish_trial(t.id, TrialResult(final_val_loss=0.05, baseline_loss=1 / 6))
    ledger.update_study(sid, state="running")
    assert c.get("/studies").json()["items"][0]["expected_trials"] == 8
    assert f"{sid} running 2/8 " in cli("studies")
    # `memsweep run`'s bar counts against the same budget
    capsys.readouterr()
    commands.show_progress(c.app.state.runner, sid, quiet=False)  # type: ignore[attr-defined]
    assert "2/8" in capsys.readouterr().out
    # the space holds one point: the study ends done with its 2 trials, and says 2/2
    ledger.update_study(sid, state="done")
    assert c.get(f"/studies/{sid}").json()["expected_trials"] == 2
    assert f"{sid} done 2/2 " in cli("studies")
