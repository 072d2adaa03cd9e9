"""The API's own pages: /docs is served whole by the server (Swagger UI's files from the installed
`swagger-ui-py`), so it renders on a machine that reaches nothing but the server; FastAPI's page loaded
them from a CDN and was blank offline. A real browser (Debian's chromium, headless) with every request
beyond loopback refused opens /docs of the real server under uvicorn."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from service.api import create_app
from service.api.routes.docs import SWAGGER_FILES
from tests.service.servers import Server
from tests.service.test_api_units import TOKEN, settings

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]  # fmt: skip


@pytest.fixture
def pages(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(settings(tmp_path, api_token=SecretStr(TOKEN)))) as c:
        yield c


def test_docs_loads_swagger_ui_from_the_server_not_a_cdn(pages: TestClient) -> None:
    page = pages.get("/docs")
    assert page.status_code == 200 and "cdn" not in page.text.lower()
    for name, media in SWAGGER_FILES.items():  # open, as the page is: a browser loads them without a token
        assert f"/docs/static/{name}" in page.text
        served = pages.get(f"/docs/static/{name}")
        assert served.status_code == 200 and served.headers["content-type"].startswith(media), name
    assert b"SwaggerUIBundle" in pages.get("/docs/static/swagger-ui-bundle.js").content
    # nothing else of the package's folder is served (its editor bundles, its index page)
    refused = pages.get("/docs/static/swagger-editor-bundle.js")
    assert refused.status_code == 404 and "swagger-ui-bundle.js" in refused.json()["message"]
    assert pages.get("/docs/static/..%2F..%2Fcore.py").status_code == 404


def test_docs_behind_a_proxy_links_its_files_under_the_root_path(tmp_path: Path) -> None:
    with TestClient(create_app(settings(tmp_path)), root_path="/memsweep") as c:
        page = c.get("/docs").text
    assert "/memsweep/docs/static/swagger-ui-bundle.js" in page and "/memsweep/openapi.json" in page


@pytest.mark.slow
@pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium: `make browser` (apt-get install chromium)"
)
def test_docs_renders_in_a_browser_that_reaches_only_the_server(tmp_path: Path, mlflow_uri: str) -> None:
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
            browser.close()
    finally:
        server.stop()
    assert not refused, refused
    documented = len(create_app(settings(tmp_path / "schema")).openapi()["paths"])
    assert operations >= documented, (operations, documented)
