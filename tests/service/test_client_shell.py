"""What a researcher driving a server from a client shell met: `--wait` quitting when the server
restarted, errors that named the wrong cause (a URL without its scheme, another server's HTML page, an
empty study id, a 413 without `message`), the CLI on a machine with no ledger, the `queued` filter, and a
budget past every run's end. Over FastAPI's TestClient on a real SQLite ledger, `memsweep` on a home of
its own, and the real server under uvicorn (restarted on its port) for the wait."""

from __future__ import annotations

import http.server
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api import create_app
from service.cli import commands
from service.cli.servers import LocalServer
from service.client import MemsweepAPIError, MemsweepClient, NotMemsweepError
from service.core.settings import get_settings
from service.store.ledger import Ledger
from tests.service.servers import Server
from tests.service.test_answers import Cli, finish, served  # noqa: F401  (a fixture)
from tests.service.test_api_units import finish_all, grid, settings

NOWHERE = "http://127.0.0.1:9"  # no MLflow: these servers run no study


# ----- a wait rides out a restart ----------------------------------------------------------------------
@pytest.mark.slow
def test_a_wait_rides_out_a_server_restart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`memsweep submit --wait` (client.wait) quit with "the server does not answer" when the server
    restarted, while the study resumed and finished there: it polls on, said on stderr, and ends with
    the study."""
    first = Server(tmp_path / "home", NOWHERE, max_parallel_studies="0").start()
    client = MemsweepClient(first.url)
    sid = client.submit(grid())["id"]
    ended: dict[str, Any] = {}

    def wait() -> None:
        try:
            ended["study"] = client.wait(sid, poll=0.2, progress=False, patience=120)
        except Exception as exc:  # what the old wait raised: said by the assertion below
            ended["error"] = exc

    waiting = threading.Thread(target=wait)
    waiting.start()
    try:
        first.stop()
        waiting.join(timeout=2)  # a while without a server: the old wait ended here
        Ledger(f"sqlite:///{tmp_path / 'home' / 'ledger.db'}").update_study(sid, state="done")
        again = LocalServer(first.port, first.log, first.env).start()  # the same server, restarted
        try:
            waiting.join(timeout=60)
        finally:
            again.stop()
    finally:
        first.stop()
    assert "error" not in ended, ended
    assert ended["study"]["id"] == sid and ended["study"]["state"] == "done"
    said = capsys.readouterr().err
    assert f"the server at {first.url} does not answer" in said and "waiting for it up to 120 s" in said
    assert f"the server at {first.url} answers again" in said


def test_a_wait_gives_up_on_a_server_that_stays_away(capsys: pytest.CaptureFixture[str]) -> None:
    """Only a server away for longer than the wait's patience ends it: with the error, said on stderr.
    A URL that never answered is a wrong one: its error at once, not five minutes of waiting."""
    import json

    from service.cli.servers import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with MemsweepClient(url) as client, pytest.raises(Exception) as failed:
        client.wait("abc123", poll=0.1, progress=False, patience=60)
    assert type(failed.value).__name__ == "ConnectError" and capsys.readouterr().err == ""

    study = {"id": "abc123", "state": "running", "active": True, "expected_trials": 2, "eta_seconds": None,
             "counts": {"running": 1, "failed": 0, "succeeded": 0, "finished": 0}}  # fmt: skip

    class OnceThenGone(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the study, running; then the server goes away for good
            body = json.dumps(study).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            threading.Thread(target=lambda: (server.shutdown(), server.server_close())).start()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OnceThenGone)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    with MemsweepClient(url) as client, pytest.raises(Exception) as failed:
        client.wait("abc123", poll=0.1, progress=False, patience=0.5)
    assert type(failed.value).__name__ == "ConnectError"
    said = capsys.readouterr().err
    assert f"the server at {url} does not answer" in said and "waiting for it up to 0.5 s" in said
    assert f"the server at {url} has not answered for 0.5 s; giving up" in said


# ----- errors that name their cause --------------------------------------------------------------------
def test_a_url_without_its_scheme_is_said_to_lack_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--url 127.0.0.1:8731` said "is `memsweep serve` running?" of a server that was."""
    with pytest.raises(ValueError, match=r"lacks its scheme .*write it as http://127\.0\.0\.1:8731"):
        MemsweepClient("127.0.0.1:8731")
    with pytest.raises(ValueError, match="write it as http://localhost:8731"):
        MemsweepClient("localhost:8731")
    monkeypatch.setenv("MEMSWEEP_HOME", str(tmp_path))
    monkeypatch.setattr(commands, "prepare_ray_process", lambda settings: None)
    get_settings.cache_clear()
    try:
        with pytest.raises(SystemExit) as refused:
            commands.main(["status", "abc", "--url", "127.0.0.1:8731"])
    finally:
        get_settings.cache_clear()
    said = str(refused.value)
    assert said.startswith("error: --url (or MEMSWEEP_API_URL): url '127.0.0.1:8731' lacks its scheme")
    assert "http://127.0.0.1:8731" in said and "memsweep serve" not in said


@pytest.fixture
def not_memsweep(tmp_path: Path) -> Iterator[str]:
    """Another web server on loopback (Python's own: HTML pages for what it lacks, as MLflow's 404)."""
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "health").write_text("ok")  # a 200 that is not JSON

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(tmp_path / "www"), **kwargs)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_that_is_not_memsweep_is_said_so_without_its_page(not_memsweep: str) -> None:
    """`--url` at an MLflow server printed its HTML 404 page as the error; a 200 that is not JSON raised
    a bare JSONDecodeError."""
    with MemsweepClient(not_memsweep) as client:
        with pytest.raises(NotMemsweepError) as refused:
            client.get("abc123")
        said = str(refused.value)
        assert said.startswith(f"GET /studies/abc123 → 404: {not_memsweep} answered (404, text/html")
        assert "not as memsweep does: a proxy in front of the server refused" in said
        assert "another server is at this URL" in said and "not JSON" in said and "GET /health" in said
        assert "<" not in said  # no page
        with pytest.raises(NotMemsweepError, match=r"→ 200: .* does not answer as a memsweep server"):
            client.health()
        with pytest.raises(NotMemsweepError, match="404"):
            client.ready()
        assert isinstance(refused.value, MemsweepAPIError)  # what the CLI already answers in one line


def test_an_empty_study_id_is_refused_naming_it(client: TestClient) -> None:
    """`client.get("")` raised a bare JSONDecodeError (GET /studies/ redirects to the list; through
    FastAPI's TestClient, which follows it, it even answered the list as if it were a study)."""
    api = MemsweepClient("http://testserver", http=client)
    for call in (lambda: api.get(""), lambda: api.best(" "), lambda: api.wait("", progress=False)):
        with pytest.raises(ValueError, match=r"study_id '\s*' is empty: give a study's id"):
            call()


def test_a_body_over_the_limit_answers_the_shape_of_every_error(tmp_path: Path) -> None:
    """docs/rest.md: every error answer has `message`; the 413 of a declared Content-Length over
    MEMSWEEP_MAX_REQUEST_BYTES had `detail` alone."""
    said = "the request body is over the limit of 1,000 bytes (MEMSWEEP_MAX_REQUEST_BYTES)"
    with TestClient(create_app(settings(tmp_path, max_request_bytes=1000))) as c:
        declared = c.post("/studies", content=b"x" * 2000, headers={"content-type": "application/json"})
        streamed = c.post(
            "/studies", content=iter([b"{", b" " * 2000, b"}"]), headers={"content-type": "application/json"}
        )  # no Content-Length: counted as it comes
        for r in (declared, streamed):
            assert r.status_code == 413 and r.json()["message"].startswith(said), r.text
            assert r.json()["detail"] == r.json()["message"]
        with pytest.raises(MemsweepAPIError, match=re.escape(f"→ 413: {said}")):
            MemsweepClient("http://testserver", http=c).submit({"name": "x" * 2000})


# ----- the CLI on a machine without a ledger -------------------------------------------------------------
@pytest.fixture
def no_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Path:
    """`memsweep` on a home no study ever ran in, and no server named: the ledger's path."""
    monkeypatch.setenv("MEMSWEEP_HOME", str(tmp_path / "home"))
    for name in ("MEMSWEEP_API_URL", "MEMSWEEP_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(commands, "prepare_ray_process", lambda settings: None)
    get_settings.cache_clear()
    request.addfinalizer(get_settings.cache_clear)
    return tmp_path / "home" / "ledger.db"


def test_the_study_list_says_it_read_this_machines_ledger_and_makes_none(
    no_ledger: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With no MEMSWEEP_API_URL, `memsweep studies` made a ledger and said "no studies yet: `memsweep
    run PRESET`…", as if training here were the one way on: a client of a server was not told that
    this machine's ledger had been read, nor how to ask the server."""
    assert commands.main(["studies"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert said.startswith(
        f"no studies in this machine's ledger ({no_ledger}): `memsweep run PRESET` makes one here; to ask "
        "a server, give --url URL"
    )
    assert "MEMSWEEP_API_URL" in said
    assert not no_ledger.exists()
    assert commands.main(["studies", "--state", "done"]) == 0
    assert capsys.readouterr().out.startswith(f"no study is done in this machine's ledger ({no_ledger})")
    with pytest.raises(SystemExit, match=r"this machine has no ledger yet .*give --url URL"):
        commands.main(["status", "abc123"])
    assert not no_ledger.exists()


def test_a_run_of_a_study_this_ledger_lacks_points_to_the_server(no_ledger: Path) -> None:
    """`memsweep run --study ID` of a server's study said "error: no study 'ID'"."""
    with pytest.raises(SystemExit) as refused:
        commands.main(["run", "--study", "abc123"])
    said = str(refused.value)
    assert f"no study 'abc123' in this machine's ledger ({no_ledger}), which has not been made" in said
    assert "`memsweep submit --study abc123 --url URL`" in said and "MEMSWEEP_API_URL" in said
    assert not no_ledger.exists()
    no_ledger.parent.mkdir()
    Ledger(f"sqlite:///{no_ledger}")  # a ledger here, without that study
    with pytest.raises(SystemExit) as refused:
        commands.main(["run", "--study", "abc123"])
    assert f"no study 'abc123' in this machine's ledger ({no_ledger}); `memsweep run` trains here" in str(
        refused.value
    )


# ----- queued, as a filter ------------------------------------------------------------------------------
def test_queued_is_a_filter_of_the_study_list(client: TestClient) -> None:
    """`memsweep studies` shows a study accepted and not started as `queued`; `?state=queued` was refused."""
    first, second = (client.post("/studies", json=grid(name=n)).json()["id"] for n in ("a", "b"))
    finish_all(client, first)  # out of the queue (this server runs nothing: its queue is what it holds)
    page = client.get("/studies", params={"state": "queued"})
    assert page.status_code == 200, page.text
    assert page.json()["total"] == 1 and [s["id"] for s in page.json()["items"]] == [second]
    assert page.json()["items"][0]["queued"] is True
    assert [s["id"] for s in client.get("/studies", params={"state": "done"}).json()["items"]] == [first]
    api = MemsweepClient("http://testserver", http=client)
    assert [s["id"] for s in api.studies(state="queued")] == [second]
    assert api.studies_page("queued", offset=1)["items"] == []
    refused = client.get("/studies", params={"state": "waiting"}).json()["message"]
    assert "'pending', 'running', 'done', 'failed', 'cancelled' or 'queued'" in refused


def test_the_cli_takes_queued_and_says_only_a_server_queues(
    no_ledger: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert commands.main(["studies", "--state", "queued"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert said.startswith("no study is queued here: a server queues the studies it is sent; to ask a server")


# ----- a budget past every run's end -------------------------------------------------------------------
def test_a_budget_past_every_runs_end_says_each_is_counted_at_its_end(
    served: tuple[TestClient, Cli],  # noqa: F811
) -> None:
    """`success --at-step 99999` on runs of 10 steps printed "successes at 99,999 steps" and counted
    each at its end without a word."""
    c, cli = served
    sid = c.post("/studies", json=grid()).json()["id"]
    finish(c, sid, lambda model, lr, seed: ("done", 0.01 * seed))
    past = c.get(f"/studies/{sid}/success", params={"at_step": 99999}).json()
    assert past["notes"] == [
        "at_step 99,999 is past the end of every run that ended (the longest trained 10 steps): each is "
        "counted at its end, as without at_step"
    ]
    assert past["by_model"] == c.get(f"/studies/{sid}/success").json()["by_model"]
    assert c.get(f"/studies/{sid}/success", params={"at_step": 10}).json()["notes"] == []
    assert c.get(f"/studies/{sid}/success").json()["notes"] == []
    printed = cli("success", sid, "--at-step", "99999")
    assert "successes at 99,999 steps" in printed
    assert (
        "note: at_step 99,999 is past the end of every run that ended (the longest trained 10 steps)"
        in printed
    )
    frame = MemsweepClient("http://testserver", http=c).success_table(sid, at_step=99999)
    assert frame.attrs["notes"] == past["notes"]


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(settings(tmp_path))) as c:
        yield c


def test_a_grid_over_the_limit_says_what_makes_it_smaller() -> None:
    """A grid over the server's limit was told to "raise max_trials", which on a grid only caps it lower."""
    from service.core.errors import StudyError
    from service.core.spec import StudySpec
    from service.study.search import study_space
    from tests.service.conftest import TINY

    spec = StudySpec.model_validate(
        {"space": {"dims": {"lr": [1e-3, 1e-2, 1e-1]}}, "base": TINY, "seeds": [1, 2]}
    )
    with pytest.raises(StudyError) as over:
        study_space(spec, 4)
    said = str(over.value)
    assert "holds 6 trials (points × seeds), over the limit of 4 (MEMSWEEP_MAX_GRID_SIZE)" in said
    assert "with a sampler" in said and "raise max_trials" not in said
    with pytest.raises(StudyError, match=r"over its max_trials of 5; .*raise max_trials \(or leave it out\)"):
        study_space(spec.model_copy(update={"max_trials": 5}), 4_000)


# `memsweep sync` on a machine where nothing ran made a ledger (and its home) to then say "no study": like
# the reads, it says this machine has no ledger, naming where it looked, and makes nothing.


def test_a_sync_where_no_ledger_was_made_says_so_and_makes_none(no_ledger: Path) -> None:
    with pytest.raises(SystemExit) as refused:
        commands.main(["sync", "abc123"])
    said = str(refused.value)
    assert f"this machine has no ledger yet ({no_ledger})" in said and "give --url URL" in said, said
    assert not no_ledger.exists() and not no_ledger.parent.exists()
