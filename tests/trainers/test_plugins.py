"""Plugin cells by entry point (issue 38): they join the registry with their identity, or are refused with
their reason; their contract is checked (`trainers.contract`). Each case runs in a child process that sees
its own made-up distributions (`tests.plugin_dists`): the registries load plugins once per process."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.plugin_dists import FUSED_TOY, memsweep, run_python, toy_cell, toy_dist, write_dist

TRAIN_TOY = """
import json
import trainers
from trainers.plugins import installed
from trainers.cells import list_cells

config = {"task": "addition", "cell": "toy", "hidden": 8, "seed": 1, "steps": 4, "eval_every": 2,
          "task_params": {"seq_len": 10, "n_train": 32, "n_val": 16}}
resolved = trainers.resolve(config)
result = trainers.train(resolved)
builtin = trainers.resolve({**config, "cell": "rnn"}).config_hash()
print(json.dumps({"cells": list_cells(), "plugins": [p.to_dict() for p in installed()], "status": result.status,
                  "provenance": result.provenance, "hash": resolved.config_hash(), "builtin": builtin}))
"""


def test_a_plugin_cell_joins_trains_and_its_version_and_code_enter_the_config_hash(tmp_path: Path):
    import trainers

    first = run_python(TRAIN_TOY, toy_dist(tmp_path / "v1", "1.0"))
    assert "toy" in first["cells"] and first["status"] == "done"
    (plugin,) = first["plugins"]
    assert (
        plugin["distribution"] == "memsweep-toy" and plugin["version"] == "1.0" and plugin["problem"] is None
    )
    assert len(plugin["digest"]) == 16 and plugin["identity"] == f"memsweep-toy==1.0+{plugin['digest']}"
    assert first["provenance"]["plugin.cell"] == plugin["identity"]
    # a built-in's hash is what it always was: the plugin's presence changes nothing else
    rnn = {"task": "addition", "cell": "rnn", "hidden": 8, "seed": 1, "steps": 4, "eval_every": 2,
           "task_params": {"seq_len": 10, "n_train": 32, "n_val": 16}}  # fmt: skip
    assert first["builtin"] == trainers.resolve(rnn).config_hash()

    other_version = run_python(TRAIN_TOY, toy_dist(tmp_path / "v2", "1.1"))
    edited = run_python(TRAIN_TOY, toy_dist(tmp_path / "v1e", "1.0", extra_init="self.edited = True"))
    hashes = {first["hash"], other_version["hash"], edited["hash"]}
    assert len(hashes) == 3  # another version, or the same version with other code: never the same trial
    assert first["builtin"] == other_version["builtin"] == edited["builtin"]
    assert edited["plugins"][0]["digest"] != plugin["digest"]


REFUSED = """
import json
import trainers
from trainers.cells import list_cells
from trainers.plugins import installed

def refusal(cell):
    try:
        trainers.resolve({"cell": cell, "task": "addition"})
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None

print(json.dumps({"problems": {p.name: p.problem for p in installed()}, "cells": list_cells(),
                  "broken": refusal("broken"), "misnamed": refusal("misnamed"), "notacell": refusal("notacell"),
                  "rnn": refusal("rnn"), "lstm": refusal("lstm")}))
"""


def test_plugins_that_cannot_join_are_refused_by_name_and_the_built_ins_keep_working(tmp_path: Path):
    root = tmp_path / "site"
    write_dist(root, "memsweep-broken", "0.1", {"memsweep.cells": {"broken": "memsweep_broken:Cell"}},
               {"memsweep_broken/__init__.py": "import a_module_that_is_not_installed\n"})  # fmt: skip
    write_dist(root, "memsweep-misnamed", "0.2", {"memsweep.cells": {"misnamed": "memsweep_misnamed:ToyCell"}},
               {"memsweep_misnamed/__init__.py": toy_cell("toy")})  # fmt: skip
    write_dist(root, "memsweep-notacell", "0.3", {"memsweep.cells": {"notacell": "memsweep_notacell:f"}},
               {"memsweep_notacell/__init__.py": "def f():\n    pass\n"})  # fmt: skip
    write_dist(root, "memsweep-shadow", "0.4", {"memsweep.cells": {"rnn": "memsweep_shadow:ToyCell"}},
               {"memsweep_shadow/__init__.py": toy_cell("rnn")})  # fmt: skip
    out = run_python(REFUSED, root)
    assert not {"broken", "misnamed", "notacell"} & set(out["cells"])
    assert "a_module_that_is_not_installed" in out["problems"]["broken"]
    assert "ToyCell.name is 'toy'" in out["problems"]["misnamed"]
    assert "not a subclass of trainers.cells.base.Cell" in out["problems"]["notacell"]
    assert "built-in cell: a plugin may not shadow it" in out["problems"]["rnn"]
    for name, dist in (("broken", "memsweep-broken 0.1"), ("misnamed", "memsweep-misnamed 0.2"),
                       ("notacell", "memsweep-notacell 0.3")):  # fmt: skip
        assert f"cell plugin {name!r}" in out[name] and f"of {dist} cannot be used" in out[name]
    # the shadowed built-in is refused while the plugin is installed (which one would a study mean?)
    assert out["rnn"].startswith("ConfigError: ") and "memsweep-shadow 0.4" in out["rnn"]
    assert out["lstm"] is None


CLASHES = """
import json
import trainers
from trainers import ConfigError, TrainConfig
from trainers.cells import CELLS
from trainers.contract import check_cell

out = {}
for cell in ("optimiser-eps", "task-seq-len"):
    try:
        trainers.resolve(trainers.apply_overrides(TrainConfig(task="addition", cell=cell), {"eps": 0.5}))
        out[cell] = None
    except ConfigError as exc:
        out[cell] = str(exc)
    out[cell + " check"] = [str(p) for p in check_cell(CELLS.get(cell))]
print(json.dumps(out))
"""


def test_a_plugin_setting_named_like_a_trials_or_a_tasks_is_refused_not_set_in_their_place(tmp_path: Path):
    """A plugin cell with a setting `eps` (its step size) had a study's `eps` go to the optimiser and
    its own stay at its default, with no warning from `plugins check`, the plan or the run; one named
    like a task's setting (`seq_len`) would have set the task's. Both are refused, by name, with the fix:
    the first everywhere, the second where a trial pairs the cell with that task (the contract's checks
    on addition and copy build it all the same, so a study of it on another task is not refused)."""
    root = tmp_path / "site"
    for name, field in (("optimiser-eps", "eps: float = 0.1"), ("task-seq-len", "seq_len: int = 3")):
        module = "memsweep_" + name.replace("-", "_")
        source = toy_cell(name).replace(
            '    nonlinearity: str = "tanh"\n', f'    nonlinearity: str = "tanh"\n    {field}\n'
        )
        write_dist(root, f"memsweep-{name}", "0.1", {"memsweep.cells": {name: f"{module}:ToyCell"}},
                   {f"{module}/__init__.py": source})  # fmt: skip
    out = run_python(CLASHES, root)
    eps = out["optimiser-eps"]
    assert eps is not None and "cell 'optimiser-eps' has a setting named like the trial's own ('eps')" in eps
    assert "Rename the setting (e.g. 'optimiser-eps_eps')" in eps
    seq_len = out["task-seq-len"]
    assert seq_len is not None and "named like those of task 'addition' ('seq_len')" in seq_len
    assert out["optimiser-eps check"] == [
        f"settings: {eps}",
        "not checked: shapes, loss, gradient, batch: no trial resolves the cell until the setting is renamed "
        "(settings, above)",
    ]
    # a setting shared with a task is refused where a study pairs them, not by the contract, which builds
    # the cell on addition and copy whatever it shares with them: a study of it on another task runs
    assert out["task-seq-len check"] == []


CHECK = """
import json
from trainers.cells import CELLS
from trainers.contract import check_cell
print(json.dumps({name: [str(p) for p in check_cell(CELLS.get(name))] for name in {names}}))
"""


@pytest.mark.slow
def test_the_contract_check_finds_each_way_a_cell_breaks_it(tmp_path: Path):
    root = tmp_path / "site"
    cases = {
        "good": {},
        "global-rng": {"extra_init": "torch.randn(1)"},
        "shapes": {"extra_forward": "out = out[..., :-1]"},
        "nan": {"extra_forward": "out = out * float('nan')"},
        "cut": {"extra_forward": "out = out.detach()"},
        "capped": {"extra_forward": "out = out[:, :256]"},  # a batch cap: the validation's 1,000 fails
        "mixed": {"extra_forward": "out = out + out.mean(dim=1, keepdim=True)"},  # examples mixed
    }
    thawed = "thawed"  # its Config a dataclass that is not frozen
    fused = {"fused-good": "", "fused-drift": " + 1e-6"}
    for name, breaks in {**cases, **{key: {} for key in fused}}.items():
        module = "memsweep_" + name.replace("-", "_")
        source = toy_cell(name, **breaks)
        if name in fused:
            source += FUSED_TOY.format(drift=fused[name])
        write_dist(root, f"memsweep-{name}", "1.0", {"memsweep.cells": {name: f"{module}:ToyCell"}},
                   {f"{module}/__init__.py": source})  # fmt: skip
    thawed_source = toy_cell(thawed).replace("@dataclass(frozen=True)", "@dataclass")
    write_dist(root, "memsweep-thawed", "1.0", {"memsweep.cells": {thawed: "memsweep_thawed:ToyCell"}},
               {"memsweep_thawed/__init__.py": thawed_source})  # fmt: skip
    found = run_python(CHECK.replace("{names}", repr(sorted({**cases, **fused, thawed: None}))), root)
    assert found["good"] == [] and found["fused-good"] == []
    assert any(p.startswith("generator: building") for p in found["global-rng"]), found["global-rng"]
    assert any(p.startswith("shapes: on task") and "[T, B, N]" in p for p in found["shapes"]), found["shapes"]
    assert any(p.startswith("loss: on task") and "not finite" in p for p in found["nan"]), found["nan"]
    assert any(p.startswith("forward: on task") or p.startswith("gradient: on task") for p in found["cut"])
    assert any(p.startswith("fused: member") and "bit for bit" in p for p in found["fused-drift"])
    assert any(p.startswith("batch: on task") and "batch of 1200" in p for p in found["capped"]), found[
        "capped"
    ]
    assert any(p.startswith("batch: on task") and "states must be its own" in p for p in found["mixed"])
    assert any(p.startswith("config: ") and "frozen dataclass" in p for p in found[thawed]), found[thawed]


def test_the_cell_in_40_lines_of_docs_plugins_holds_its_contract(tmp_path: Path):
    """The example docs/plugins.md gives, installed as a plugin, passes `trainers.contract` as it is."""
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs" / "plugins.md").read_text()
    code = re.search(r"## A cell in 40 lines\n\n```python\n(.*?)```", doc, re.S)
    assert code is not None and len(code.group(1).splitlines()) <= 45
    root = write_dist(tmp_path, "memsweep-leaky", "0.1", {"memsweep.cells": {"leaky": "memsweep_leaky:LeakyCell"}},
                      {"memsweep_leaky/__init__.py": code.group(1)})  # fmt: skip
    assert run_python(CHECK.replace("{names}", "['leaky']"), root) == {"leaky": []}


FIRST_LOOK_UP = """
import json
import sys
from trainers.cells import CELLS
from trainers.tasks import TASKS

at_import = sorted(m for m in ("memsweep_toy", "memsweep_marker") if m in sys.modules)
cell = CELLS.get("toy").__module__
try:
    TASKS.get("marker")
    task = None
except Exception as exc:
    task = f"{type(exc).__name__}: {exc}"
print(json.dumps({"at_import": at_import, "cell": cell, "task": task}))
"""


def test_a_plugin_joins_at_its_registrys_first_look_up_not_at_import(tmp_path: Path):
    """Through `trainers.cells` and `trainers.tasks` alone (no `trainers.plugins` named): importing them
    imports no plugin; looking a name up loads the plugins of that registry."""
    root = toy_dist(tmp_path / "site", "1.0")
    write_dist(root, "memsweep-marker", "0.1", {"memsweep.tasks": {"marker": "memsweep_marker:Task"}},
               {"memsweep_marker/__init__.py": "Task = None\n"})  # fmt: skip
    out = run_python(FIRST_LOOK_UP, root)
    assert out["at_import"] == [] and out["cell"] == "memsweep_toy"
    assert (
        out["task"].startswith("PluginError: ")
        and "not a subclass of trainers.tasks.base.Task" in out["task"]
    )


def test_the_registries_do_not_import_the_plugins_module_which_imports_them():
    """One way: `trainers.plugins` imports the registries (`installed` loads them all); they reach its
    loader through `trainers.registry`, which `trainers/__init__.py` hands it to."""
    import ast

    trainers = Path(__file__).resolve().parents[2] / "trainers"
    for path in (
        trainers / "registry.py",
        trainers / "cells" / "__init__.py",
        trainers / "tasks" / "__init__.py",
    ):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module is not None:
                imported |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
        assert "trainers.plugins" not in imported, path


# The contract check reports every failing check in one run (`trainers.contract`), and names the ones that
# could not run; `memsweep plugins check` and the door (`service.study.plugins.run_check`) say the same.


@pytest.mark.slow
def test_a_cell_with_two_faults_is_told_both_at_once_and_one_that_cannot_be_built_what_was_not_checked(
    tmp_path: Path,
) -> None:
    two = toy_dist(  # draws from torch's global generator, and mixes its examples across the batch
        tmp_path / "two",
        name="two",
        extra_init="torch.randn(1)",
        extra_forward="out = out - out.mean(1, keepdim=True)",
    )
    unbuildable = toy_dist(tmp_path / "unbuildable", name="unbuildable", extra_init="raise ValueError('no')")
    found = run_python(
        "import json; from service.study.plugins import run_check; "
        "print(json.dumps(run_check(['cell:two', 'cell:unbuildable'], 600)))",
        two,
        unbuildable,
    )
    assert isinstance(found, dict)
    two_problems = found["cell:two"]
    assert any(p.startswith("generator: building a 'two' cell") for p in two_problems), two_problems
    assert any(p.startswith("batch: on task") and "states must be its own" in p for p in two_problems), (
        two_problems
    )
    assert not any(p.startswith("not checked") for p in two_problems), two_problems
    assert found["cell:unbuildable"] == [
        "constructor: building it at its defaults failed: ValueError: no",
        "not checked: parameters, generator, shapes, loss, gradient, batch: they need a cell built at its "
        "defaults (constructor, above)",
    ]

    checked = memsweep("plugins", "check", "two", paths=(two,))
    assert checked.returncode == 1
    assert "  - generator: building a 'two' cell" in checked.stdout and "  - batch: on task" in checked.stdout


# The fused form docs/plugins.md gives ('A fused form') for its leaky cell ('A cell in 40 lines'):
# installed as a plugin, it joins bundles and each member is its solo run bit for bit
# (`trainers.contract`); the same form with `(1 - g) * h` rounded otherwise fails as the doc says.


CHECK_DOC_FORM = """
import json
from trainers.cells import CELLS
from trainers.contract import check_cell
from trainers.fused.cells import FUSED_CELLS
print(json.dumps({"fused": FUSED_CELLS["leaky"].states.__name__, "problems": [str(p) for p in check_cell(CELLS.get("leaky"))]}))
"""


def _doc_block(doc: str, heading: str) -> str:
    found = re.search(rf"## {heading}[^\n]*\n.*?```python\n(.*?)```", doc, re.S)
    assert found is not None, heading
    return found.group(1)


@pytest.mark.slow
def test_the_fused_form_of_docs_plugins_trains_each_member_as_its_solo_run(tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "plugins.md").read_text()
    cell, fused = _doc_block(doc, "A cell in 40 lines"), _doc_block(doc, "A fused form")
    drifted = fused.replace("h = (1 - g) * h + g *", "h = h - g * h + g *")  # the bundle's alone
    assert drifted != fused
    for name, code in (("doc", cell + "\n" + fused), ("drifted", cell + "\n" + drifted)):
        write_dist(tmp_path / name, "memsweep-leaky", "0.1", {"memsweep.cells": {"leaky": "memsweep_leaky:LeakyCell"}},
                   {"memsweep_leaky/__init__.py": code})  # fmt: skip
    assert run_python(CHECK_DOC_FORM, tmp_path / "doc") == {"fused": "leaky_states", "problems": []}
    found = run_python(CHECK_DOC_FORM, tmp_path / "drifted")
    assert isinstance(found, dict) and found["problems"], found
    assert all(p.startswith("fused: member") and "bit for bit" in p for p in found["problems"]), found
