"""What `memsweep`'s tables print (`service.cli.console`), the demo's best table, and the CSV a table
writes for a group with no finished run."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest

from service.cli import console, demo
from service.core.settings import get_settings
from service.core.values import params_texts
from service.reports.compare import ComparisonRow
from service.reports.summary import best_configs, success_table
from service.reports.tables import comparison_csv, read_csv, success_csv
from tests.service.test_units import T

#: a valid study name that is Rich markup: `memsweep run` crashed on it (MarkupError: closing tag '[/sweep]')
MARKUP = "lr [/sweep] [red]x"


@pytest.fixture
def printed(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """What the printers wrote to stdout since the last call, its whitespace as single spaces (a title
    rich wraps to its table's width reads as one line)."""
    monkeypatch.setenv("COLUMNS", "250")
    capsys.readouterr()
    return lambda: " ".join(capsys.readouterr().out.split())


def success_of(name: str, models: tuple[str, ...] = ("chain",)) -> dict[str, Any]:
    trials = [T(m, {"lr": 1e-3, "seed": s}, 0.05) for m in models for s in (1, 2)]
    return {"name": name, "success": success_table(trials).model_dump(mode="json")}


def plan_of(name: str) -> dict[str, Any]:
    row = {"budget_steps": [20, 20], "trials": 2, "to_run": 2, "units": 1, "fused": True}
    return {
        "name": name, "sampler": "grid", "by_model": {"chain": row}, "unit_sizes": {"2": 1}, "units": 1,
        "bundles": 1, "budget": {"trial_steps": 40, "unit_steps": 20}, "slots": 1, "concurrency": 1,
        "node_type": "cpu", "shapes": [], "estimate": None, "notes": [], "reused": 0, "to_run": 2,
    }  # fmt: skip


def comparison_of(studies: dict[str, str]) -> dict[str, Any]:
    """Two studies' rows in the group model=chain, each 1/2."""
    criterion = {"name": "0.5 × baseline", "fraction": 0.5, "threshold": None, "baseline": "task"}
    rows = [
        ComparisonRow(scope="group", group={"model": "chain"}, study_id=sid, trials=2, finished=2, failed=0,
                      errors=0, succeeded=1, rate=0.5, ci95=(0.09, 0.91), difference=None,
                      difference_ci95=None, shared=None).model_dump(mode="json")
        for sid in studies
    ]  # fmt: skip
    return {
        "studies": [{"study_id": sid, "name": name, "criterion": criterion} for sid, name in studies.items()],
        "by": ["model"], "at_step": None, "reference": next(iter(studies)), "rows": rows, "notes": [],
    }  # fmt: skip


def test_user_text_in_a_table_is_printed_as_written(printed: Any) -> None:
    """Names, ids, models and values went through rich's markup: `lr [/sweep] [red]x` raised MarkupError
    in `run`, `success`, `compare` and `plan`; `--name "[bold]sweep"` printed `plan of sweep`; and
    `compare`'s `A [bdd08e278468]` lost its id, a style tag to rich, so two studies named A read alike."""
    console.print_success(success_of(MARKUP, models=("[dim]chain",)))
    out = printed()
    assert f"({MARKUP})" in out and "│ [dim]chain │" in out
    console.print_plan(plan_of("[bold]sweep"))
    assert "plan of [bold]sweep (grid)" in printed()
    console.print_comparison(comparison_of({"bdd08e278468": "A", "0123456789ab": "A"}))
    out = printed()
    assert "│ A [bdd08e278468] │" in out and "│ A [0123456789ab] │" in out
    trials = [T("[red]chain", {"act": "[/i]", "seed": 1}, 0.05)]
    console.print_best([b.model_dump(mode="json") for b in best_configs(trials)])
    assert "│ [red]chain │ act=[/i] │" in printed()
    page = {"total": 1, "criterion": {"name": "loss < 0.5 × baseline"}, "items": [
        {"id": 1, "model": MARKUP, "params": {"act": "[b]"}, "status": "failed", "final_val_loss": None,
         "success": None, "seconds": 1.0, "reason": "bad value [/] :smile:", "last_evaluation": None},
    ]}  # fmt: skip
    console.print_trials(page)
    assert f"│ {MARKUP} │ act=[b] │" in (out := printed()) and "bad value [/] :smile:" in out


def best_of(lrs: list[float]) -> list[dict[str, Any]]:
    trials = [T("chain", {"lr": lr, "seed": 1}, 0.01 * (i + 1)) for i, lr in enumerate(lrs)]
    return [b.model_dump(mode="json") for b in best_configs(trials, k=len(lrs))]


def test_a_sampled_value_prints_in_six_digits_and_two_that_agree_in_six_in_all_theirs(
    printed: Any,
) -> None:
    """`best` printed a sampled learning rate in every digit, `lr=0.0016051911333587634`: a float is six
    significant digits in a table, unless another value of its name there agrees in those (3.172841e-4
    and 3.172838e-4 are both 0.000317284: two rows that read alike), then `repr_value`'s every digit."""
    lrs = [0.0016051911333587634, 3.172841e-4, 3.172838e-4, 1e-3, 1.0]
    console.print_best(best_of(lrs))
    out = printed()
    assert "lr=0.00160519 " in out and "0.0016051911333587634" not in out
    assert "lr=0.0003172841 " in out and "lr=0.0003172838 " in out
    assert "lr=0.001 " in out and "lr=1 " in out
    console.print_trials({"total": 1, "criterion": {"name": "loss < 0.12"}, "items": [
        {"id": 1, "model": "chain", "params": {"lr": lrs[0], "seed": 1}, "status": "done",
         "final_val_loss": 0.01, "success": True, "seconds": 1.0, "last_evaluation": None},
    ]})  # fmt: skip
    assert "lr=0.00160519 seed=1 " in printed()


def test_the_best_table_says_it_ranks_by_loss_not_by_successes(printed: Any) -> None:
    """A point with 0/2 successes ranks above one with 1/2 whose other seed blew up: the title said
    the loss in parentheses, read as the `mean loss` column's meaning, not as the order."""
    trials = [T("chain", {"lr": 1e-3, "seed": s}, loss) for s, loss in ((1, 0.15), (2, 0.15))]
    trials += [T("chain", {"lr": 1e-2, "seed": s}, loss) for s, loss in ((1, 0.01), (2, 5.0))]
    best = [b.model_dump(mode="json") for b in best_configs(trials)]
    assert [b["succeeded"] for b in best] == [0, 1]
    console.print_best(best)
    assert "ranked by mean final validation loss over seeds, not by successes" in printed()


def test_a_csv_row_with_no_finished_run_has_no_interval(tmp_path: Path) -> None:
    """`compare --by model,lr --csv`: a group a study lacks read rate "" but ci95 0.0, 1.0 (Wilson's
    interval of 0/0, as the JSON keeps it); its interval is empty like its rate, in the success CSV too."""
    comparison = comparison_of({"a1": "A", "b2": "B"})
    comparison["rows"][1].update(trials=0, finished=0, succeeded=0, rate=None, ci95=[0.0, 1.0])
    frame = read_csv(io.StringIO(comparison_csv(comparison)))
    assert frame[["rate", "ci95_low", "ci95_high"]].isna().values.tolist() == [[False] * 3, [True] * 3]
    assert frame.ci95_low[0] == pytest.approx(0.09)
    unrun = [T("chain", {"seed": 1}, 0.05), T("orth", {"seed": 1}, None, "pending")]
    frame = read_csv(io.StringIO(success_csv(success_table(unrun).model_dump(mode="json"), "s1")))
    by_model = frame[frame.table == "by_model"].set_index("model")
    assert by_model.ci95_low.isna().to_dict() == {"chain": False, "orth": True}


class DemoServer:
    """A memsweep server's answers to the demo: its study finished, every point's seeds each run once."""

    def __init__(self) -> None:
        spec = demo.DEMO_SPEC
        self.points = [
            {"model": m, "params": {"lr": lr, "scale": 1.0}, "mean_final_val_loss": 0.1 * (i + 1), "sem": 0.01,
             "seeds": spec["seeds"], "succeeded": 0, "trials": len(spec["seeds"]), "missing_seeds": {}}
            for i, (m, lr) in enumerate((m, lr) for m in spec["models"] for lr in spec["dims"]["lr"])
        ]  # fmt: skip
        self.study = {"id": "s1", "name": spec["name"], "state": "done", "mlflow": {}, "spec": spec,
                      "counts": {"total": len(self.points) * len(spec["seeds"]), "failed": 0}}  # fmt: skip
        self.failed: list[dict[str, Any]] = []  # its failed trials (`trials`, less their traceback)

    def __enter__(self) -> DemoServer:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def submit(self, spec: Any, **kw: Any) -> dict[str, Any]:
        return self.study

    def wait(self, study_id: str, **kw: Any) -> dict[str, Any]:
        return self.study

    def success(self, study_id: str, **criterion: Any) -> dict[str, Any]:
        """The table under the study's criterion, or under Arjovsky's baseline (copy's other criterion,
        which counts alike here)."""
        table: dict[str, Any] = success_of("demo", models=tuple(demo.DEMO_SPEC["models"]))["success"]
        raised = sum(t.get("traceback") is not None for t in self.failed)  # as the server counts them
        if criterion.get("baseline") == "arjovsky":
            table["criterion"] = {
                **table["criterion"],
                "name": "0.5 × arjovsky baseline",
                "baseline": "arjovsky",
            }
        return {**table, "total": {**table["total"], "raised": raised}}

    def best(self, study_id: str, k: int = 5) -> list[dict[str, Any]]:  # the client's default k
        return self.points[:k]

    def trials(self, study_id: str, status: str | None = None, history: bool = False) -> list[dict[str, Any]]:
        return [{k: v for k, v in t.items() if history or k != "traceback"} for t in self.failed]


def test_the_demo_prints_every_point_of_its_study(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, printed: Any
) -> None:
    """The demo asked for the best 3 of its 4 points: orthogonal at lr 1e-3, the run the README's
    "Seen here" talks about, ranked 4th and was never shown."""
    from service.cli.parser import build_parser

    monkeypatch.setenv("MEMSWEEP_HOME", str(tmp_path))
    get_settings.cache_clear()
    request.addfinalizer(get_settings.cache_clear)
    server = DemoServer()
    monkeypatch.setattr(demo, "answers", lambda url: True)
    monkeypatch.setattr(demo, "client_for", lambda url: server)
    assert demo.run_demo(build_parser().parse_args(["demo"])) == 0
    out = printed()
    assert [f"│ {p['model']} │ lr={p['params']['lr']:g} " in out for p in server.points] == [True] * 4


def test_the_run_bar_prints_its_whole_line_when_piped(printed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`memsweep run` piped to a log (a batch job's) printed its bar at a terminal's 80 columns: `study …
    12… done · … ETA – 0:…`. It takes the tables' console, the whole line when piped."""
    from types import SimpleNamespace

    import rich

    from service.cli import commands

    monkeypatch.delenv("COLUMNS")  # piped, as a log is: no terminal, no width set
    monkeypatch.setattr(rich, "_console", None)  # rich's own console, made afresh (as in a new process)

    counts = {"total": 12000, "running": 1000, "failed": 2000, "succeeded": 4000, "done": 5000, "pruned": 300}
    study = SimpleNamespace(spec={"sampler": "grid"}, plan=None, state="running")
    ledger = SimpleNamespace(get_study=lambda study_id: study, counts=lambda study_id: counts)
    turns = iter([True, False])

    class Runner:
        engine = SimpleNamespace(ledger=ledger)

        def is_active(self, study_id: str) -> bool:
            return next(turns)

        def is_queued(self, study_id: str) -> bool:
            return False

        def eta(self, study_id: str) -> float:
            return 1234.0

    commands.show_progress(Runner(), "s1", quiet=False)
    out = printed()
    assert "7300/12000 running 1000 · failed 2000 · pruned 300 · successes 4000 0:00:0" in out, out


def preset_trials(preset: str) -> list[T]:
    """A preset's points, one seed each, finished (the first point best), with their trials' configs."""
    from service.core.spec import StudySpec
    from service.study.search import grid_trials, study_space

    specs = grid_trials(study_space(StudySpec.model_validate({"preset": preset, "seeds": [1]}), 50_000), {})
    trials = []
    for i, spec in enumerate(specs):
        trial = T(spec.model, dict(spec.params), 0.01 * (i + 1))
        trial.config = spec.resolved.to_dict()
        trials.append(trial)
    return trials


def best_rows(out: str) -> dict[str, str]:
    """The best table's rows in `printed()`'s text: model → its first row's params cell."""
    rows: dict[str, str] = {}
    for model, params in re.findall(r"│ ([\w-]+) +│ ([^│]*)│ [\d.]+ +│", out):
        rows.setdefault(model, params.strip())
    return rows


def test_the_best_table_names_what_sets_apart_a_point_of_no_dimensions(printed: Any) -> None:
    """nru2019-copy100's models each fix their every setting (one value a field, no dimension), and
    nru2019-sensitivity's `baseline` is the others' settings at their default: their points have no
    varied values, so the params column was empty on every row (or on baseline's), and rows read alike
    but for the model's name. Such a row shows the settings that tell its point from the study's others;
    a point with varied values shows those, as before."""
    trials = preset_trials("nru2019-copy100")
    console.print_best([b.model_dump(mode="json") for b in best_configs(trials, k=7)])
    rows = best_rows(printed())
    assert len(rows) == 7 and all(rows.values()), rows
    assert rows["nru"].startswith("cell=nru hidden=80 optimizer=keras_amsgrad clip_norm=0.5"), rows
    assert "chrono_tmax=None" in rows["lstm"] and "chrono_tmax=120" in rows["lstm-chrono"], rows
    assert "memory_size" not in rows["nru"]  # nru's alone: nothing to tell it by
    # only the model asked for: its settings as in the whole study's table
    (nru,) = best_configs(trials, model="nru")
    assert params_texts([nru.settings]) == [rows["nru"]]
    trials = preset_trials("nru2019-sensitivity")
    console.print_best([b.model_dump(mode="json") for b in best_configs(trials, k=9)])
    rows = best_rows(printed())
    assert rows["baseline"] == "hidden=200 memory_size=256 heads=4" and rows["heads"] == "heads=1", rows
    # a study of one point: nothing tells it apart; the column says so, not a blank
    (only,) = best_configs(trials[:1])
    assert only.settings == {}
    console.print_best([only.model_dump(mode="json")])
    assert best_rows(printed()) == {"baseline": "–"}


def test_a_criterion_that_counts_as_the_table_does_is_said_once_not_repeated(printed: Any) -> None:
    """Copy in the `delay` layout: Arjovsky's baseline is the task's, so `also under 0.5 × arjovsky
    baseline: chain 1/2, orth 1/2` repeated the table above it, and a threshold that met the same runs
    said it again on a line of its own. Criteria that count as the table does are named on one line;
    one that counts otherwise keeps its counts."""
    from trainers import Criterion

    trials = [T(m, {"lr": 1e-3, "seed": s}, loss) for m, s, loss in
              (("chain", 1, 0.05), ("chain", 2, 0.15), ("orth", 1, 0.3), ("orth", 2, 0.05))]  # fmt: skip
    for t in trials:  # the delay layout: T blanks, T + 20 steps, as Arjovsky et al. lay copy out
        t.reference_baselines = {"arjovsky": t.baseline_loss}
    others = [Criterion(fraction=0.5, baseline="arjovsky"), Criterion(fraction=None, threshold=0.1)]
    summary = {
        "name": "delay",
        "success": success_table(trials).model_dump(mode="json"),
        "success_other_criteria": [success_table(trials, c).model_dump(mode="json") for c in others],
    }
    console.print_success(summary)
    out = printed()
    assert out.count("also under") == 1 and "chain 1/2" not in out, out
    assert "also under 0.5 × arjovsky baseline and loss < 0.1: the same successes as above" in out, out
    # a criterion that counts otherwise: its counts, after the one line of those that do not
    summary["success_other_criteria"].append(
        success_table(trials, Criterion(fraction=1.0)).model_dump(mode="json")
    )
    console.print_success(summary)
    out = printed()
    assert out.count("also under") == 2 and out.endswith("also under 1 × baseline: chain 2/2, orth 1/2"), out


def test_run_prints_its_plans_notes_as_plan_does(printed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`memsweep run` printed its plan's one line alone: a cell added beside a preset whose models fix
    their own hidden size, or a GPU left idle, was said by `memsweep plan` and the stored plan only."""
    from types import SimpleNamespace

    from service.cli import commands

    notes = [
        "indrnn, a cell added beside preset nru2019-copy100's models, takes the default where those models "
        "each fix their own: hidden 100 (memsweep's default; nru 80, lstm 70)",
        "this machine has a GPU; this study trains on the CPUs, and the GPU stays idle",
    ]
    planned = {**plan_of("sweep"), "notes": notes}
    console.print_plan(planned)
    shown = printed()
    study = SimpleNamespace(spec={"sampler": "grid"}, plan={"planned": planned}, state="running")
    counts = {"total": 2, "running": 0, "failed": 0, "succeeded": 0, "done": 2, "pruned": 0}
    ledger = SimpleNamespace(get_study=lambda study_id: study, counts=lambda study_id: counts)

    class Runner:
        engine = SimpleNamespace(ledger=ledger)

        def is_active(self, study_id: str) -> bool:
            return False

        def is_queued(self, study_id: str) -> bool:
            return False

        def eta(self, study_id: str) -> None:
            return None

    commands.show_progress(Runner(), "s1", quiet=False)
    out = printed()
    said = [f"note: {n}" for n in notes] + [console.plan_line(planned, notes_above=True)]
    assert all(" ".join(line.split()) in shown for line in said)  # as `plan` ends …
    assert all(" ".join(line.split()) in out for line in said), out  # … `run` begins
    assert out.index("note: indrnn") < out.index("plan: 2 trials to run")
    assert out.count("indrnn, a cell added") == 1 and "no estimate yet (the notes above say why)" in out
    commands.show_progress(Runner(), "s1", quiet=True)  # --json: nothing but the JSON
    assert printed() == ""


def test_submit_wait_ends_as_run_does_with_the_success_table_and_the_best(
    monkeypatch: pytest.MonkeyPatch, printed: Any
) -> None:
    """`memsweep submit --wait` ended with the study's status alone, where `memsweep run` ends with its
    success table and best configurations."""
    from service.cli import commands
    from service.cli.parser import build_parser

    server = DemoServer()
    server.study = {**server.study, "counts": {**server.study["counts"], "done": 8, "finished": 8}}
    monkeypatch.setattr(commands, "client_for", lambda url: server)
    monkeypatch.setattr(
        commands, "print_status", lambda study: print(f"study {study['id']}: {study['state']}")
    )
    args = build_parser().parse_args(["submit", "orhan2020-copy500", "--url", "http://127.0.0.1:9", "--wait"])
    assert commands._follow(args, "http://127.0.0.1:9", server.study) == 0
    out = printed()
    assert "study s1: done" in out and "successes: final validation loss" in out
    assert "best configurations, ranked by mean final validation loss" in out
    # the study's other criteria under the table, as `run` and `success` print them
    assert "also under 0.5 × arjovsky baseline: the same successes as above" in out


def test_submit_prints_its_plans_notes_on_stderr_as_run_begins(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`memsweep submit` said the study's id and size alone: the notes of the plan the server stored at
    creation (a cell added beside a preset's models, an idle GPU) were said by `memsweep plan` only. They
    go to stderr: stdout stays the id a script reads."""
    from service.cli import commands
    from service.cli.parser import build_parser

    server = DemoServer()
    note = "this machine has a GPU; this study trains on the CPUs, and the GPU stays idle"
    server.study = {**server.study, "plan": {"planned": {**plan_of("demo-copy50"), "notes": [note]}}}
    monkeypatch.setattr(commands, "client_for", lambda url: server)
    args = build_parser().parse_args(["submit", "orhan2020-copy500", "--url", "http://127.0.0.1:9"])
    assert commands.cmd_submit(args) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "s1"
    err = " ".join(err.split())
    assert f"note: {note}" in err and "plan: 2 trials to run" in err
    assert err.index("note:") < err.index("plan: 2 trials")


@pytest.mark.parametrize("as_json", [False, True])
def test_submit_wait_says_which_trials_raised_and_exits_1_when_all_did_as_run_does(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    """A plugin cell that raises on the study's sequences: every trial failed by an exception. `memsweep
    run` says so and exits 1 (the study has no result); `submit --wait` printed a 0 % rate and exited 0."""
    from service.cli import commands
    from service.cli.parser import build_parser

    monkeypatch.setenv("COLUMNS", "250")
    server = DemoServer()
    server.study = {
        **server.study,
        "counts": {**server.study["counts"], "done": 0, "failed": 4, "finished": 4},
    }
    crash = {
        "reason": "RuntimeError: toy-crash: too long",
        "traceback": "Traceback (most recent call last): …",
    }
    server.failed = [crash] * 4
    monkeypatch.setattr(commands, "client_for", lambda url: server)
    monkeypatch.setattr(commands, "print_status", lambda study: None)
    flags = ["--json"] if as_json else []
    args = build_parser().parse_args(
        ["submit", "orhan2020-copy500", "--url", "http://127.0.0.1:9", "--wait", *flags]
    )
    capsys.readouterr()
    assert commands._follow(args, "http://127.0.0.1:9", server.study) == console.EXIT_FAILED
    out, err = (" ".join(text.split()) for text in capsys.readouterr())
    assert "every trial of study s1 raised an exception (above): it has no result" in err
    if not as_json:
        assert "failed: 4 trial(s) 4 × RuntimeError: toy-crash: too long" in out
        assert "4 of them raised an exception, not the protocol's failure (a loss not finite)" in out
    # one trial that trained to its end: the study has a result, its failures said all the same
    server.study["counts"] = {**server.study["counts"], "done": 1, "failed": 3}
    server.failed = [crash, {"reason": "loss nan at step 12", "traceback": None}, crash]
    assert commands._follow(args, "http://127.0.0.1:9", server.study) == 0
    out, err = (" ".join(text.split()) for text in capsys.readouterr())
    assert "raised an exception (above)" not in err
    if not as_json:
        assert "2 × RuntimeError: toy-crash: too long 1 × loss nan at step 12 2 of them raised" in out


@pytest.mark.parametrize("command", ["plan", "submit"])
def test_a_list_as_a_dimensions_value_is_refused_saying_where_a_list_goes(command: str) -> None:
    """`--dim lr_drop_epochs=[1,3]` was split on its comma and refused as `lr_drop_epochs='[1'`: not a
    list of epochs. A dimension's values are single values: the list goes in `--set`."""
    from service.cli.parser import build_parser

    flags = ["--dim", "lr=1e-3", "--dim", "lr_drop_epochs=[1,3]"]
    args = build_parser().parse_args([command, "orhan2020-addition750", *flags])
    with pytest.raises(console.Refused) as refused:
        console.build_spec(args) if command == "plan" else console.extension_of(args)
    assert refused.value.code == console.EXIT_REFUSED
    assert str(refused.value) == (
        "error: --dim lr_drop_epochs=[1,3]: a dimension's values are single values, separated by commas; a list "
        "is one setting of every trial, given with --set (or in base): --set 'lr_drop_epochs=[1,3]'; several "
        "single values are swept as --dim lr_drop_epochs=1,3"
    )
    args = build_parser().parse_args([command, "orhan2020-addition750", "--dim", "lr=1e-3,3e-4"])
    dims = console.build_spec(args).dims if command == "plan" else console.extension_of(args)["dims"]
    assert dims["lr"] == [1e-3, 3e-4]


def test_the_best_table_says_when_the_study_has_more_points_than_it_shows(printed: Any) -> None:
    """`memsweep best` (k = 5 by default) dropped a sixth point without a word: it asks for one more row
    than it shows, and says so when that row exists."""
    points = DemoServer().points  # 4 points
    console.print_best(points[:3], k=2)
    shown = printed()
    assert "the best 2 points shown; the study has more (--k N shows N)" in shown
    assert shown.count("chain") + shown.count("orthogonal") == 2  # two rows, not three
    console.print_best(points, k=4)  # every point: nothing more to say
    assert "the study has more" not in printed()
