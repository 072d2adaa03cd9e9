"""A real browser (Debian's chromium, headless, driven by Playwright) on the MLflow UI, loopback only:
the study's parent run shows its success metrics and its child runs. Screenshots go to test-artifacts/."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from service.core.spec import StudySpec
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

    spec = StudySpec.model_validate({
        "name": "ui-live", "preset": "orhan2020-copy500", "models": ["chain"],
        "base": {**{k: v for k, v in TINY.items() if k != "task"}, "seq_len": 30, "steps": 200_000, "eval_every": 20},
        "dims": {"lr": [1e-3], "scale": [1.0]}, "seeds": [1],
    })  # fmt: skip
    study = engine.create_study(spec)
    cancel = threading.Event()
    runner = threading.Thread(target=engine.run_study, args=(study.id, cancel), daemon=True)
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
            page.goto(f"{mlflow_uri}/#/experiments/{exp_id}/runs/{child.info.run_id}", wait_until="load")
            page.get_by_text("chain lr=0.001 scale=1.0 seed=1").first.wait_for(timeout=60_000)
            page.get_by_text("val_loss").first.wait_for(timeout=60_000)  # its metric, still growing
            page.get_by_text("Running").first.wait_for(timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / "mlflow-live-child-run.png"), full_page=True)
            page.goto(f"{mlflow_uri}/#/experiments/{exp_id}/runs/{parent_id}", wait_until="load")
            page.get_by_text("success_count.chain").first.wait_for(timeout=60_000)
            page.get_by_text("finished").first.wait_for(timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / "mlflow-live-parent-run.png"), full_page=True)
            browser.close()
        later = client.get_metric_history(child.info.run_id, "val_loss")
        assert len(later) > len(points)  # the curve grew while we looked
    finally:
        cancel.set()
        runner.join(timeout=120)
    assert not runner.is_alive()
    assert engine.ledger.get_study(study.id).state == "cancelled"
    assert (ARTIFACTS / "mlflow-live-child-run.png").stat().st_size > 10_000
