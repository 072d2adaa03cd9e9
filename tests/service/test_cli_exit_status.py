"""`memsweep`'s exit statuses (`service.cli.console`): 0 done; 1 the command ran and what it did failed
(a study failed, a plan with no estimate, a study whose state refuses the change, a server that does not
answer); 2 its input was refused before anything ran (a malformed flag, a spec refused as invalid, an
unknown preset, plugin or study). Before, a refusal exited 1 or 2 by the path it took: `--set steps`
exited 1 and `--seeds 1,x` 2, a bad value met by the engine 1 and one met by the spec's schema 2.

Through `commands.main` in this process, on a home of its own, read as Python exits (`exit_of`); the
server's answers from the real server under uvicorn; one child process for the interpreter's own exit."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.cli import commands
from service.cli.console import EXIT_FAILED, EXIT_REFUSED
from service.cli.servers import free_port
from service.core.settings import get_settings
from service.store.ledger import Ledger
from tests.service.conftest import TINY
from tests.service.servers import Server

TOKEN = "exit-token-3d9e"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Path:
    """`memsweep` on a home of its own (no ledger made yet), no server named, no token."""
    monkeypatch.setenv("MEMSWEEP_HOME", str(tmp_path / "home"))
    for name in (
        "MEMSWEEP_API_URL", "MEMSWEEP_API_TOKEN", "MEMSWEEP_DATABASE_URL", "MEMSWEEP_RAY_ADDRESS",
        "MEMSWEEP_MLFLOW_TRACKING_URI",
    ):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(commands, "prepare_ray_process", lambda settings: None)  # no Ray starts here
    get_settings.cache_clear()  # the CLI's settings read again, from this home (and again after the test)
    request.addfinalizer(get_settings.cache_clear)
    return tmp_path / "home"


def exit_of(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """`memsweep ARGV`'s exit status and what it wrote to stderr, as Python exits: main's status, a
    SystemExit's number, or a SystemExit's message printed and 1 (its stdout: `capsys.readouterr()`
    before the next call)."""
    capsys.readouterr()
    try:
        code = commands.main(list(argv))
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            code = exit_.code or 0
        else:
            print(exit_.code, file=sys.stderr)
            code = 1
    out, err = capsys.readouterr()
    sys.stdout.write(out)  # for the caller to read
    return code, err


def test_help_says_what_each_status_means(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        commands.main(["--help"])
    assert done.value.code == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "Exit status (every command): 0 done (a study whose trials failed by the protocol's rule" in said
    assert (
        "1 the command ran, and what it did failed" in said
        and "every trial of it raised an exception" in said
    )
    assert "run was stopped by Ctrl-C or SIGTERM. 2 the input was refused before anything ran: " in said


# ----- 2: the input refused before anything ran -----------------------------------------------------------
def test_a_malformed_flag_exits_2(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--set steps`, `--dim lr` and `--param lr` exited 1 and `--seeds 1,x` 2; a missing preset, a missing
    server URL and a URL without its scheme exited 1."""
    for argv, said in (
        (("plan", "orhan2020-copy500", "--set", "steps"), "error: --set 'steps': write KEY=VALUE\n"),
        (("plan", "orhan2020-copy500", "--dim", "lr"), "error: --dim 'lr': write KEY=VALUE\n"),
        (("trials", "abc123", "--param", "lr"), "error: --param 'lr': write KEY=VALUE\n"),
        (("plan", "orhan2020-copy500", "--seeds", "1,x"), "error: --seeds 1,x: give whole numbers"),
        (("plan",), "error: give a preset name or a spec file (see `memsweep presets`)\n"),
        (("run",), "error: give a preset name or a spec file (see `memsweep presets`), or --study ID"),
        (("submit", "orhan2020-copy500"), "error: give the server's --url (or set MEMSWEEP_API_URL)"),
        (("status", "abc123", "--url", "127.0.0.1:8731"), "error: --url (or MEMSWEEP_API_URL): url "),
        (("best", "abc123", "--k", "0"), "--k: 0 is out of range; give 1 to 1000"),  # argparse's own
    ):
        code, err = exit_of(capsys, *argv)
        assert (code, err.count("error: ")) == (EXIT_REFUSED, 1) and said in err, (argv, err[-500:])
    assert not home.exists()  # nothing ran: no ledger made


def test_an_unknown_preset_exits_2(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`memsweep run nosuch` exited 2, `memsweep plan nosuch` 1 (the engine's refusal, through the study
    service's plan)."""
    for command in ("plan", "run"):
        code, err = exit_of(capsys, command, "nosuchpreset")
        assert code == EXIT_REFUSED, (command, err[-500:])
        assert (
            err.startswith("error: unknown preset 'nosuchpreset'; presets: ") and "orhan2020-copy500" in err
        )
    # `memsweep presets NAME` (its detail) refuses a misspelt name with the nearest one
    code, err = exit_of(capsys, "presets", "nru2019-copy10")
    assert code == EXIT_REFUSED and err.startswith(
        "error: unknown preset 'nru2019-copy10'; did you mean 'nru2019-copy100'? `memsweep presets` lists them "
        "with their sizes and citations; presets: "
    ), err[-500:]


def test_a_spec_with_an_invalid_value_exits_2(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A value the spec's schema refuses exited 2; one the engine refuses (a trial setting the trainers
    cannot read) exited 1."""
    bad_field = tmp_path / "bad-field.json"
    bad_field.write_text(json.dumps({"space": {"dims": {"lr": [1e-3]}}, "base": TINY, "concurrency": 0}))
    unreadable = tmp_path / "unreadable.yaml"
    unreadable.write_text("dims: [unclosed\n")
    for argv, said in (
        (("plan", "orhan2020-copy500", "--set", "steps=abc"), "base.steps = 'abc' is not an integer"),
        (("plan", "orhan2020-copy500", "--concurrency", "0"), "concurrency: Input should be greater than"),
        (("plan", str(bad_field)), "concurrency: Input should be greater than or equal to 1"),
        (("plan", str(unreadable)), f"error: {unreadable}: not YAML or JSON"),
    ):
        code, err = exit_of(capsys, *argv)
        assert code == EXIT_REFUSED and err.startswith("error: ") and said in err, (argv, err[-500:])


def test_an_unknown_study_or_plugin_exits_2(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A study id no ledger holds exited 1, from a query and from `run --study`; so did an unknown plugin
    given to `plugins check`."""
    for argv, said in (
        (("best", "nope"), "error: this machine has no ledger yet"),
        (("status", "nope"), "error: this machine has no ledger yet"),
        (("sync", "nope"), "error: this machine has no ledger yet"),
        (("run", "--study", "nope"), "error: no study 'nope' in this machine's ledger"),
        (("plugins", "check", "nope"), "error: no plugin 'nope'; installed: "),
    ):
        code, err = exit_of(capsys, *argv)
        assert code == EXIT_REFUSED and err.startswith(said), (argv, err[-500:])
    home.mkdir()
    Ledger(f"sqlite:///{home / 'ledger.db'}")  # a ledger here, without that study
    for argv, said in (
        (("best", "nope"), "error: no study 'nope'; `memsweep studies`"),
        (("trials", "nope"), "error: no study 'nope'; `memsweep studies`"),
        (("compare", "nope", "other"), "error: no studies 'nope', 'other' in the ledger"),
        (("run", "--study", "nope"), "error: no study 'nope' in this machine's ledger"),
    ):
        code, err = exit_of(capsys, *argv)
        assert code == EXIT_REFUSED and err.startswith(said), (argv, err[-500:])


def test_the_interpreter_exits_2_and_prints_the_refusal_once(tmp_path: Path) -> None:
    """As a shell sees it: `memsweep plan PRESET --set steps` exits 2 with its one line, and a server that
    does not answer exits 1 with its own."""
    env = {"MEMSWEEP_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}

    def memsweep(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "service.cli", *args], env=env, capture_output=True, text=True,
            timeout=120, cwd=Path(__file__).parents[2],
        )  # fmt: skip

    refused = memsweep("plan", "orhan2020-copy500", "--set", "steps")
    assert (refused.returncode, refused.stderr, refused.stdout) == (
        2,
        "error: --set 'steps': write KEY=VALUE\n",
        "",
    )
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    away = memsweep("status", "abc123", "--url", url)
    assert away.returncode == 1 and away.stderr.startswith(f"error: the server at {url} does not answer")
    assert away.stderr.count("\n") == 1


# ----- the server's answers: 2 for a refused request, 1 for a state or a failure ---------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The real server, with a token, whose studies fail: its Ray cluster is an address nothing listens
    at (a study fails as it starts, in a second; nothing trains), and MLflow another."""
    home = tmp_path_factory.mktemp("exit-home")
    s = Server(home, "http://127.0.0.1:9", token=TOKEN, ray_address=f"127.0.0.1:{free_port()}").start()
    yield s
    s.stop()


@pytest.fixture
def served(home: Path, server: Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """`memsweep` with the server's URL and token in its environment."""
    monkeypatch.setenv("MEMSWEEP_API_URL", server.url)
    monkeypatch.setenv("MEMSWEEP_API_TOKEN", TOKEN)
    get_settings.cache_clear()
    return server.url


@pytest.mark.slow
def test_a_request_the_server_refuses_exits_2(
    served: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The server's 404 (no such study), 422 (an unknown preset, a value the engine refuses) and 401 (a
    wrong token) exited 1."""
    for argv, said in (
        (("status", "nope"), "error: GET /studies/nope → 404: no study 'nope'"),
        (("best", "nope"), "error: GET /studies/nope/best → 404: no study 'nope'"),
        (("submit", "--study", "nope", "--seeds", "1,2"), "error: POST /studies/nope/extend → 404"),
        (("submit", "nosuchpreset"), "error: POST /studies → 422: unknown preset 'nosuchpreset'; presets: "),
        (
            ("submit", "orhan2020-copy500", "--set", "steps=abc"),
            "→ 422: base.steps = 'abc' is not an integer",
        ),
    ):
        code, err = exit_of(capsys, *argv)
        assert code == EXIT_REFUSED and err.startswith(said.split("→")[0]) and said in err, (argv, err[-500:])
    monkeypatch.setenv("MEMSWEEP_API_TOKEN", "wrong")
    get_settings.cache_clear()
    code, err = exit_of(capsys, "studies")
    assert code == EXIT_REFUSED and err.startswith("error: GET /studies → 401: missing or wrong bearer token")


@pytest.mark.slow
def test_a_study_that_fails_exits_1_and_so_does_a_state_that_refuses_the_change(
    served: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`submit --wait` of a study that fails, a cancel of a study that has ended, a plan that cannot say
    where its trials would run, and a sync MLflow does not take: the command ran, and failed (1)."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"space": {"dims": {"lr": [1e-3]}}, "base": TINY}))
    code, err = exit_of(capsys, "submit", str(spec), "--wait", "--json")
    assert code == EXIT_FAILED, err[-2000:]
    study = json.loads(capsys.readouterr().out)
    assert study["state"] == "failed" and "cannot join the Ray cluster" in study["error"]
    for argv, said in (
        (("cancel", study["id"]), f"→ 409: study {study['id']} is failed: there is nothing to cancel"),
        (("sync", study["id"]), "→ 503: MLflow did not take the study's runs"),
        (
            ("plan", str(spec)),
            "error: the plan has no estimate: ConnectionError: cannot join the Ray cluster",
        ),
    ):
        code, err = exit_of(capsys, *argv)
        assert code == EXIT_FAILED and said in err, (argv, err[-500:])
