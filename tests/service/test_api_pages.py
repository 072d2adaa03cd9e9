"""The API's own pages: /docs and /redoc are served whole by the server (Swagger UI's files and ReDoc's
from the installed `fastapi-offline`), so they render on a machine that reaches
nothing but the server; FastAPI's pages loaded them from CDNs and were blank offline. A real browser
(Debian's chromium, headless) with every request beyond loopback refused opens both pages of the real
server under uvicorn."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from service.api import create_app
from service.api.routes.docs import STATIC_FILES
from tests.service.servers import Server
from tests.service.test_api_units import TOKEN, settings

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: the one request beyond the server a page makes: ReDoc's "API docs by Redocly" badge, which ReDoc 2's
#: bundle loads from its CDN and leaves out when it does not load (no option turns it off)
REDOC_BADGE = "https://cdn.redoc.ly/redoc/logo-mini.svg"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]  # fmt: skip


@pytest.fixture
def pages(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(settings(tmp_path, api_token=SecretStr(TOKEN)))) as c:
        yield c


def test_docs_and_redoc_load_their_files_from_the_server_not_a_cdn(pages: TestClient) -> None:
    docs, redoc = pages.get("/docs"), pages.get("/redoc")
    for page in (docs, redoc):
        assert page.status_code == 200 and "cdn" not in page.text.lower() and "googleapis" not in page.text
    for name, media in STATIC_FILES.items():  # open, as the pages are: a browser loads them without a token
        assert f"/docs/static/{name}" in docs.text + redoc.text
        served = pages.get(f"/docs/static/{name}")
        assert served.status_code == 200 and served.headers["content-type"].startswith(media), name
    assert b"SwaggerUIBundle" in pages.get("/docs/static/swagger-ui-bundle.js").content
    assert b"Redoc" in pages.get("/docs/static/redoc.standalone.js").content
    # nothing else of the package is served (its modules, its folder's other files)
    refused = pages.get("/docs/static/core.py")
    assert refused.status_code == 404 and "redoc.standalone.js" in refused.json()["message"]
    assert pages.get("/docs/static/..%2F..%2Fcore.py").status_code == 404


def test_the_pages_behind_a_proxy_link_their_files_under_the_root_path(tmp_path: Path) -> None:
    with TestClient(create_app(settings(tmp_path)), root_path="/memsweep") as c:
        docs, redoc = c.get("/docs").text, c.get("/redoc").text
    assert "/memsweep/docs/static/swagger-ui-bundle.js" in docs and "/memsweep/openapi.json" in docs
    assert "/memsweep/docs/static/redoc.standalone.js" in redoc and "/memsweep/openapi.json" in redoc


@pytest.mark.slow
@pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium: `make browser` (apt-get install chromium)"
)
def test_docs_and_redoc_render_in_a_browser_that_reaches_only_the_server(
    tmp_path: Path, mlflow_uri: str
) -> None:
    from playwright.sync_api import Route, sync_playwright

    server = Server(tmp_path / "home", mlflow_uri, token=TOKEN, max_parallel_studies="0").start()
    refused: list[str] = []

    def loopback_only(route: Route) -> None:
        if urlsplit(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:  # what an offline cluster's browser would not get
            refused.append(route.request.url)
            route.abort()

    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
            page = browser.new_page()
            page.route("**/*", loopback_only)
            page.goto(f"{server.url}/docs", wait_until="load")
            page.locator(".opblock-summary-path", has_text="/studies/{study_id}/success").first.wait_for(
                timeout=60_000
            )
            operations = page.locator(".opblock").count()
            page.goto(f"{server.url}/redoc", wait_until="load")
            # ReDoc's page, once it has read the schema: an operation's path, and a menu entry per operation
            page.get_by_text("/studies/{study_id}/success", exact=True).first.wait_for(timeout=60_000)
            redoc_operations = page.locator("li[data-item-id*='/operation/']").count()
            browser.close()
    finally:
        server.stop()
    assert set(refused) <= {REDOC_BADGE}, refused
    schema = create_app(settings(tmp_path / "schema")).openapi()["paths"]
    assert operations >= len(schema), (operations, len(schema))
    assert redoc_operations == sum(len(ops) for ops in schema.values()), redoc_operations
