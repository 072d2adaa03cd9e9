"""`MemsweepClient()` takes the server's URL and token from the environment as `memsweep --url` does
(MEMSWEEP_API_URL, MEMSWEEP_API_TOKEN, or a `.env` file in the working directory); an argument given
wins, `token=None` (no token) included. It took both as arguments, and the URL was required. Against the
real server under uvicorn, with a token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from service.cli import commands
from service.cli.servers import free_port
from service.client import MemsweepAPIError, MemsweepClient
from service.core.settings import get_settings
from tests.service.servers import Server

TOKEN = "env-token-7a21"


@pytest.fixture
def environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No MEMSWEEP_API_URL, MEMSWEEP_API_TOKEN or MEMSWEEP_PORT, and a working directory with no `.env`."""
    for name in ("MEMSWEEP_API_URL", "MEMSWEEP_API_TOKEN", "MEMSWEEP_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_without_a_url_the_client_says_how_to_give_one(
    environment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for unset in (None, ""):  # unset, or set to nothing
        if unset is not None:
            monkeypatch.setenv("MEMSWEEP_API_URL", unset)
        with pytest.raises(ValueError) as refused:
            MemsweepClient()
        assert str(refused.value) == (
            "url: none given and MEMSWEEP_API_URL is not set; give the server's URL, "
            "MemsweepClient(url='http://127.0.0.1:8000'), or set MEMSWEEP_API_URL"
        )
    monkeypatch.setenv("MEMSWEEP_API_URL", "127.0.0.1:8731")  # the environment's URL, named as such
    with pytest.raises(ValueError, match=r"^url '127\.0\.0\.1:8731' \(MEMSWEEP_API_URL\) lacks its scheme"):
        MemsweepClient()
    with pytest.raises(ValueError, match=r"^url '127\.0\.0\.1:8731' lacks its scheme"):  # the argument's
        MemsweepClient("127.0.0.1:8731")
    monkeypatch.setenv("MEMSWEEP_API_URL", "http://127.0.0.1:8731/")
    assert MemsweepClient().url == "http://127.0.0.1:8731"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The real server, whose routes but /health want TOKEN; it runs no study."""
    s = Server(
        tmp_path_factory.mktemp("env-home"), "http://127.0.0.1:9", token=TOKEN, max_parallel_studies="0"
    )
    s.start()
    yield s
    s.stop()


@pytest.mark.slow
def test_the_url_and_the_token_come_from_the_environment(
    server: Server, environment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMSWEEP_API_URL", server.url)
    monkeypatch.setenv("MEMSWEEP_API_TOKEN", TOKEN)
    with MemsweepClient() as client:
        assert client.url == server.url
        assert client.studies_page()["total"] == 0  # a route that wants the token
    monkeypatch.delenv("MEMSWEEP_API_TOKEN")
    with MemsweepClient() as client, pytest.raises(MemsweepAPIError) as refused:
        client.studies_page()
    assert refused.value.status == 401


@pytest.mark.slow
def test_an_argument_wins_over_the_environment(
    server: Server, environment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A URL and a token given are used whatever the environment holds; `token=None` sends none."""
    monkeypatch.setenv("MEMSWEEP_API_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("MEMSWEEP_API_TOKEN", "wrong")
    with MemsweepClient(server.url, token=TOKEN) as client:
        assert client.studies_page()["total"] == 0
    with MemsweepClient(server.url) as client, pytest.raises(MemsweepAPIError) as refused:
        client.studies_page()  # the environment's token, as the URL given left it
    assert refused.value.status == 401
    monkeypatch.setenv("MEMSWEEP_API_TOKEN", TOKEN)
    with MemsweepClient(server.url, token=None) as client:
        with pytest.raises(MemsweepAPIError) as refused:
            client.studies_page()
        assert refused.value.status == 401
        assert client.health()["status"] == "ok"  # /health wants no token
    monkeypatch.setenv("MEMSWEEP_API_URL", server.url)
    monkeypatch.setenv("MEMSWEEP_API_TOKEN", "wrong")
    with MemsweepClient(token=TOKEN) as client:  # the environment's URL, the token given
        assert client.url == server.url and client.studies_page()["total"] == 0


@pytest.mark.slow
def test_a_dotenv_file_is_read_by_the_client_as_by_the_cli(
    server: Server,
    environment: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (environment / ".env").write_text(f"MEMSWEEP_API_URL={server.url}\nMEMSWEEP_API_TOKEN={TOKEN}\n")
    with MemsweepClient() as client:
        assert client.url == server.url and client.studies_page()["total"] == 0
    monkeypatch.setenv("MEMSWEEP_HOME", str(environment / "home"))
    monkeypatch.setattr(commands, "prepare_ray_process", lambda settings: None)
    get_settings.cache_clear()  # the CLI's settings read again, from this directory (and after the test)
    request.addfinalizer(get_settings.cache_clear)
    capsys.readouterr()
    assert commands.main(["studies"]) == 0
    assert capsys.readouterr().out.startswith("no studies yet: `memsweep submit PRESET --url URL` makes one")
    assert not (environment / "home").exists()  # the server's answer, not this machine's ledger
