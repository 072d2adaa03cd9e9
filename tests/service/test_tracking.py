"""A trial's child run against a real MLflow server: live while its trial trains, at a bounded
number of requests, and complete when it ends (`service.tracking.tracker.Tracker`)."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import trainers
from service.store.ledger import Ledger
from service.store.models import Trial
from service.tracking.context import StudyContext
from service.tracking.tracker import MLFLOW_FAIL_FAST, Tracker
from trainers import Criterion

INTERVAL = 1.0  # seconds between two live writes of a run, in these tests


class Counted(Tracker):
    """The real tracker, its MLflow client's requests counted per run (they still go to the server)."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri, "tracking-tests", live_interval=INTERVAL)
        self.calls: collections.Counter[str] = collections.Counter()
        for name in ("create_run", "log_batch", "set_terminated"):
            real = getattr(self.client, name)
            setattr(self.client, name, self._count(name, real))
        self.children.write_artifact = self._count("artifact", self.children.write_artifact)  # type: ignore[method-assign]

    def _count(self, name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return real(*args, **kwargs)

        return call


def two_trials(tmp_path: Path) -> tuple[Ledger, list[Trial]]:
    from service.core.spec import StudySpec
    from service.study.search import grid_trials

    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    spec = StudySpec.model_validate({"space": {"dims": {"lr": [1e-3, 2e-3]}}, "base": {"task": "addition"}})
    study = ledger.create_study("s", {})
    ledger.add_trials(study.id, grid_trials(spec.search_space(), {}))
    return ledger, ledger.trials(study.id)


def evaluation(step: int) -> trainers.Evaluation:
    return trainers.Evaluation(step, step / 10, 1.0 / step, 0.5 / step, None, step * 0.1)


def children(client: Any, exp_id: str, parent: str) -> dict[str, Any]:
    runs = client.search_runs([exp_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    return {r.data.tags["memsweep.config_hash"]: r for r in runs}


def test_a_long_trial_is_live_and_a_short_one_is_written_whole_in_four_requests(tmp_path, mlflow_uri):
    ledger, (long, short) = two_trials(tmp_path)
    tracker = Counted(mlflow_uri)
    exp_id, parent = tracker.start_study(long.study_id, "s", {}, None)
    study = StudyContext(exp_id, parent, Criterion())
    tracker.calls.clear()  # the parent run's
    client = tracker.client
    run_ids: dict[int, str] = {}

    def setter(trial: Trial) -> Any:
        return lambda run_id: run_ids.__setitem__(trial.id, run_id)

    try:
        tracker.trial_started(study, long, setter(long))
        tracker.trial_started(study, short, setter(short))
        tracker.trial_evaluated(short.config_hash, [evaluation(1)])
        result = trainers.TrialResult(
            final_val_loss=0.25, steps=2, budget_steps=2, history=[evaluation(1), evaluation(2)]
        )
        row = ledger.finish_trial(short.id, result)
        tracker.log_trial(study, row, None, setter(short))  # ends before its interval
        tracker.flush()
        assert set(children(client, exp_id, parent)) == {short.config_hash}  # the long one is not made yet

        # made one interval after its start, its params in the batch that follows the create at once
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            live = children(client, exp_id, parent).get(long.config_hash)
            if live is not None and live.data.params:
                break
            time.sleep(0.05)
        assert live is not None
        assert live.info.status == "RUNNING" and live.data.tags["memsweep.status"] == "running"
        assert live.data.params["config.lr"] == str(long.config["lr"])

        for step in range(1, 31):  # thirty evaluations in about three intervals: a few batches, not thirty
            tracker.trial_evaluated(long.config_hash, [evaluation(step)])
            time.sleep(INTERVAL / 10)
        deadline = time.monotonic() + 30
        while (
            len(client.get_metric_history(live.info.run_id, "val_loss")) < 10 and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        assert len(client.get_metric_history(live.info.run_id, "val_loss")) >= 10  # the curve grows live
        live_batches = tracker.calls["log_batch"] - 1  # but the short trial's one
        assert 2 <= live_batches <= 6, live_batches

        result = trainers.TrialResult(
            final_val_loss=0.5 / 30, steps=30, budget_steps=30, history=[evaluation(s) for s in range(1, 31)],
            recurrent_matrix=__import__("torch").eye(3),
        )  # fmt: skip
        row = ledger.finish_trial(long.id, result)
        tracker.log_trial(study, row, ledger.matrices(long.id), setter(long))
        tracker.flush()
    finally:
        tracker.close()

    runs = children(client, exp_id, parent)
    assert {h: r.info.status for h, r in runs.items()} == {
        long.config_hash: "FINISHED",
        short.config_hash: "FINISHED",
    }
    assert run_ids == {
        long.id: runs[long.config_hash].info.run_id,
        short.id: runs[short.config_hash].info.run_id,
    }
    for trial, steps in ((long, 30), (short, 2)):
        run = runs[trial.config_hash]
        curve = client.get_metric_history(run.info.run_id, "val_loss")
        assert sorted(m.step for m in curve) == list(range(1, steps + 1))  # every evaluation, once
        assert run.data.params["config.lr"] == str(trial.config["lr"])
        assert run.data.metrics["final_val_loss"] == pytest.approx(0.5 / steps)
        assert run.data.tags["memsweep.status"] == "done"
    assert [a.path for a in client.list_artifacts(runs[long.config_hash].info.run_id)] == [
        "recurrent_matrix.json"
    ]
    # the short trial: create, one batch (params, curve, results, tags), set_terminated; the long one
    # its live writes and then one batch, its matrix and its status
    assert tracker.calls["create_run"] == 2
    assert tracker.calls["set_terminated"] == 2
    assert tracker.calls["artifact"] == 1


def test_a_trial_stopped_before_its_end_ends_its_live_run_killed_with_the_reason(tmp_path, mlflow_uri):
    """Cancelled, or interrupted to run again: its live child run stayed RUNNING for ever, and MLflow's
    UI counted it running. It now gets its unsent curve, the reason, and ends KILLED."""
    _ledger, (trial, never) = two_trials(tmp_path)
    tracker = Tracker(mlflow_uri, "tracking-tests", live_interval=INTERVAL)
    exp_id, parent = tracker.start_study(trial.study_id, "s", {}, None)
    study = StudyContext(exp_id, parent, Criterion())
    try:
        tracker.trial_started(study, trial, lambda run_id: None)
        deadline = time.monotonic() + 30
        while (
            trial.config_hash not in children(tracker.client, exp_id, parent) and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        tracker.trial_started(study, never, lambda run_id: None)  # its run is due an interval from now
        tracker.trial_evaluated(trial.config_hash, [evaluation(1), evaluation(2)])
        tracker.trial_stopped(trial.config_hash, "cancelled", "the study was cancelled")
        tracker.trial_stopped(
            never.config_hash, "cancelled", "the study was cancelled"
        )  # stopped before its run was made
        tracker.flush()
    finally:
        tracker.close()
    runs = children(tracker.client, exp_id, parent)
    assert set(runs) == {trial.config_hash}
    run = runs[trial.config_hash]
    assert run.info.status == "KILLED"
    assert run.data.tags["memsweep.status"] == "cancelled"  # the ledger's word for it
    assert run.data.tags["memsweep.reason"] == "the study was cancelled"
    assert sorted(m.step for m in tracker.client.get_metric_history(run.info.run_id, "val_loss")) == [1, 2]


def test_a_run_a_dead_process_left_running_ends_killed_when_its_trial_starts_again(tmp_path, mlflow_uri):
    """A server SIGKILLed mid-study leaves its trials' child runs RUNNING; on resume each trial made a
    new one, and the UI showed two running runs per trial until the study ended. The earlier one now
    ends KILLED, pending with the reason, as the trial starts again; a run already ended is left alone."""
    ledger, (trial, other) = two_trials(tmp_path)
    crashed = Tracker(mlflow_uri, "tracking-tests", live_interval=0.0)
    exp_id, parent = crashed.start_study(trial.study_id, "s", {}, None)
    study = StudyContext(exp_id, parent, Criterion())
    for t in (trial, other):
        crashed.trial_started(study, t, lambda run_id, t=t: ledger.update_trial(t.id, mlflow_run_id=run_id))
        crashed.trial_evaluated(t.config_hash, [evaluation(1)])
    deadline = time.monotonic() + 30
    while len(children(crashed.client, exp_id, parent)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # both runs made (live)
    crashed.trial_stopped(other.config_hash, "cancelled", "the study was cancelled")  # ended: KILLED
    crashed.flush()
    crashed.close()  # and then the process dies: `trial`'s run stays RUNNING
    before = {h: r.info.status for h, r in children(crashed.client, exp_id, parent).items()}
    assert before == {trial.config_hash: "RUNNING", other.config_hash: "KILLED"}
    tracker = Tracker(mlflow_uri, "tracking-tests", live_interval=INTERVAL)
    try:
        for t in ledger.trials(trial.study_id):  # the resumed run starts both again
            assert t.mlflow_run_id is not None
            tracker.trial_started(study, t, lambda run_id: None)
        tracker.flush()
    finally:
        tracker.close()
    runs = {r.info.run_id: r for r in tracker.client.search_runs([exp_id])}
    earlier = runs[ledger.trial(trial.id).mlflow_run_id]
    assert earlier.info.status == "KILLED" and earlier.data.tags["memsweep.status"] == "pending"
    assert "died before it ended" in earlier.data.tags["memsweep.reason"]
    kept = runs[ledger.trial(other.id).mlflow_run_id]
    assert kept.data.tags["memsweep.status"] == "cancelled"  # its own end, not overwritten


def test_a_store_uri_keeps_the_artifacts_in_the_home_not_in_the_working_directory(tmp_path, monkeypatch):
    """With a database as the tracking URI (no server), MLflow put each experiment's artifacts in
    `./mlruns` of whichever process made it: a test's checkout, a Ray worker's session folder."""
    workdir, home = tmp_path / "cwd", tmp_path / "home" / "mlartifacts"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "store-tests", artifacts=home)
    try:
        _exp_id, parent = tracker.start_study("s1", "s", {}, None)
        tracker.client.log_text(parent, "kept", "note.txt")
    finally:
        tracker.close()
    assert list(home.rglob("note.txt")) and not list(workdir.iterdir())
    server = Tracker("http://127.0.0.1:1", "unused", artifacts=home)  # a server keeps its own artifacts
    assert server.artifacts is None
    server.close()


def test_a_parent_run_mlflow_refuses_is_not_left_running(tmp_path):
    """A spec MLflow refuses as params (a model named `lstm(64)`, taken before the door checked names)
    left a RUNNING parent run at each try: the engine's repair tries again every minute."""
    from mlflow.entities import ViewType
    from mlflow.exceptions import MlflowException

    from service.tracking.parent_run import create_parent

    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "refused", artifacts=tmp_path / "artifacts")
    try:
        exp_id = tracker.experiment_id()
        bad = {"space": {"models": {"lstm(64)": {"fixed": {"cell": "lstm"}}}}}
        for _ in range(2):
            with pytest.raises(MlflowException):
                create_parent(tracker.client, exp_id, "s1", "s", bad)
        runs = tracker.client.search_runs([exp_id], run_view_type=ViewType.ALL)
        assert runs and {(r.info.status, r.info.lifecycle_stage) for r in runs} == {("FAILED", "deleted")}
    finally:
        tracker.close()


def test_a_model_name_mlflow_cannot_hold_is_refused_at_the_door_and_a_stored_one_still_loads(tmp_path):
    from service.core.errors import StudyError
    from service.core.settings import Settings
    from service.core.spec import StudySpec
    from service.study.engine import Engine

    engine = Engine(Settings(home=tmp_path, mlflow_tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"))
    base = {"base": {"task": "addition", "seq_len": 20}}
    bad = StudySpec.model_validate({"space": {"models": {"lstm(64)": {"fixed": {"cell": "lstm"}}}}, **base})
    with pytest.raises(StudyError, match=r"model name 'lstm\(64\)': use letters.*e.g. 'lstm_64'"):
        engine.create_study(bad)
    assert engine.ledger.list_studies() == []
    engine.create_study(
        StudySpec.model_validate({"space": {"models": {"lstm-64.v2": {"fixed": {"cell": "lstm"}}}}, **base})
    )
    # a study stored before the rule still loads: read, resumed, synced (its spec is not refused)
    stored = engine.ledger.create_study("old", bad.model_dump(mode="json"), [])
    assert engine.ledger.study(stored.id).validated_spec().space is not None


def test_a_deleted_run_is_never_left_running(tmp_path, mlflow_uri):
    """The engine deletes a child run an outage left incomplete (and makes it again whole): deleted, it
    is ended KILLED first, so a restored one is not counted as running; a finished one keeps its status."""
    _ledger, (trial, _) = two_trials(tmp_path)
    tracker = Tracker(mlflow_uri, "tracking-tests")
    exp_id, parent = tracker.start_study(trial.study_id, "s", {}, None)
    incomplete = tracker.client.create_run(exp_id, tags={"mlflow.parentRunId": parent}).info.run_id
    finished = tracker.client.create_run(exp_id, tags={"mlflow.parentRunId": parent}).info.run_id
    tracker.client.set_terminated(finished, status="FINISHED")
    for run_id in (incomplete, finished):
        tracker.delete_run(run_id)
    gone = {r: tracker.client.get_run(r).info for r in (incomplete, finished)}
    assert {r: i.lifecycle_stage for r, i in gone.items()} == {incomplete: "deleted", finished: "deleted"}
    assert gone[incomplete].status == "KILLED" and gone[finished].status == "FINISHED"
    assert tracker.client.get_run(incomplete).data.tags["memsweep.replaced"].startswith("incomplete")


def test_the_ui_links_open_the_model_training_view():
    """MLflow 3's UI picks its view from the link's `workflowType` (else a browser's stored choice, else
    GenAI): every link memsweep hands out names the model-training view."""
    from service.tracking.links import MlflowLinks, ui_link

    ui = "http://127.0.0.1:5005/"
    assert ui_link(ui, "1") == "http://127.0.0.1:5005/#/experiments/1/runs?workflowType=machine_learning"
    assert ui_link(ui, "1", "ab12") == (
        "http://127.0.0.1:5005/#/experiments/1/runs/ab12?workflowType=machine_learning"
    )
    links = MlflowLinks.at(ui, "1", "ab12")
    assert (links.experiment_url, links.run_url) == (ui_link(ui, "1"), ui_link(ui, "1", "ab12"))
    assert MlflowLinks.at(ui, "1", None).run_url is None
    assert MlflowLinks.at(None, "1", "ab12").model_dump() == {
        "experiment_id": "1", "run_id": "ab12", "experiment_url": None, "run_url": None,
    }  # fmt: skip
    assert MlflowLinks.model_validate_json(links.model_dump_json()) == links


@pytest.mark.slow
def test_each_home_has_its_own_local_mlflow_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server another home left on the configured port is not this home's: its runs would have gone
    to that home's store without a word. This home's starts on the next free port, on its own store,
    and each home finds its own again. A server outlives the process that started it: it carries none
    of memsweep's settings (the API token was in its environment), and that process keeps no handle on
    its log."""
    import contextlib
    import os
    import signal

    from service.cli.servers import free_port
    from service.tracking.server import ensure_mlflow_server, recorded_server, server_healthy

    port = free_port()
    first, second = tmp_path / "first", tmp_path / "second"
    monkeypatch.setenv("MEMSWEEP_API_TOKEN", "secret-of-the-api")
    try:
        uri1 = ensure_mlflow_server(None, first, port)
        assert uri1 == f"http://127.0.0.1:{port}"
        environ = Path(f"/proc/{(first / 'mlflow' / 'mlflow-server.pid').read_text()}/environ").read_bytes()
        assert b"secret-of-the-api" not in environ and b"MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false" in environ
        opened = []
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed since
                opened.append(os.readlink(f"/proc/self/fd/{fd}"))
        assert opened and not [path for path in opened if path.endswith("mlflow-server.log")]
        uri2 = ensure_mlflow_server(None, second, port)
        assert uri2 != uri1 and server_healthy(uri2)
        assert (second / "mlflow" / "mlflow.db").exists()
        own = recorded_server(first / "mlflow")
        assert own is not None and ensure_mlflow_server(None, first, port) == uri1 == own[1]
        assert ensure_mlflow_server(None, second, port) == uri2
        assert ensure_mlflow_server("http://elsewhere:5000", second, port) == "http://elsewhere:5000"
    finally:
        for home in (first, second):
            pidfile = home / "mlflow" / "mlflow-server.pid"
            if pidfile.exists():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(int(pidfile.read_text()), signal.SIGTERM)


FAKE_SERVER = """
import http.server, sys
answer = sys.argv[1] == "answers"
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if answer:
            self.send_response(200); self.end_headers(); self.wfile.write(b"OK")
    def log_message(self, *args):
        pass
port = int(sys.argv[sys.argv.index("--port") + 1])
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


@pytest.mark.slow
def test_a_homes_own_server_is_found_by_its_process_and_a_hung_one_is_replaced(tmp_path: Path, monkeypatch):
    """This home's server, recorded by an older memsweep (a pid file, no URI file), is found by its
    command line and kept, not doubled by a second server on the same store; one that runs but never
    answers is stopped after its patience and replaced on its own port (the port running studies write
    to)."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys

    import service.tracking.server as server
    from service.cli.servers import free_port

    folder = tmp_path / "home" / "mlflow"
    folder.mkdir(parents=True)
    port = free_port()

    def fake(mode: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-c", FAKE_SERVER, mode, "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
                "--port", str(port)]  # fmt: skip
        proc = subprocess.Popen(argv, start_new_session=True)
        (folder / "mlflow-server.pid").write_text(str(proc.pid))
        deadline = time.monotonic() + 30
        while server.next_free_port(port) == port:  # until it listens
            assert time.monotonic() < deadline
            time.sleep(0.1)
        return proc

    started = []
    real_start = server.start_mlflow_server
    monkeypatch.setattr(
        server, "start_mlflow_server", lambda *a, **k: started.append(a) or real_start(*a, **k)
    )
    legacy = fake("answers")
    try:
        uri = server.ensure_mlflow_server(None, tmp_path / "home", free_port())  # another configured port
        assert uri == f"http://127.0.0.1:{port}" and started == []
    finally:
        server.stop_mlflow_server(legacy)
    hung = fake("hangs")
    monkeypatch.setattr(server, "OWN_SERVER_PATIENCE", 1.0)
    try:
        uri = server.ensure_mlflow_server(None, tmp_path / "home", free_port())
        assert hung.wait(timeout=30) is not None  # stopped
        assert uri == f"http://127.0.0.1:{port}" and server.server_healthy(uri) and len(started) == 1
        assert int((folder / "mlflow-server.pid").read_text()) != hung.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int((folder / "mlflow-server.pid").read_text()), signal.SIGTERM)


def test_the_parent_runs_best_config_names_its_model(tmp_path):
    """`memsweep.best_config` held the best point's params alone: of a study of several models it gave a
    config without saying of which model (chain and orth share their `lr`)."""
    import json

    from service.core.spec import StudySpec
    from service.reports.study_summary import summarise
    from service.study.search import grid_trials
    from service.tracking.parent_run import write_summary

    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    spec = StudySpec.model_validate(
        {"space": {"models": {"chain": {"fixed": {"init": "chain"}, "dims": {"lr": [1e-3]}},
                              "orth": {"fixed": {"init": "orthogonal"}, "dims": {"lr": [1e-3]}}}},
         "base": {"task": "addition", "seq_len": 20}}
    )  # fmt: skip
    study = ledger.create_study("two models", spec.model_dump(mode="json"))
    ledger.add_trials(study.id, grid_trials(spec.search_space(), {}))
    for t in ledger.trials(study.id):
        loss = 0.01 if t.model == "orth" else 0.1
        ledger.start_trial(study.id, t.config_hash)
        ledger.finish_trial(t.id, trainers.TrialResult(final_val_loss=loss, baseline_loss=1 / 6))
    summary = summarise(ledger, ledger.study(study.id))
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "tags", artifacts=tmp_path / "artifacts")
    try:
        _, parent = tracker.start_study(study.id, study.name, {}, None)
        write_summary(tracker.client, parent, summary, {}, "FINISHED")
        tags = tracker.client.get_run(parent).data.tags
    finally:
        tracker.close()
    assert json.loads(tags["memsweep.best_config"]) == {"model": "orth", "params": {"lr": 0.001}}


# MLflow's settings are a process's, set once at its start (`prepare_mlflow_process`, by each entry point):
# building a `Tracker` leaves the environment alone, and a server or a command still gives up on a tracking
# server that is down within seconds, unless MLFLOW_HTTP_* say otherwise.


MLFLOW_SETTINGS = ("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", *MLFLOW_FAIL_FAST)


def test_a_tracker_leaves_the_environment_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from service.tracking.tracker import Tracker

    for name in MLFLOW_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    before = dict(os.environ)
    Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "seams", artifacts=tmp_path / "artifacts")
    assert dict(os.environ) == before


def settings_at_start(entry: str, **env: str) -> list[str]:
    """The MLflow settings of a fresh process once an entry point ran: `memsweep`'s main (a command
    that tracks nothing), or the app made without the CLI."""
    start = {
        "main": "from service.cli.commands import main; main(['presets'])",
        "app": "from service.api.app import create_app; create_app()",
    }[entry]
    code = (
        f"import os, sys; {start}; print(*(os.environ.get(n) for n in {MLFLOW_SETTINGS!r}), file=sys.stderr)"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_", "MEMSWEEP_"))}
    done = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stderr.strip().splitlines()[-1].split()


@pytest.mark.parametrize("entry", ["main", "app"])
def test_every_entry_point_sets_mlflows_fail_fast_settings_and_explicit_ones_win(entry: str, tmp_path: Path):
    home = {"MEMSWEEP_HOME": str(tmp_path)}
    assert settings_at_start(entry, **home) == ["true", "3", "1", "30"]
    assert settings_at_start(entry, MLFLOW_HTTP_REQUEST_MAX_RETRIES="7", **home) == ["true", "7", "1", "30"]
