"""Plugins in the service (issue 38): a plugin cell swept beside a preset's models over REST on the real
Ray and MLflow, trained again when its version changes; `memsweep plugins` and its check; a study refused
at the door when a plugin breaks its contract or a cluster's nodes disagree on its version. The plugins
are distributions made on disk (`tests.plugin_dists`), seen by the processes that are given their folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from service.api.schemas import PluginPublic
from service.client import MemsweepAPIError, MemsweepClient
from service.core.errors import StudyError
from service.core.spec import StudySpec
from service.store.ledger import Ledger
from service.study.search import grid_trials, study_space
from tests.plugin_dists import EXAMPLES, env_with, install, memsweep, run_python, toy_dist, write_dist
from tests.service.cluster import ray_head, ray_node
from tests.service.servers import Server

TOKEN = "plugins-e2e-1b2c"
#: Orhan & Pitkow's addition preset cut to seconds a trial
CUT = {"seq_len": 20, "n_train": 64, "n_val": 32, "hidden": 16, "steps": 40, "eval_every": 20}


def cut_preset(models: list[str], **kw: object) -> dict[str, object]:
    spec: dict[str, object] = {
        "name": "plugin-vs-papers",
        "preset": "orhan2020-addition750",
        "models": models,
        "base": CUT,
        "dims": {"lr": [1e-3], "scale": [1.0]},
        "seeds": [1, 2],
        "success_threshold": 1 / 3,  # loose (2 × the baseline 1/6): some trials succeed in 40 steps
    }
    spec.update(kw)
    return spec


def test_a_cell_beside_a_presets_models_runs_on_its_protocol_and_the_presets_trials_do_not_change():
    """`models: [chain, orthogonal, lstm]`: the preset's two models exactly as alone (same trials, same
    hashes: their runs are shared), and an lstm arm on the preset's learning rates, seeds and budget, its
    cell's own settings only (the preset's `nonlinearity` is the rnn's)."""
    alone = StudySpec.model_validate(cut_preset(["chain", "orthogonal"]))
    two_lrs = {"lr": [1e-3, 3e-4], "scale": [1.0]}
    mixed = StudySpec.model_validate(cut_preset(["chain", "orthogonal", "lstm"], dims=two_lrs))
    space = study_space(mixed, 10_000)
    lstm = space.model("lstm")
    assert lstm.fixed == {"cell": "lstm"} and set(lstm.dims) == {"lr"}
    assert lstm.dims["lr"].values == (1e-3, 3e-4)  # the study's override of the preset's shared axis
    trials = grid_trials(space, {})
    by_model = {m: [t for t in trials if t.model == m] for m in ("chain", "orthogonal", "lstm")}
    assert len(by_model["lstm"]) == 4  # 2 learning rates × 2 seeds
    for t in by_model["lstm"]:
        assert t.config["cell"] == "lstm" and t.config["hidden"] == 16 and t.config["steps"] == 40
        assert t.config["task_params"]["seq_len"] == 20 and t.config["batch_size"] == 16
    alone_space = study_space(alone.model_copy(update={"dims": two_lrs}), 10_000)
    assert sorted(t.config_hash for t in grid_trials(alone_space, {})) == sorted(
        t.config_hash for m in ("chain", "orthogonal") for t in by_model[m]
    )
    with pytest.raises(
        ValueError, match=r"'nope' is no model of preset 'orhan2020-addition750'.*valid cells: "
    ):
        StudySpec.model_validate(cut_preset(["chain", "nope"])).search_space()
    # the cell alone, none of the preset's models: the same arm (before, the preset's `nonlinearity`
    # stayed in its settings and every trial was refused: "unknown config field 'nonlinearity'")
    only_lstm = StudySpec.model_validate(cut_preset(["lstm"], dims={"lr": [1e-3, 3e-4]}))
    only = grid_trials(study_space(only_lstm, 10_000), {})
    assert sorted(t.config_hash for t in only) == sorted(t.config_hash for t in by_model["lstm"])


def test_a_study_sweeps_a_setting_of_an_added_cells_arm_that_its_grid_does_not_list():
    """`dims: {forget_bias: [0, 1]}` beside an Orhan preset's models and an lstm arm: the arm sweeps it,
    the preset's models (whose cell has no such setting) are as alone. It was refused ("not a dimension
    of space"), and the fix the message gave, `base`, sweeps nothing."""
    dims = {"lr": [1e-3], "scale": [1.0], "forget_bias": [0.0, 1.0]}
    space = study_space(StudySpec.model_validate(cut_preset(["chain", "lstm"], dims=dims)), 10_000)
    assert space.model("lstm").dims["forget_bias"].values == (0.0, 1.0)
    assert "forget_bias" not in space.model("chain").dims
    trials = grid_trials(space, {})
    lstm = sorted((t.params["forget_bias"], t.params["seed"]) for t in trials if t.model == "lstm")
    assert lstm == [(0.0, 1), (0.0, 2), (1.0, 1), (1.0, 2)]
    assert {t.config["cell_params"]["forget_bias"] for t in trials if t.model == "lstm"} == {0.0, 1.0}
    alone = study_space(StudySpec.model_validate(cut_preset(["chain"])), 10_000)
    assert sorted(t.config_hash for t in trials if t.model == "chain") == sorted(
        t.config_hash for t in grid_trials(alone, {})
    )
    with pytest.raises(Exception, match=r"cannot override \['no_such_setting'\]"):
        study_space(
            StudySpec.model_validate(cut_preset(["chain", "lstm"], dims={**dims, "no_such_setting": [1]})),
            10_000,
        )


def test_memsweep_plugins_lists_them_and_its_check_names_what_is_broken(tmp_path: Path):
    """A cell that loads but breaks its contract was listed `ready` (exit 0), and every study of it was
    then refused at the door: it is listed as breaking it, with the first problem, and the listing exits 1
    (`EXIT_STATUSES`: a plugin breaks its contract)."""
    good = toy_dist(tmp_path / "good", "1.0")
    bad = toy_dist(tmp_path / "bad", "0.9", name="toy-nan", extra_forward="out = out * float('nan')")
    listed = memsweep("plugins", "--json", paths=(good, bad))
    assert listed.returncode == 1, listed.stderr[-2000:]
    names = {p["name"]: p for p in json.loads(listed.stdout)["server"]}
    assert set(names) == {"toy", "toy-nan"} and names["toy"]["version"] == "1.0"
    assert names["toy"]["contract"] == [] and names["toy-nan"]["problem"] is None
    assert names["toy-nan"]["contract"][0].startswith("loss: on task 'addition': the initial loss is nan")
    assert PluginPublic.model_validate(names["toy-nan"]).contract == names["toy-nan"]["contract"]
    shown = memsweep("plugins", paths=(good, bad), environ={"COLUMNS": "400"})
    assert shown.returncode == 1, shown.stderr[-2000:]
    rows = {
        line.split("│")[2].strip(): line.split("│")[6].strip()
        for line in shown.stdout.splitlines()
        if "│ cell" in line
    }
    assert rows["toy"] == "ready"
    assert rows["toy-nan"].startswith(
        "breaks its contract: loss: on task 'addition': the initial loss is nan"
    )
    assert rows["toy-nan"].endswith("more: `memsweep plugins check toy-nan`)")
    assert memsweep("plugins", paths=(good,)).returncode == 0  # every one ready
    assert memsweep("plugins", "check", "toy", paths=(good, bad)).returncode == 0
    checked = memsweep("plugins", "check", paths=(good, bad))
    assert checked.returncode == 1
    assert "cell 'toy' (memsweep-toy==1.0+" in checked.stdout and "holds its contract" in checked.stdout
    assert "cell 'toy-nan'" in checked.stdout and "loss: on task 'addition'" in checked.stdout
    missing = memsweep("plugins", "check", "other", paths=(good,))
    assert missing.returncode == 2 and "no plugin 'other'; installed: cell:toy" in missing.stderr


def test_the_contract_check_runs_memsweeps_code_whatever_the_working_directory_holds(tmp_path: Path):
    """`python -m service.cli plugins check` put the working directory first on its path: a server
    started beside a `service.py` or `trainers.py` of the user's refused every plugin study with
    "the contract check crashed", naming the plugin."""
    for name in ("service", "trainers"):
        (tmp_path / f"{name}.py").write_text("shadow = True\n")
    code = "from service.study.plugins import run_check; import json; print(json.dumps(run_check(['nonesuch'], 120)))"
    # -P as a console script (`memsweep serve`) runs: the working directory is not on the server's path
    done = subprocess.run([sys.executable, "-P", "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    (problem,) = json.loads(done.stdout.strip().splitlines()[-1])["nonesuch"]
    assert "no plugin 'nonesuch'" in problem and "ModuleNotFoundError" not in problem, problem


@pytest.mark.slow
def test_a_study_every_trial_of_which_raised_says_so_and_exits_1(tmp_path: Path, mlflow_uri: str):
    """A cell that holds its contract (short sequences) but raises on the study's: every trial failed by
    an exception, not by the protocol's rule (a loss not finite). `memsweep run` exited 0 with a 0 % rate
    and an interval, as if the cell had been tried; it says the rates count those runs as failures, and
    exits 1: the study has no result."""
    crash = toy_dist(
        tmp_path / "crash", "0.9", name="toy-crash",
        extra_forward="if x.shape[0] > 40: raise RuntimeError('toy-crash: too long')",
    )  # fmt: skip
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(cut_preset(["toy-crash"], base={**CUT, "seq_len": 60}, dims={"lr": [1e-3]})))
    environ = {"MEMSWEEP_HOME": str(tmp_path / "home"), "MEMSWEEP_MLFLOW_TRACKING_URI": mlflow_uri}
    done = memsweep("run", str(spec), paths=(crash,), environ=environ, timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]
    n = 4  # the toy cell's grid (gain 0.5, 0.9) × seeds 1, 2
    assert f"{n} × RuntimeError: toy-crash: too long" in done.stdout
    assert f"{n} of them raised an exception, not the protocol's failure" in done.stdout
    assert (
        "every trial of study" in done.stderr
        and "raised an exception (above): it has no result" in done.stderr
    )


def test_the_door_names_a_plugin_that_breaks_its_contract_once_before_its_problems(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cell whose states have the wrong shape breaks four checks (its shapes, and what they leave
    unchecked, on addition and on copy): the door's refusal named its identity before each of the four."""
    from service.study import plugins as door

    ident = "memsweep-toy==1.0+585fad0b542d14ef"
    found = [
        "shapes: on task 'addition': states of shape (20, 4, 11) for inputs (20, 4, 2)",
        "not checked: loss, gradient, batch on task 'addition': they need states of the contract's shape",
        "shapes: on task 'copy': states of shape (30, 4, 11) for inputs (30, 4, 10)",
        "not checked: loss, gradient, batch on task 'copy': they need states of the contract's shape",
    ]
    monkeypatch.setattr(
        door, "used", lambda space: {("cell", "toy"): ident, ("cell", "fine"): "memsweep-fine==2"}
    )
    monkeypatch.setattr(door.plugins, "edited", lambda kind, name: None)
    monkeypatch.setattr(door, "_child_check", lambda names, timeout: {"cell:toy": found, "cell:fine": []})
    monkeypatch.setattr(door, "_CHECKED", {})
    with pytest.raises(StudyError) as refused:
        door.admit_plugins(None)  # type: ignore[arg-type]  # (`used`, above, reads no space)
    said = str(refused.value)
    assert said == (
        f"a plugin this study uses breaks its contract, so no trial runs: cell 'toy' ({ident}): "
        + "; ".join(found)
        + ". Fix the plugin (`memsweep plugins check` runs the same checks; docs/plugins.md) and submit again"
    )


@pytest.mark.slow
def test_a_study_with_a_plugin_that_breaks_its_contract_is_refused_and_records_nothing(tmp_path: Path):
    bad = toy_dist(tmp_path / "bad", "0.9", name="toy-nan", extra_forward="out = out * float('nan')")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(cut_preset(["chain", "toy-nan"])))
    home = tmp_path / "home"
    for command in ("plan", "run"):  # a plan said it would run the trials the door then refused
        done = memsweep(command, str(spec), paths=(bad,), environ={"MEMSWEEP_HOME": str(home)})
        assert done.returncode == 2, done.stderr[-2000:]  # refused before anything ran (plan exited 1)
        assert "a plugin this study uses breaks its contract, so no trial runs" in done.stderr
        assert "cell 'toy-nan' (memsweep-toy-nan==0.9+" in done.stderr and "not finite" in done.stderr
        assert done.stderr.count("memsweep-toy-nan==0.9+") == 1  # named once, before all its problems
    assert Ledger(f"sqlite:///{home / 'ledger.db'}").list_studies() == []


EDITED = """
import dataclasses, json, pathlib
from service.core.errors import StudyError
from service.core.spec import StudySpec
from service.study.plugins import admit_plugins
from service.study.search import grid_trials, study_space
from service.study.worker import OtherCodeError, check_code
from trainers import plugins

spec = StudySpec.model_validate({{"base": {{"task": "addition", "cell": "toy", "seq_len": 10, "n_train": 32,
                                 "n_val": 16, "hidden": 8, "steps": 4}}, "space": {{"dims": {{"lr": [1e-3]}}}},
                                 "seeds": [1]}})
space = study_space(spec, 100)
(trial,) = grid_trials(space, {{}})
out = {{"before": plugins.edited("cell", "toy")}}
source = pathlib.Path({source!r})
source.write_text(source.read_text() + "\\n# edited after the server loaded it\\n")
out["after"] = plugins.edited("cell", "toy")
out["listed"] = [p.to_dict()["edited"] for p in plugins.installed() if p.name == "toy"]
try:
    admit_plugins(space)
    out["door"] = None
except StudyError as exc:
    out["door"] = str(exc)
try:  # a worker that loaded the edited code: its hash of the trial is not the planned one
    check_code([dataclasses.replace(trial, config_hash="0" * 16)], "elsewhere")
    out["worker"] = None
except OtherCodeError as exc:
    out["worker"] = str(exc)
check_code([trial], "here")  # the planned code: trains
print(json.dumps(out))
"""


def test_a_plugin_whose_check_crashes_does_not_stand_for_the_others_and_is_checked_again(monkeypatch):
    """The listing (`GET /plugins`, `memsweep plugins`) checks every installed plugin in one child: one that
    takes the child down (an `os._exit` in its forward) gave every other plugin its crash, and the
    cache kept it, so the door refused their studies until the server restarted. A crashed or hung
    check is now retried plugin by plugin, and not kept."""
    from service.study import plugins as door

    calls: list[list[str]] = []

    def child(names, timeout):
        calls.append(list(names))
        if "cell:crash" in names:
            return "the contract check crashed (exit 3): no output"
        return {n: [] for n in names}

    monkeypatch.setattr(door, "_child_check", child)
    monkeypatch.setattr(door, "_CHECKED", {})
    wanted = {("cell", "toy"): "memsweep-toy==1", ("cell", "crash"): "memsweep-crash==1"}
    found = door.check_contracts(wanted)
    assert found == {
        ("cell", "toy"): [],
        ("cell", "crash"): ["the contract check crashed (exit 3): no output"],
    }
    assert calls == [["cell:toy", "cell:crash"], ["cell:toy"], ["cell:crash"]]
    calls.clear()
    assert door.check_contracts({("cell", "toy"): "memsweep-toy==1"}) == {("cell", "toy"): []}
    assert calls == []  # the good one's result is kept
    door.check_contracts({("cell", "crash"): "memsweep-crash==1"})
    assert calls == [["cell:crash"]]  # the crash was not: checked again


def test_a_plugin_edited_after_the_server_loaded_it_is_refused_at_the_door_and_by_the_worker(tmp_path: Path):
    """A plugin edited under a running `memsweep serve`: the server hashed trials with the code it had
    loaded and its workers trained the code on disk, so a new result was stored under the old code's
    hash (and the node check said "the same plugins"). Now the door refuses the study, and a worker
    whose code hashes a trial otherwise than it was planned trains none of it."""
    dist = toy_dist(tmp_path / "site", "1.0")
    out = run_python(EDITED.format(source=str(dist / "memsweep_toy" / "__init__.py")), dist)
    assert out["before"] is None
    assert out["after"].startswith("the cell plugin 'toy' changed on disk since this process loaded it")
    assert "memsweep-toy==1.0+" in out["after"] and out["listed"] == [out["after"]]  # GET /plugins said ready
    assert out["door"].startswith(out["after"]) and "Restart `memsweep serve`" in out["door"]
    assert out["worker"].startswith("other code on node elsewhere than the study was planned with")
    assert (
        "trial 0000000000000000 hashes to" in out["worker"] and "plugins memsweep-toy==1.0+" in out["worker"]
    )


@pytest.mark.slow
def test_a_plugin_a_node_cannot_import_is_named_with_its_error_not_as_missing(tmp_path: Path):
    """A node whose copy of a plugin fails to import (a library it lacks) listed it as missing: the
    refusal said to install it, and the import error was nowhere. A node says why now."""
    from service.study.plugins import version_mismatch

    broken = write_dist(
        tmp_path / "broken", "memsweep-broken", "1.0", {"memsweep.cells": {"broken": "memsweep_broken:Cell"}},
        {"memsweep_broken/__init__.py": "raise ImportError('broken needs libfoo, which this node lacks')\n"},
    )  # fmt: skip
    there = run_python(
        "import json; from service.study.plugins import installed_here; print(json.dumps(installed_here()))",
        broken,
    )
    assert isinstance(there, dict) and list(there) == ["cell:broken"]
    assert there["cell:broken"].startswith("unusable (") and "broken needs libfoo" in there["cell:broken"]
    said = version_mismatch({("cell", "broken"): "memsweep-broken==1.0+abc"}, {"10.0.0.2 (ab12cd34)": there})
    assert said is not None and "node 10.0.0.2 (ab12cd34) has unusable (" in said and "libfoo" in said


def test_a_unit_whose_worker_fails_to_start_says_why_not_that_its_node_died(tmp_path: Path) -> None:
    """A node that cannot import a plugin fails the unit's Ray worker as it starts: the members' reason
    read "the worker process or its node died", the cause only in the server's log (Tune's
    `Trial.get_error` reads the trial's storage, synced later). It is read from what Tune has just
    written on this machine."""
    from types import SimpleNamespace

    from ray import cloudpickle
    from ray.exceptions import RaySystemError

    from service.study.ray_tune import error_summary

    pickled = tmp_path / "error.pkl"
    with open(pickled, "wb") as f:
        cloudpickle.dump(RaySystemError("gelman needs libfoo, which this node lacks"), f)
    trial = SimpleNamespace(pickled_error_file=str(pickled), error_file=None, get_error=lambda: None)
    assert error_summary(trial) == "RaySystemError: System error: gelman needs libfoo, which this node lacks"
    text = tmp_path / "error.txt"
    text.write_text(
        "Failure # 1 (occurred at 2026-12-06)\nray::ImplicitFunc.__init__()\n  File x\nImportError: no libfoo\n"
    )
    trial = SimpleNamespace(pickled_error_file=None, error_file=str(text), get_error=lambda: None)
    assert error_summary(trial) == "ImportError: no libfoo"
    unreadable = tmp_path / "unreadable.pkl"  # an error class the driver cannot import: its text then
    unreadable.write_bytes(b"not a pickle")
    trial = SimpleNamespace(pickled_error_file=str(unreadable), error_file=str(text), get_error=lambda: None)
    assert error_summary(trial) == "ImportError: no libfoo"
    gone = SimpleNamespace(pickled_error_file=None, error_file=None, get_error=lambda: None)
    assert error_summary(gone) == "the worker process or its node died"


def test_when_every_node_has_one_other_version_the_refusal_says_the_server_may_be_the_one_behind():
    """A plugin installed again after the server started: every node has the new version, the server
    planned with the old one, and the refusal said only to install the same version on every node."""
    from service.study.plugins import UNANSWERED, version_mismatch

    wanted = {("cell", "gelman"): "memsweep-gelman==0.1+aaa"}
    both_new = {
        "n1": {"cell:gelman": "memsweep-gelman==0.2+bbb"},
        "n2": {"cell:gelman": "memsweep-gelman==0.2+bbb"},
    }
    said = version_mismatch(wanted, both_new)
    assert said is not None and "node n1 has memsweep-gelman==0.2+bbb" in said
    assert "this server loaded another: restart `memsweep serve`" in said
    one_lags = {
        "n1": {"cell:gelman": "memsweep-gelman==0.1+aaa"},
        "n2": {"cell:gelman": "memsweep-gelman==0.2+bbb"},
    }
    said = version_mismatch(wanted, one_lags)
    assert said is not None and "node n2 has" in said and "restart" not in said  # that node is the odd one
    assert version_mismatch(wanted, {"n1": {"cell:gelman": "memsweep-gelman==0.1+aaa"}}) is None
    # a node that is alive and did not answer may hold another version: refused, not let through
    silent = {"n1": {"cell:gelman": "memsweep-gelman==0.1+aaa"}, "n2": {UNANSWERED: "GetTimeoutError"}}
    said = version_mismatch(wanted, silent)
    assert said is not None and "node n2 did not say which plugins it has (GetTimeoutError)" in said


def test_a_node_that_is_gone_when_asked_for_its_plugins_is_left_out(engine, monkeypatch) -> None:
    """A node Ray still counts alive for some seconds after it died: its inventory task cannot be
    placed (TaskUnschedulableError), and every plugin listing and every study using a plugin failed
    (a 500, a failed study) until Ray noticed. It is left out now; the nodes that answer are listed."""
    import ray

    from service.study import nodes

    engine.executor.start()
    real = [n for n in ray.nodes() if n.get("Alive")]
    ghost = {**real[0], "NodeID": "ab" * 28, "NodeManagerAddress": "192.0.2.9"}
    monkeypatch.setattr(ray, "nodes", lambda: [*real, ghost])
    found = nodes.node_plugins(timeout=60)
    assert [node.split(" ")[0] for node in found] == [n["NodeManagerAddress"] for n in real]
    assert all(isinstance(there, dict) for there in found.values())


def test_a_cluster_whose_nodes_differ_in_a_plugins_version_is_refused_naming_the_node(tmp_path: Path):
    """A head with version 1.0 of the plugin and a second node with 2.0 (each node's Ray workers import
    what that node has installed): a study that uses the plugin is refused before anything is recorded."""
    v1, v2 = toy_dist(tmp_path / "v1", "1.0"), toy_dist(tmp_path / "v2", "2.0")
    with ray_head(tmp_path, "--num-cpus=1", environ=env_with(v1)) as (env, port):  # noqa: SIM117
        with ray_node({**env, "PYTHONPATH": env_with(v2)["PYTHONPATH"]}, port, "--num-cpus=1"):
            spec = tmp_path / "spec.json"
            spec.write_text(json.dumps(cut_preset(["chain", "toy"])))
            home = tmp_path / "home"
            ray_env = {k: env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
            done = memsweep("run", str(spec), paths=(v1,), timeout=600,
                            environ={**ray_env, "MEMSWEEP_HOME": str(home), "MEMSWEEP_RAY_ADDRESS": f"127.0.0.1:{port}"})  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert "every node that may run a trial needs the same version of each plugin" in done.stderr
    assert (
        "has memsweep-toy==2.0+" in done.stderr
        and "for cell 'toy', this server memsweep-toy==1.0+" in done.stderr
    )
    assert Ledger(f"sqlite:///{home / 'ledger.db'}").list_studies() == []


@pytest.mark.slow
def test_a_plugin_cell_is_swept_against_the_papers_cells_over_rest_and_retrained_when_its_version_changes(
    tmp_path: Path, mlflow_uri: str
):
    """The issue's user story: the example IndRNN cell (examples/indrnn, with its fused form) installed
    beside chain and orthogonal on a cut Orhan preset, over REST on the real Ray and MLflow: the plan says
    which arms train in bundles, the success table, the comparison and the MLflow parent run show all
    three. The server restarted with another version of the plugin trains the plugin's trials again and
    reuses the papers' cells' runs."""
    v1 = install(tmp_path / "v1", EXAMPLES / "indrnn")
    v2 = install(tmp_path / "v2", EXAMPLES / "indrnn", version="0.1.1")
    bad = toy_dist(tmp_path / "bad", "0.9", name="toy-nan", extra_forward="out = out * float('nan')")
    home = tmp_path / "home"
    spec = cut_preset(["chain", "orthogonal", "indrnn"], bundle_size=2)  # bundles of 2, not 2 slots of 1
    studies = []
    for version, folder in (("0.1.0", v1), ("0.1.1", v2)):
        server = Server(home, mlflow_uri, token=TOKEN, environ=env_with(folder, bad)).start()
        try:
            with MemsweepClient(server.url, token=TOKEN) as client:
                listing = client.plugins()
                assert [(p["name"], p["version"]) for p in listing["server"]] == [
                    ("indrnn", version),
                    ("toy-nan", "0.9"),
                ]
                # an embedded Ray's one node is this machine: its workers load the server's plugins (a
                # cluster's nodes are listed: tests/compose/test_stack.py)
                assert listing["nodes"] is None
                shown = memsweep(
                    "plugins", "--url", server.url, environ={"MEMSWEEP_API_TOKEN": TOKEN, "COLUMNS": "400"}
                )
                assert (  # toy-nan breaks its contract: listed so, by the server's checks (exit 1)
                    shown.returncode == 1
                    and "embedded Ray's workers load the server's own" in shown.stdout
                    and "breaks its contract: loss: on task 'addition'" in shown.stdout
                ), shown.stdout + shown.stderr
                if version == "0.1.0":  # a plugin that breaks its contract: a 422, nothing made
                    with pytest.raises(MemsweepAPIError) as refused:
                        client.submit(cut_preset(["chain", "toy-nan"]))
                    assert refused.value.status == 422 and "cell 'toy-nan'" in str(refused.value.detail)
                    assert client.studies() == []
                plan = client.plan(spec)["by_model"]
                assert plan["indrnn"]["trials"] == plan["chain"]["trials"] == 2  # the preset's lr × 2 seeds
                assert plan["indrnn"]["to_run"] == 2 and plan["indrnn"]["fused"]  # its fused form: in bundles
                if version == "0.1.0":
                    assert plan["chain"]["to_run"] == 2 and plan["chain"]["fused"]
                else:  # the papers' cells' runs are reused; only the plugin's new version trains
                    assert plan["chain"]["to_run"] == plan["orthogonal"]["to_run"] == 0
                study = client.submit(spec)
                final = client.wait(study["id"], poll=0.5, timeout=600, progress=False)
                assert final["state"] == "done", final
                studies.append((final, client.trials(study["id"]), client.success(study["id"])))
                if version == "0.1.1":
                    compared = client.comparison([studies[0][0]["id"], study["id"]])
        finally:
            server.stop()
    (first, trials1, success1), (_, trials2, success2) = studies
    for success in (success1, success2):
        assert set(success["by_model"]) == {"chain", "orthogonal", "indrnn"}
        for cell in success["by_model"].values():
            assert cell["trials"] == 2 and 0 <= cell["ci95"][0] <= cell["rate"] <= cell["ci95"][1] <= 1, (
                success
            )
    ours1 = {t["config_hash"] for t in trials1 if t["model"] == "indrnn"}
    ours2 = {t["config_hash"] for t in trials2 if t["model"] == "indrnn"}
    assert len(ours1) == len(ours2) == 2 and not ours1 & ours2  # another version: other trials
    assert all(t["runs"] == 1 and t["reused_from"] is None for t in trials2 if t["model"] == "indrnn")
    papers = [t for t in trials2 if t["model"] != "indrnn"]
    assert len(papers) == 4 and all(t["runs"] == 0 and t["reused_from"] is not None for t in papers)
    for trials, version in ((trials1, "0.1.0"), (trials2, "0.1.1")):
        assert all(
            t["provenance"]["plugin.cell"].startswith(f"memsweep-indrnn=={version}+")
            for t in trials
            if t["model"] == "indrnn"
        )
    assert any(
        n.startswith("the cell indrnn (plugin memsweep-indrnn) ran different code") for n in compared["notes"]
    )
    rows = [r for r in compared["rows"] if r["group"].get("model") is not None]  # not the totals
    assert {r["group"]["model"] for r in rows} == {"chain", "orthogonal", "indrnn"}
    ours = [r for r in rows if r["group"]["model"] == "indrnn" and r["study_id"] is not None]
    assert len(ours) == 2 and all(r["trials"] == 2 and len(r["ci95"]) == 2 for r in ours)
    parent = MlflowClient(mlflow_uri).get_run(first["mlflow"]["run_id"])
    for model in ("chain", "orthogonal", "indrnn"):
        assert (
            f"success_rate.{model}" in parent.data.metrics
            and f"success_ci95_high.{model}" in parent.data.metrics
        )


def test_a_refused_plugin_named_in_a_study_is_refused_with_its_reason(tmp_path: Path):
    bad = toy_dist(tmp_path / "bad", "0.1", name="toy", extra_init="")
    (bad / "memsweep_toy" / "__init__.py").write_text("raise ImportError('the toy needs a GPU library')\n")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(cut_preset(["chain", "toy"])))
    done = memsweep("plan", str(spec), paths=(bad,), environ={"MEMSWEEP_HOME": str(tmp_path / "home")})
    assert done.returncode != 0
    assert "the cell plugin 'toy' (memsweep_toy:ToyCell) of memsweep-toy 0.1 cannot be used" in done.stderr
    assert "the toy needs a GPU library" in done.stderr


# A plugin's identity (docs/plugins.md, 'Identity'): which files its code digest hashes, as `memsweep
# plugins --files NAME` lists them, and an editable install whose source names a version pip has not
# installed yet, as `memsweep plugins` and its check say.


def _listed(site: Path) -> dict[str, object]:
    done = memsweep("plugins", "--json", paths=(site,))
    assert done.returncode == 0, done.stderr[-2000:]
    (plugin,) = json.loads(done.stdout)["server"]
    return plugin  # type: ignore[no-any-return]


def test_an_editors_leftovers_leave_a_plugins_identity_as_it_was_and_its_data_files_move_it(
    tmp_path: Path,
) -> None:
    site = toy_dist(tmp_path / "site", "1.0")
    package = site / "memsweep_toy"
    before = _listed(site)["digest"]
    source = (package / "__init__.py").read_text()
    for leftover in ("__init__.py.orig", "__init__.py.rej", "__init__.py~", "#__init__.py#", "cell.py.bak"):
        (package / leftover).write_text(source)
    assert _listed(site)["digest"] == before  # the same code: the same trials
    (package / "table.json").write_text("[1, 2]")
    with_data = _listed(site)["digest"]
    assert with_data != before  # data a plugin ships is part of what it computes
    (package / "table.json").write_text("[1, 3]")
    assert _listed(site)["digest"] not in (before, with_data)

    shown = memsweep("plugins", "--files", "toy", paths=(site,))
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert (
        f"cell 'toy' (memsweep-toy==1.0+{_listed(site)['digest']}): its code digest hashes 2 files"
        in shown.stdout
    )
    assert "  __init__.py\n" in shown.stdout and "  table.json\n" in shown.stdout
    assert (
        "left out (an editor's or a merge's leftovers): " in shown.stdout
        and "__init__.py.orig" in shown.stdout
    )
    (report,) = json.loads(memsweep("plugins", "--files", "cell:toy", "--json", paths=(site,)).stdout)
    assert (
        sorted(report["hashed"]) == ["__init__.py", "table.json"]
        and len(report["hashed"]["table.json"]) == 16
    )
    assert sorted(report["left_out"]) == sorted(
        ["#__init__.py#", "__init__.py.orig", "__init__.py.rej", "__init__.py~", "cell.py.bak"]
    )
    assert "no plugin 'other'" in memsweep("plugins", "--files", "other", paths=(site,)).stderr


def _editable(site: Path, source: Path, version: str) -> None:
    """The toy distribution in `site` as `pip install -e SOURCE` leaves it (PEP 610), its source naming
    `version`."""
    source.mkdir(parents=True, exist_ok=True)
    (source / "pyproject.toml").write_text(f'[project]\nname = "memsweep-toy"\nversion = "{version}"\n')
    (info,) = site.glob("*.dist-info")
    url = {"url": source.as_uri(), "dir_info": {"editable": True}}
    (info / "direct_url.json").write_text(json.dumps(url))


def test_an_editable_installs_version_bump_not_yet_installed_is_named_with_what_to_run(
    tmp_path: Path,
) -> None:
    site = toy_dist(tmp_path / "site", "0.1.0")
    source = tmp_path / "my cell"
    _editable(site, source, "0.1.0")
    assert _listed(site)["version_behind"] is None

    _editable(site, source, "0.2.0")
    pip = f"{sys.executable} -m pip"  # the interpreter's own pip (a bare `pip` may be another Python's)
    why = (
        f"version 0.2.0 in {source / 'pyproject.toml'}, 0.1.0 installed: run {pip} install -e {source} again"
    )
    plugin = _listed(site)
    assert plugin["version"] == "0.1.0" and plugin["version_behind"] == why
    assert PluginPublic.model_validate(plugin).version_behind == why  # GET /plugins answers it too
    listed = memsweep("plugins", paths=(site,))
    assert listed.returncode == 0 and f"cell 'toy': {why}" in listed.stdout
    checked = memsweep("plugins", "check", "toy", paths=(site,))
    assert checked.returncode == 0, checked.stdout + checked.stderr[-2000:]  # the contract holds all the same
    assert "holds its contract" in checked.stdout and f"note: {why}" in checked.stdout


def test_a_version_spelt_otherwise_in_the_source_is_no_version_behind(tmp_path: Path) -> None:
    """`1.0.0-beta1` in pyproject.toml is the `1.0.0b1` pip installs: no note after every reinstall."""
    site = toy_dist(tmp_path / "site", "1.0.0b1")
    _editable(site, tmp_path / "source", "1.0.0-beta1")
    assert _listed(site)["version_behind"] is None
