"""A real browser (Debian's chromium, headless, driven by Playwright) on the MLflow UI, loopback only:
the links memsweep serves open, from a fresh browser profile, on the model-training view (not MLflow 3's
GenAI overview): the study's runs table, and the parent run's page with its success metrics and its
child runs. Screenshots go to test-artifacts/ (the experiment's landing page also to /tmp)."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from service.core.spec import StudySpec
from tests.service.conftest import TINY

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]  # fmt: skip
LANDING_COPY = Path("/tmp/mlflow-landing.png")  # for a person to look at
# what MLflow 3's GenAI view shows and its model-training view does not: its side bar's evaluation runs
# and AI gateway, the experiment's LLM overview (token usage, "Detect issues in your traces")
GENAI_VIEW = ("Evaluation runs", "AI Gateway", "Token Usage", "Detect Issues")
WORKFLOW_TYPE_STORED = "mlflow.workflowType_v1"  # the UI's stored choice of view (localStorage)


def served_links(engine: Any, mlflow_uri: str, study_id: str) -> Any:
    """The study's MLflow links as REST serves them (`StudyService.links`, on the engine's ledger)."""
    from service.application.study_service import StudyService

    service = StudyService(engine, SimpleNamespace(tracking_uri=mlflow_uri))
    return service.links(engine.ledger.get_study(study_id))


def first_visit(browser: Any, url: str) -> Any:
    """A page on `url` in a fresh browser profile: no stored choice of the UI's view, no history."""
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    page = context.new_page()
    page.goto(url, wait_until="load")
    return page


def assert_training_view(page: Any) -> None:
    """The page (loaded) shows MLflow's model-training view, chosen by its link: nothing is stored."""
    body = page.inner_text("body")
    shown = [marker for marker in GENAI_VIEW if marker.lower() in body.lower()]
    assert not shown, f"{page.url} opened on the GenAI view: {shown}"
    assert "Model registry" in body, f"{page.url}: no model-training side bar"
    assert "workflowType=machine_learning" in page.url, page.url
    assert page.evaluate(f"localStorage.getItem('{WORKFLOW_TYPE_STORED}')") is None


@pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium: `make browser` (apt-get install chromium)"
)
def test_mlflow_ui_shows_the_study_and_its_trials(engine, mlflow_uri):
    from playwright.sync_api import sync_playwright

    spec = StudySpec.model_validate({
        "name": "ui-demo", "preset": "orhan2020-copy500", "models": ["chain", "orthogonal"],
        "base": {**{k: v for k, v in TINY.items() if k != "task"}, "seq_len": 30}, "dims": {"lr": [1e-3], "scale": [1.0]},
        "seeds": [1, 2], "success_threshold": 1 / 12,
    })  # fmt: skip
    study = engine.create_study(spec)
    engine.run_study(study.id)
    links = served_links(engine, mlflow_uri, study.id)
    assert links.experiment_url and links.run_url, links
    ARTIFACTS.mkdir(exist_ok=True)
    landing = ARTIFACTS / "mlflow-landing.png"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        # the experiment's link, first visit: the runs table, the parent run with its child runs under it
        page = first_visit(browser, links.experiment_url)
        page.get_by_text(f"study ui-demo [{study.id}]").first.wait_for(timeout=60_000)
        assert_training_view(page)
        page.screenshot(path=str(landing), full_page=True)
        parent_row = page.locator("[role='row']", has_text=f"study ui-demo [{study.id}]").first
        parent_row.locator(
            "button[data-component-id*='runnamecellrenderer']"
        ).first.click()  # unfold children
        for model in ("chain", "orthogonal"):
            for seed in (1, 2):
                page.get_by_text(f"{model} lr=0.001 scale=1.0 seed={seed}").first.wait_for(timeout=60_000)
        assert_training_view(page)
        page.screenshot(path=str(ARTIFACTS / "mlflow-runs.png"), full_page=True)
        page.context.close()
        # the parent run's link, first visit: its success metrics and its child runs
        page = first_visit(browser, links.run_url)
        page.get_by_text("success_count.chain").first.wait_for(timeout=60_000)
        page.get_by_text("succeeded").first.wait_for(timeout=60_000)
        page.get_by_text("chain lr=0.001 scale=1.0 seed=1").first.wait_for(timeout=60_000)
        assert_training_view(page)
        page.screenshot(path=str(ARTIFACTS / "mlflow-parent-run.png"), full_page=True)
        browser.close()
    shutil.copyfile(landing, LANDING_COPY)
    for shot in (landing, ARTIFACTS / "mlflow-runs.png", ARTIFACTS / "mlflow-parent-run.png"):
        assert shot.stat().st_size > 10_000
    print(
        f"screenshots: {landing} (the experiment's landing page; a copy in {LANDING_COPY}), "
        f"{ARTIFACTS / 'mlflow-runs.png'}, {ARTIFACTS / 'mlflow-parent-run.png'}"
    )


@pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium: `make browser` (apt-get install chromium)"
)
def test_mlflow_ui_shows_a_running_study_live(engine, mlflow_uri):
    """Mid-run: a training trial's child run is listed as running with its validation curve so far,
    and the parent run already has its live counts; then the study is cancelled (resumable)."""
    import threading
    import time

    from mlflow.tracking import MlflowClient
    from playwright.sync_api import sync_playwright

    from service.study.book import Stop
    from service.tracking.links import ui_link

    spec = StudySpec.model_validate({
        "name": "ui-live", "preset": "orhan2020-copy500", "models": ["chain"],
        "base": {**{k: v for k, v in TINY.items() if k != "task"}, "seq_len": 30, "steps": 200_000, "eval_every": 20},
        "dims": {"lr": [1e-3], "scale": [1.0]}, "seeds": [1],
    })  # fmt: skip
    study = engine.create_study(spec)
    stop = Stop()
    runner = threading.Thread(target=engine.run_study, args=(study.id,), kwargs={"stop": stop}, daemon=True)
    runner.start()
    client = MlflowClient(mlflow_uri)
    try:
        child = None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # the child run, with a few evaluations streamed into it
            trial = engine.ledger.trials(study.id)[0]
            if trial.mlflow_run_id:
                points = client.get_metric_history(trial.mlflow_run_id, "val_loss")
                if len(points) >= 3:
                    child = client.get_run(trial.mlflow_run_id)
                    break
            time.sleep(0.5)
        assert child is not None, "no child run with three evaluations within 180 s of the start"
        assert trial.status == "running" and child.info.status == "RUNNING"
        parent_id = engine.ledger.get_study(study.id).mlflow_run_id
        parent = client.get_run(parent_id)
        assert parent.data.metrics["trials"] == 1 and parent.data.metrics["finished"] == 0
        exp_id = child.info.experiment_id
        ARTIFACTS.mkdir(exist_ok=True)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(ui_link(mlflow_uri, exp_id, child.info.run_id), wait_until="load")
            page.get_by_text("chain lr=0.001 scale=1.0 seed=1").first.wait_for(timeout=60_000)
            page.get_by_text("val_loss").first.wait_for(timeout=60_000)  # its metric, still growing
            page.get_by_text("Running").first.wait_for(timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / "mlflow-live-child-run.png"), full_page=True)
            page.goto(ui_link(mlflow_uri, exp_id, parent_id), wait_until="load")
            page.get_by_text("success_count.chain").first.wait_for(timeout=60_000)
            page.get_by_text("finished").first.wait_for(timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / "mlflow-live-parent-run.png"), full_page=True)
            browser.close()
        later = client.get_metric_history(child.info.run_id, "val_loss")
        assert len(later) > len(points)  # the curve grew while we looked
    finally:
        stop.cancel()
        runner.join(timeout=120)
    assert not runner.is_alive()
    assert engine.ledger.get_study(study.id).state == "cancelled"
    assert (ARTIFACTS / "mlflow-live-child-run.png").stat().st_size > 10_000
