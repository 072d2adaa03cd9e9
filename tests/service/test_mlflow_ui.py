"""A real browser (Debian's chromium, headless, driven by Playwright) on the MLflow UI, loopback only:
the study's parent run shows its success metrics and its child runs. Screenshots go to test-artifacts/."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from service.spec import StudySpec
from tests.service.conftest import TINY

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]  # fmt: skip


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
    summary = engine.run_study(study.id)
    exp_id, parent = summary["mlflow"]["experiment_id"], summary["mlflow"]["run_id"]
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        # the experiment's runs table: the parent run, with its child runs folded under it
        page.goto(f"{mlflow_uri}/#/experiments/{exp_id}/runs", wait_until="load")
        page.get_by_text(f"study ui-demo [{study.id}]").first.wait_for(timeout=60_000)
        parent_row = page.locator("[role='row']", has_text=f"study ui-demo [{study.id}]").first
        parent_row.locator(
            "button[data-component-id*='runnamecellrenderer']"
        ).first.click()  # unfold children
        for model in ("chain", "orthogonal"):
            for seed in (1, 2):
                page.get_by_text(f"{model} lr=0.001 scale=1.0 seed={seed}").first.wait_for(timeout=60_000)
        page.screenshot(path=str(ARTIFACTS / "mlflow-runs.png"), full_page=True)
        # the parent run's page: its success metrics
        page.goto(f"{mlflow_uri}/#/experiments/{exp_id}/runs/{parent}", wait_until="load")
        page.get_by_text("success_count.chain").first.wait_for(timeout=60_000)
        page.get_by_text("succeeded").first.wait_for(timeout=60_000)
        page.screenshot(path=str(ARTIFACTS / "mlflow-parent-run.png"), full_page=True)
        browser.close()
    assert (ARTIFACTS / "mlflow-runs.png").stat().st_size > 10_000
    assert (ARTIFACTS / "mlflow-parent-run.png").stat().st_size > 10_000
    print(f"screenshots: {ARTIFACTS / 'mlflow-runs.png'}, {ARTIFACTS / 'mlflow-parent-run.png'}")
