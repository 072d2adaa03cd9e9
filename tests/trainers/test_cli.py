"""`python -m trainers` as scripts use it: JSON in the documented shape, errors that list valid names."""

import json
import math
import subprocess
import sys

import pytest

from trainers.tasks import list_tasks


def run(*args):
    return subprocess.run(
        [sys.executable, "-m", "trainers", *args], capture_output=True, text=True, timeout=300
    )


def test_describe_json():
    p = run(
        "describe",
        "--task",
        "copy",
        "--seq-len",
        "500",
        "--cell",
        "rnn",
        "--init",
        "chain",
        "--hidden",
        "100",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["param_count"] == 100 * 100 + 100 * 10 + 100 + 100 * 9 + 9
    assert out["baseline_loss"] == math.log(8) * 10 / 500
    assert out["success_threshold"] == out["baseline_loss"] / 2
    assert out["seq_len"] == 500 and out["config"]["cell_params"]["init"] == "chain"


def test_train_json_last_line():
    p = run(
        "train",
        "--task",
        "addition",
        "--seq-len",
        "20",
        "--cell",
        "rnn",
        "--init",
        "identity",
        "--scale",
        "1.0",
        "--hidden",
        "16",
        "--lr",
        "1e-3",
        "--steps",
        "6",
        "--seed",
        "1",
        "--set",
        "n_train=64",
        "--set",
        "n_val=32",
        "--eval-every",
        "3",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    for key in ("final_val_loss", "success", "baseline_loss", "steps", "seconds", "status"):
        assert key in out
    assert out["status"] == "done" and out["steps"] == 6 and isinstance(out["success"], bool)
    assert "step" in p.stderr  # progress goes to stderr with --json


def test_unknown_names_fail_with_the_valid_ones():
    p = run("describe", "--task", "kopy")
    assert p.returncode == 2 and "valid tasks: " + ", ".join(list_tasks()) in p.stderr
    p = run("describe", "--init", "chian")
    assert p.returncode == 2 and "chain, fbchain, identity, orthogonal" in p.stderr
    p = run("describe", "--set", "lrate=1")
    assert p.returncode == 2 and "unknown config field 'lrate'" in p.stderr


# SGORNN paper, Tables 1 and 2: (task, cell, hidden) → parameters; HAR-2 counts need no data files.
SGORNN_COUNTS = [
    ("addition", "sgornn", 128, 1411), ("addition", "vprnn", 128, 1409),
    ("addition", "fastrnn", 128, 16899), ("addition", "lstm", 128, 67201),
    ("har2", "sgornn", 128, 2307), ("har2", "vprnn", 128, 2305),
    ("har2", "fastrnn", 128, 17795), ("har2", "lstm", 64, 19009),
]  # fmt: skip


@pytest.mark.parametrize("task,cell,hidden,params", SGORNN_COUNTS)
def test_describe_gives_the_sgornn_papers_parameter_counts(task, cell, hidden, params, capsys, tmp_path):
    from trainers.cli import main

    code = main(["describe", "--task", task, "--cell", cell, "--hidden", str(hidden), "--set", f"root={tmp_path}", "--json"]
                if task == "har2" else ["describe", "--task", task, "--cell", cell, "--hidden", str(hidden), "--json"])  # fmt: skip
    assert code == 0
    assert json.loads(capsys.readouterr().out)["param_count"] == params


def test_a_config_file_keeps_its_task_and_cell_unless_a_flag_overrides_them(tmp_path, capsys):
    from trainers.cli import main

    path = tmp_path / "trial.json"
    path.write_text(
        json.dumps({"task": "addition", "cell": "lstm", "hidden": 8, "task_params": {"seq_len": 30}})
    )
    assert main(["describe", "--config", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["config"]["task"], out["config"]["cell"], out["seq_len"]) == ("addition", "lstm", 30)
    assert main(["describe", "--config", str(path), "--cell", "gru", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["config"]["task"], out["config"]["cell"], out["config"]["hidden"]) == ("addition", "gru", 8)


@pytest.mark.parametrize("mode", ["portable", "native"])
def test_train_in_a_numerics_mode_records_where_its_numbers_came_from(mode):
    """`--numerics` sets the trial's mode, applied before anything computes — the variable-copy task
    computes as it is built — and the result's provenance says so."""
    out = run(
        "train", "--task", "varcopy", "--hidden", "8", "--steps", "2", "--numerics", mode,
        "--set", "lag_max=5", "--set", "n_train=32", "--set", "n_val=16", "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["status"] == "done" and result["config"]["numerics"] == mode
    assert result["provenance"]["numerics"] == mode
    assert result["provenance"]["mkl_cbwr"] == ("COMPATIBLE" if mode == "portable" else "AUTO,STRICT")


def test_a_task_value_its_constructor_refuses_is_an_error_not_a_failed_trial():
    """A copy sequence too short for its layout: refused before training (exit 2, one line naming the
    value and the fix), as a study's creation refuses it; it was a traceback and a `failed` result."""
    p = run("train", "--task", "copy", "--seq-len", "20", "--steps", "5", "--json")
    assert p.returncode == 2 and p.stdout == "", p.stdout[-500:]
    assert p.stderr.startswith("error: task 'copy': copy: seq_len = 20 is too short for layout 'total'"), (
        p.stderr[-500:]
    )
    assert "give at least 21, or layout 'delay'" in p.stderr and "Traceback" not in p.stderr


def test_both_criterion_flags_are_refused_before_training():
    """`--success-threshold` with `--success-fraction` trained the whole budget, then exited 2 with no
    result: the criterion is made, and refused, before a step is taken."""
    p = run("train", "--task", "addition", "--seq-len", "10", "--steps", "100000", "--eval-every", "100000",
            "--success-threshold", "0.1", "--success-fraction", "0.3", "--json")  # fmt: skip
    assert p.returncode == 2 and p.stdout == "", p.stdout[-500:]
    assert "give exactly one" in p.stderr and "step" not in p.stderr.split("error:")[0], p.stderr[-500:]
