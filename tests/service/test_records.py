"""One record per concept: a trial's result has one set of field names from the trainers to the
ledger, the REST answer and MLflow; the ledger's schema is what its migrations build."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect

import trainers
from service.api.schemas import TrialPublic
from service.store.database import migrations, upgrade
from service.store.ledger import Ledger
from service.store.models import JUDGED_FIELDS, Base, Trial
from service.tracking.child_run import METRIC_FIELDS
from trainers.result import RECORDED_FIELDS


def test_the_result_fields_keep_their_names_in_the_ledger_rest_and_mlflow() -> None:
    columns = set(Trial.__table__.columns.keys())
    assert set(RECORDED_FIELDS) <= columns
    assert set(RECORDED_FIELDS) <= set(TrialPublic.model_fields)
    # REST invents no other name (but the last of `history`, a view of its column: where a running trial
    # is, and the study training a trial this one waits for, read from the other study's rows)
    assert set(TrialPublic.model_fields) <= columns | set(JUDGED_FIELDS) | {"last_evaluation", "trained_by"}
    assert not set(JUDGED_FIELDS) & columns  # success is judged under the study's criterion, not stored
    assert set(METRIC_FIELDS) <= set(RECORDED_FIELDS) | set(JUDGED_FIELDS)
    evaluation = {f.name for f in dataclasses.fields(trainers.Evaluation)}
    assert TrialPublic.model_fields["history"].annotation == list[trainers.Evaluation] | None
    # `lr` where the trial's rate moves (MLflow's metric of that name); a constant rate's history has none
    assert evaluation == {"step", "epoch", "train_loss", "val_loss", "metric", "seconds", "lr"}


def test_a_result_goes_through_the_ledger_unchanged(tmp_path: Path) -> None:
    from service.core.spec import StudySpec
    from service.study.search import grid_trials

    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    spec = StudySpec.model_validate({"space": {"dims": {"lr": [1e-3]}}, "base": {"task": "addition"}})
    study = ledger.create_study("s", {})
    (planned,) = grid_trials(spec.search_space(), {})
    ledger.add_trials(study.id, [planned])
    (row,) = ledger.trials(study.id)
    assert row.spec() == planned  # the stored config resolves to the same trial
    result = trainers.TrialResult(
        final_val_loss=0.01, final_metric=0.5, metric_name="accuracy", baseline_loss=1 / 6,
        reference_baselines={"arjovsky": 0.16}, steps=7, budget_steps=9, early_stopped=True, seconds=1.5, param_count=33,
        henrici_index=2.5, profile=[0.0, 1.0, 0.5],
        history=[trainers.Evaluation(7, 0.5, 0.2, 0.01, 0.5, 1.25)],
    )  # fmt: skip
    import torch

    w, v = torch.randn(5, 5), torch.randn(5, 2)
    ledger.finish_trial(row.id, dataclasses.replace(result, recurrent_matrix=w, input_matrix=v))
    (row,) = ledger.trials(study.id)
    assert row.result() == result
    assert ledger.matrices(row.id) == {"W": w.tolist(), "V": v.tolist()}  # float32, exactly
    other = ledger.create_study("t", {})
    ledger.add_trials(other.id, [planned])  # reused: its result and matrices come along
    (reused,) = ledger.trials(other.id)
    assert reused.reused_from == row.id and ledger.matrices(reused.id) == ledger.matrices(row.id)


def test_a_running_trials_evaluations_are_its_own_runs_and_never_overwrite_a_result(tmp_path: Path) -> None:
    """What a running trial shows (`record_evaluations`) is its current run's: a start clears what an
    earlier run left (a run a crash cut short), and a trial that has ended keeps what its end wrote."""
    from service.core.spec import StudySpec
    from service.study.search import grid_trials

    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    spec = StudySpec.model_validate({"space": {"dims": {"lr": [1e-3, 1e-4]}}, "base": {"task": "addition"}})
    study = ledger.create_study("s", {})
    ledger.add_trials(study.id, grid_trials(spec.search_space(), {}))
    a, b = ledger.trials(study.id)
    first, second = (trainers.Evaluation(s, s / 10, 0.3, 0.2, None, s / 100) for s in (10, 20))
    for row in (a, b):
        ledger.start_trial(study.id, row.config_hash)
    assert ledger.record_evaluations(study.id, {a.id: [first], b.id: [first, second]})
    assert [[e["step"] for e in t.history] for t in ledger.trials(study.id)] == [[10], [10, 20]]
    ledger.start_trial(study.id, a.config_hash)  # started again (its last run's process died)
    assert ledger.trial(a.id).history is None
    ledger.finish_trial(b.id, trainers.TrialResult(final_val_loss=0.2, steps=20, history=[second]))
    assert ledger.record_evaluations(study.id, {b.id: [first, second]})  # b's arrives after its end
    assert [e["step"] for e in ledger.trial(b.id).history] == [20]


def test_a_trial_is_reserved_by_one_study_and_what_a_dead_run_left_running_goes_back(tmp_path: Path) -> None:
    """Two studies holding one trial: the first to reserve it (a unit about to start) holds it running,
    and the other's reservation leaves it while the first's process lives; a reservation a run did not
    use, and what a dead process left running, go back to pending (`pend_running`)."""
    from service.core.spec import StudySpec
    from service.study.search import grid_trials

    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    spec = StudySpec.model_validate({"space": {"dims": {"lr": [1e-3, 1e-4]}}, "base": {"task": "addition"}})
    a, b = ledger.create_study("a", {}), ledger.create_study("b", {})
    for study in (a, b):
        ledger.add_trials(study.id, grid_trials(spec.search_space(), {}))
        ledger.update_study(study.id, state="running", owner=f"{study.id}-owner")
    x, y = (t.config_hash for t in ledger.trials(a.id))
    living = lambda owner, beat: True  # noqa: E731
    assert ledger.reserve_trials(a.id, [x], living) == {x}
    assert ledger.reserve_trials(b.id, [x, y], living) == {y}  # x is a's now
    assert ledger.reserve_trials(b.id, [x], lambda owner, beat: owner != f"{a.id}-owner") == {x}  # a died
    assert ledger.statuses(a.id, [x, y]) == {x: "running", y: "pending"}
    ledger.record_evaluations(a.id, {ledger.trials(a.id)[0].id: [trainers.Evaluation(5, 1, 1, 1, None, 1)]})
    assert ledger.pend_running(a.id, [x], None, forget_history=False) == [x]  # its unit never started
    assert ledger.trials(a.id)[0].history is not None and ledger.statuses(a.id, [x]) == {x: "pending"}
    assert ledger.reserve_trials(a.id, [x], living) == set()  # b holds it now
    assert sorted(ledger.pend_running(b.id, None, None, forget_history=False)) == sorted([x, y])  # b ends
    assert ledger.reserve_trials(a.id, [x, y], living) == {x, y}
    assert sorted(ledger.pend_running(a.id, None, "its process died")) == sorted([x, y])  # a's next run
    (row,) = [t for t in ledger.trials(a.id) if t.config_hash == x]
    assert row.status == "pending" and row.reason == "its process died" and row.history is None


def test_a_fresh_ledger_has_the_schema_of_the_orm(tmp_path: Path) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    engine = create_engine(f"sqlite:///{tmp_path / 'fresh.db'}")
    upgrade(engine)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == [], "service/store/models.py and service/store/migrations/ disagree: add a migration"


def test_a_ledger_from_before_migrations_is_upgraded_and_keeps_its_trials(tmp_path: Path) -> None:
    """The schema memsweep wrote before migrations (revision 0001), with a finished trial in it."""
    path = tmp_path / "old.db"
    engine = create_engine(f"sqlite:///{path}")
    from alembic import command

    with engine.begin() as conn:
        command.upgrade(migrations(conn), "0001")
        conn.exec_driver_sql("DROP TABLE alembic_version")  # as an old memsweep left it
    db = sqlite3.connect(path)
    db.execute(
        "INSERT INTO studies VALUES ('s1', 'old', '{}', 'done', NULL, NULL, NULL, '2026-01-01', '2026-01-01')"
    )
    db.execute(
        "INSERT INTO trials (study_id, config_hash, model, params, config, status, final_val_loss, henrici,"
        " runs, updated_at) VALUES ('s1', 'h', 'chain', '{}', '{}', 'done', 0.01, 2.5, 1, '2026-01-01')"
    )
    db.commit()
    db.close()
    ledger = Ledger(f"sqlite:///{path}")
    (trial,) = ledger.trials("s1")
    assert (trial.henrici_index, trial.final_val_loss, trial.status) == (2.5, 0.01, "done")
    assert "henrici" not in {c["name"] for c in inspect(ledger.database).get_columns("trials")}


def test_processes_opening_one_new_ledger_at_once_migrate_it_once(tmp_path: Path) -> None:
    """An API and a CLI may open a ledger at the same moment: one migrates, the others wait."""
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'race.db'}"
    code = f"from service.store.ledger import Ledger; Ledger({url!r}).list_studies(); print('ok')"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]  # fmt: skip
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-500:] for _, err in outs]
    from alembic.script import ScriptDirectory

    with Ledger(url).database.connect() as conn:
        (version,) = conn.exec_driver_sql("SELECT version_num FROM alembic_version").one()
        assert version == ScriptDirectory.from_config(migrations(conn)).get_current_head()


def test_migration_0008_rekeys_trials_run_with_other_rounding_and_clears_results_taken_across_it(
    tmp_path: Path,
) -> None:
    """Trials stored before threads and the validation batch joined the hash (revision 0007). A trial
    with 2 threads and no result takes the hash it has now (it resolves and trains: `Trial.spec`); one
    whose result was computed on 2 threads before every thread flushed denormals keeps it under a hash
    that no trial of now has (a result of an older trainer: never reused); a trial that had taken the
    result of a trial run with other threads is pending again, its copied result cleared; what trials
    computed themselves stays, and a 1-thread trial hashes as it did."""
    from alembic import command

    from service.core.spec import StudySpec
    from service.core.trial import StaleTrialError
    from service.study.search import execution, grid_trials

    def planned(cpus: int) -> list:
        spec = StudySpec.model_validate(
            {
                "space": {"dims": {"lr": [1e-3, 3e-3]}},
                "base": {"task": "addition"},
                "resources": {"cpus": cpus},
            }
        )
        return grid_trials(spec.search_space(), execution(spec))

    one, two = planned(1), planned(2)
    assert [t.resolved.config.threads for t in two] == [2, 2]
    assert {t.config_hash for t in one}.isdisjoint(t.config_hash for t in two)
    old_hash = {t.config["lr"]: t.config_hash for t in one}  # what 0007's code hashed both as

    path = tmp_path / "ledger.db"
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        command.upgrade(migrations(conn), "0007")
        studies, trials = Base.metadata.tables["studies"], Base.metadata.tables["trials"]
        for sid in ("s1", "s2", "s3", "s4", "s5", "s6", "s8"):
            conn.execute(studies.insert().values(id=sid, name=sid, spec={}, state="done"))
        conn.execute(
            studies.insert().values(id="s7", name="s7", spec={}, state="cancelled", error="MLflow: down")
        )

        def row(tid: int, study: str, t, **values) -> None:
            conn.execute(trials.insert().values(
                id=tid, study_id=study, config_hash=old_hash[t.config["lr"]], model="m", params={},
                config=t.config, runs=values.pop("runs", 1), **values,
            ))  # fmt: skip

        done = {"status": "done", "final_val_loss": 0.25, "steps": 9, "provenance": {"numerics": "portable"}}
        row(1, "s1", one[0], **done)  # 1 thread, its own result
        row(2, "s2", two[0], **done, runs=0, reused_from=1)  # 2 threads, the 1-thread result
        row(3, "s3", two[1], **{**done, "final_val_loss": 0.5})  # 2 threads, its own result
        row(4, "s4", one[1], **{**done, "final_val_loss": 0.5}, runs=0, reused_from=3)  # the other way
        row(5, "s4", one[0], **done, runs=0, reused_from=1)  # same threads: a true reuse
        row(6, "s5", two[1], status="pending", runs=0)  # 2 threads, never run
        row(7, "s6", two[0], **done, runs=0, reused_from=2)  # 2 threads, the 1-thread result by way of 2
        row(8, "s6", two[1], **{**done, "final_val_loss": 0.5}, runs=0, reused_from=3)  # 2 threads, 2's
        row(10, "s8", two[1], **{**done, "final_val_loss": 0.5}, runs=0, reused_from=4)  # 2's, by way of 4
        row(11, "s7", two[0], **done, runs=0, reused_from=1)  # a cancelled study's, taken across
    engine.dispose()

    ledger = Ledger(f"sqlite:///{path}")  # opening it migrates it to the head
    rows = {t.id: t for s in ("s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8") for t in ledger.trials(s)}
    resolved = {i: rows[i].spec().config_hash for i in (1, 2, 4, 5, 6)}  # they resolve to their hash
    assert resolved == {
        1: one[0].config_hash,
        2: two[0].config_hash,
        4: one[1].config_hash,
        5: one[0].config_hash,
        6: two[1].config_hash,
    }
    assert rows[7].spec().config_hash == two[0].config_hash
    for i in (3, 8):
        with pytest.raises(StaleTrialError):  # a 2-thread result of before: an older trainer's
            rows[i].spec()
    assert rows[3].config_hash == rows[8].config_hash not in {t.config_hash for t in one + two}
    kept = [(rows[i].status, rows[i].final_val_loss, rows[i].reused_from) for i in (1, 3, 5, 8)]
    assert kept == [("done", 0.25, None), ("done", 0.5, None), ("done", 0.25, 1), ("done", 0.5, 3)]
    states = {
        sid: (ledger.study(sid).state, ledger.study(sid).error or "")
        for sid in ("s1", "s2", "s3", "s4", "s5", "s6")
    }
    assert {sid for sid, (state, _) in states.items() if state == "pending"} == {"s2", "s4", "s6"}
    assert all("migration 0008: 1 trial(s)" in states[sid][1] for sid in ("s2", "s4", "s6"))
    assert states["s5"] == ("done", "")  # its trial had no result to clear (its state is its own)
    # kept through a cleared row (4): it points at the row that computed it
    assert (rows[10].status, rows[10].final_val_loss, rows[10].reused_from) == ("done", 0.5, 3)
    s7 = ledger.study("s7")  # cancelled by its user: it stays so, and its MLflow note stays first
    assert s7.state == "cancelled" and s7.error.startswith("MLflow: down; ledger migration 0008: 1 trial(s)")
    for i in (2, 4, 7, 11):
        assert (rows[i].status, rows[i].final_val_loss, rows[i].reused_from, rows[i].provenance) == (
            "pending",
            None,
            None,
            None,
        )
    hashes = [t.config_hash for t in one + two]
    assert ledger.reusable(hashes) == {one[0].config_hash}  # only the 1-thread result made as it is now


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u:p@db:5432/memsweep", "postgresql+{driver}://u:p@db:5432/memsweep"),
        ("postgres://u@db/memsweep", "postgresql+{driver}://u@db/memsweep"),
        ("postgresql+psycopg2://u@db/memsweep", "postgresql+psycopg2://u@db/memsweep"),
        ("sqlite:////tmp/ledger.db", "sqlite:////tmp/ledger.db"),
    ],
)
def test_a_postgresql_url_without_a_driver_gets_the_installed_one(url: str, expected: str) -> None:
    """SQLAlchemy 2.1 reads `postgresql://` as psycopg 3, which memsweep does not install: a plain URL,
    as the docs and most hosts write it, stopped `memsweep serve` at start with a traceback."""
    import importlib.util

    from service.store.database import with_driver

    driver = "psycopg2" if importlib.util.find_spec("psycopg2") else "psycopg"
    assert with_driver(url) == expected.format(driver=driver)
    assert importlib.util.find_spec(driver) is not None  # the one chosen is there


def test_a_database_driver_this_environment_lacks_is_named_with_the_fix() -> None:
    import importlib.util

    missing = next(m for m in ("pg8000", "asyncpg", "psycopg") if importlib.util.find_spec(m) is None)
    with pytest.raises(ValueError, match=rf"does not have \({missing}\).*postgresql\+psycopg2://"):
        Ledger(f"postgresql+{missing}://u@127.0.0.1:9/memsweep")


def test_an_outage_is_logged_once_a_call_and_its_end_too(caplog: pytest.LogCaptureFixture) -> None:
    """A 26 s PostgreSQL restart wrote about forty 'unreachable' warnings and none that it was back."""
    import logging

    from sqlalchemy.exc import OperationalError

    from service.store.patience import outlasting

    tries: list[int] = []

    @outlasting
    def record_result() -> str:
        tries.append(1)
        if len(tries) < 4:
            raise OperationalError("SELECT 1", {}, ConnectionRefusedError("connection refused"))
        return "kept"

    with caplog.at_level(logging.WARNING, logger="service.store.patience"):
        assert record_result() == "kept"
    said = [r.getMessage() for r in caplog.records]
    assert len(tries) == 4 and len(said) == 2, said
    assert "unreachable" in said[0] and "record_result retrying for up to" in said[0]
    assert said[1].startswith("ledger: the database answers again; record_result went through after")
