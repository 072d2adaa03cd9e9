"""Heavy dependencies stay at the edges: the trainers pull in torch, never ray / mlflow / fastapi."""

import ast
import os
import subprocess
import sys


def loaded_by(modules: str, heavy: tuple[str, ...]) -> list[str]:
    """Which of `heavy` a fresh interpreter has loaded after importing `modules` (comma-separated)."""
    code = f"import sys, {modules}; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return list(ast.literal_eval(out))  # the child prints a list of names


def test_trainers_import_no_service_stack():
    assert loaded_by("trainers, trainers.cli", ("ray", "mlflow", "fastapi", "optuna", "sqlalchemy")) == []


def test_the_trainers_leaves_a_ledger_reader_needs_import_no_torch():
    """The success rule, a result and the config schema (TRAINER_VERSION) need no torch, and `import
    trainers` loads its names on first use (PEP 562): every one of them resolves."""
    assert loaded_by("trainers, trainers.criterion, trainers.result, trainers.config", ("torch",)) == []
    import trainers

    assert [name for name in trainers.__all__ if getattr(trainers, name, None) is None] == []


def test_the_gpu_check_imports_only_torch_and_the_leaves():
    """The lent GPU machine has torch but not our venv: `python3 -m benchmarks.gpu_check` runs there."""
    heavy = ("ray", "mlflow", "fastapi", "optuna", "sqlalchemy", "pydantic", "service")
    assert loaded_by("benchmarks.gpu_check.cli", heavy) == []


def test_the_engine_and_its_executor_seam_import_no_ray():
    """Only the Ray Tune adapter (`service.study.ray_tune`) builds Ray's objects (issue 36)."""
    seam = "service.study.engine, service.study.executor, service.study.book, service.study.worker"
    assert loaded_by(seam, ("ray",)) == []


def test_the_cli_imports_no_http_server_until_it_serves():
    """The CLI answers without a server through the application room (`service.application`)."""
    heavy = ("fastapi", "starlette", "uvicorn", "service.api")
    assert loaded_by("service.cli.commands, service.cli.local", heavy) == []


def test_the_cli_in_front_of_a_server_imports_no_torch():
    """`memsweep status|trials|success|best|studies|compare --url …` ask the server and print: no torch,
    no Ray, no ledger (a refusal is `service.core.errors`'s, not the spec's, which reads the trainers)."""
    commands = [["status", "s1"], ["trials", "s1"], ["success", "s1"], ["best", "s1"], ["studies"],
                ["compare", "s1", "s2"]]  # fmt: skip
    code = (
        "import sys; from service.cli import commands\n"
        f"for argv in {commands!r}:\n"
        "    try:\n"
        "        commands.main([*argv, '--url', 'http://127.0.0.1:9'])\n"
        "    except SystemExit as e:\n"
        "        assert 'the server at http://127.0.0.1:9 does not answer' in str(e.code), (argv, e.code)\n"
        "    else:\n"
        "        raise AssertionError(f'{argv}: answered without a server')\n"
        "print(sorted(m for m in ('torch', 'ray', 'sqlalchemy', 'mlflow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert ast.literal_eval(out.stdout) == []


def test_the_cli_on_its_own_ledger_reads_without_torch(tmp_path):
    """`memsweep studies|status|trials|success|best|compare` without a server read this machine's ledger
    through the service's reads: no torch, Ray or MLflow (importing torch was 2 of their 5 s). Two studies
    whose trials finished, written as the engine writes them; `success --json`, since the plain table
    lists the study's other criteria, whose reference baselines the task registry knows."""
    from service.core.settings import Settings
    from service.core.spec import StudySpec
    from service.study.engine import Engine
    from trainers.result import Evaluation, TrialResult

    engine = Engine(Settings(home=tmp_path, database_url=None))  # creating a study trains nothing
    ledger, ids = engine.ledger, []
    for name, seeds in (("a", [1, 2]), ("b", [3])):
        spec = {"name": name, "space": {"dims": {"lr": [1e-3]}}, "base": {"task": "addition", "seq_len": 20}}
        study = engine.create_study(StudySpec.model_validate({**spec, "seeds": seeds}))
        for t in ledger.trials(study.id):
            loss = 0.05 * t.params["seed"]
            ledger.start_trial(study.id, t.config_hash)
            ledger.finish_trial(
                t.id, TrialResult(final_val_loss=loss, baseline_loss=1 / 6, history=[Evaluation(20, 1.0, loss, loss, None, 0.1)])
            )  # fmt: skip
        ledger.update_study(study.id, state="done")
        ids.append(study.id)
    a, b = ids
    commands = [["studies"], ["status", a], ["trials", a], ["success", a, "--json"], ["best", a],
                ["compare", a, b]]  # fmt: skip
    code = (
        "import contextlib, io, sys; from service.cli import commands\n"
        f"for argv in {commands!r}:\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        assert commands.main(argv) == 0, argv\n"
        "print(sorted(m for m in ('torch', 'ray', 'mlflow') if m in sys.modules))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MEMSWEEP_API_URL", "MEMSWEEP_DATABASE_URL")}
    env["MEMSWEEP_HOME"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert ast.literal_eval(out.stdout) == []


# ----- service/'s rooms: every import points down (or within its room) ----------------------------------

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: service/'s rooms from the ground floor up; a module may import its own room and the rooms below
ROOMS = (
    "service.core",  # the vocabulary: spec, trial, states, values, settings
    "service.store",  # the ledger
    "service.tracking",  # MLflow
    "service.reports",  # what ledger rows add up to
    "service.study",  # the lifecycle: search, packing, Ray Tune, engine, recorder
    "service.planning",  # a study's cost, before and after
    "service.runner",  # plan → run → cost, for the server and the CLI
    "service.application",  # the study service and its records, under the API and the CLI
    "service.client",  # the Python client (a front beside the API)
    "service.api",  # the REST server
    "service.cli",  # the `memsweep` command
)
#: what the lower layers of the repository may import: the grids and the trainers never reach up
LEAVES = {"search_spaces": (), "trainers": ("search_spaces",)}


def room_of(module: str) -> str | None:
    return next((r for r in ROOMS if module == r or module.startswith(r + ".")), None)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """Every module `path` imports (at the top, in a function, under TYPE_CHECKING), with its line."""
    found = []
    package = module_name(path).rsplit(".", 0 if path.name == "__init__.py" else 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], base]
                ).strip(".")
            if room_of(base) is None and base in ("service", "service.api"):  # `from service import x`
                found += [(node.lineno, f"{base}.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, base))
    return found


def upward_imports(package: str) -> list[str]:
    wrong = []
    for path in sorted((ROOT / package).rglob("*.py")):
        me = module_name(path)
        mine = room_of(me)
        for line, target in imports_of(path):
            top = target.split(".")[0]
            if package == "service" and top == "service":
                theirs = room_of(target)
                if mine is None or (theirs is not None and ROOMS.index(theirs) > ROOMS.index(mine)):
                    wrong.append(f"{path.relative_to(ROOT)}:{line}: {mine or me} imports {target}")
            elif package in LEAVES and top in {"service", "trainers", "search_spaces"} - {
                package,
                *LEAVES[package],
            }:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {package} imports {target}")
    return wrong


@pytest.mark.parametrize("package", ["service", "trainers", "search_spaces"])
def test_imports_point_down(package):
    """A lower room never imports a higher one (ROOMS, bottom to top), and every module of service/
    sits in a room: the house has no circle and no arrow back up."""
    assert upward_imports(package) == []


def test_the_room_check_catches_an_upward_import(tmp_path, monkeypatch):
    """The check itself: a module of the ledger that imports the engine is named."""
    fake = tmp_path / "service" / "store"
    fake.mkdir(parents=True)
    (fake / "bad.py").write_text(
        "from service.core.spec import StudySpec\n\ndef f():\n    from service.study.engine import Engine\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert upward_imports("service") == ["service/store/bad.py:4: service.store imports service.study.engine"]


def test_no_module_of_service_imports_itself_back():
    """No circle between modules, within a room or across: every import of a service module (lazy and
    TYPE_CHECKING ones too) leads away from it."""
    graph: dict[str, set[str]] = {}
    modules = {module_name(p): p for p in (ROOT / "service").rglob("*.py")}
    for me, path in modules.items():
        graph[me] = set()
        for _, target in imports_of(path):
            while target and target not in modules:  # `from service.x import name` → service.x
                target = target.rpartition(".")[0]
            if target and target != me and not me.startswith(target + "."):  # a package's own parent
                graph[me].add(target)
    done: set[str] = set()

    def circle_from(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for nxt in sorted(graph.get(node, ())):
            found = circle_from(nxt, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    circles = [c for m in sorted(graph) if (c := circle_from(m, []))]
    assert circles == [], " → ".join(circles[0])


#: the modules of service/ that may use Ray's API: the Ray Tune adapter (the engine's executor) and the
#: process-level helpers it stands on (starting, joining and reaping Ray; its nodes)
RAY_MODULES = {"service.study.ray_tune", "service.study.nodes"}


def ray_importers(package: str = "service") -> list[str]:
    """Each module of `package` but RAY_MODULES that imports Ray (`import ray…` / `from ray… import`),
    with its line."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        if module_name(path) in RAY_MODULES:
            continue
        for line, target in imports_of(path):
            if target == "ray" or target.startswith("ray."):
                found.append(f"{path.relative_to(ROOT)}:{line}: imports {target}")
    return found


def test_only_the_executor_and_the_node_helpers_import_ray():
    """Ray stays behind the engine's executor (`Executor`; `service.study.ray_tune.RayTune`): the
    runner, the plans, the application and the API ask it (start, stop, unplaceable, resources,
    node_plugins, run_tasks) and never import Ray themselves, so that each question has one answer."""
    assert ray_importers() == []


def test_the_ray_check_catches_a_lazy_import(tmp_path, monkeypatch):
    """The check itself: an import of Ray inside a function, outside the allowed modules, is named."""
    fake = tmp_path / "service" / "planning"
    fake.mkdir(parents=True)
    (fake / "bad.py").write_text("def f():\n    import ray.util\n\n    from ray import tune\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert ray_importers() == [
        "service/planning/bad.py:2: imports ray.util",
        "service/planning/bad.py:4: imports ray",
    ]
