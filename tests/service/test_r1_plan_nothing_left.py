"""A plan's model with nothing left to run: no units, so no way of training to show (it read "solo")."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.api import create_app
from service.cli.console import print_plan
from tests.service.test_api_units import finish_all, grid, settings


def test_a_model_with_nothing_left_to_run_trains_neither_fused_nor_solo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with TestClient(create_app(settings(tmp_path))) as c:
        study = c.post("/studies", json=grid(concurrency=2)).json()["id"]
        finish_all(c, study)  # chain's trials done; orth's lr 1e-2 failed: they train again
        plan = c.post("/studies?dry_run=true", json=grid(name="again", concurrency=2)).json()
        fused = c.get("/openapi.json").json()["components"]["schemas"]["PlanModel"]["properties"]["fused"]
    chain, orth = plan["by_model"]["chain"], plan["by_model"]["orth"]
    assert (chain["to_run"], chain["units"], chain["fused"]) == (0, 0, None)
    assert orth["to_run"] == 2 and orth["units"] > 0 and orth["fused"] is not None
    assert {"type": "null"} in fused["anyOf"] and "null: none of its trials is left to run" in fused[
        "description"
    ]
    monkeypatch.setenv("COLUMNS", "200")
    capsys.readouterr()
    print_plan(plan)
    rows = {line.split("│")[1].strip(): line for line in capsys.readouterr().out.splitlines() if "│" in line}
    assert [c.strip() for c in rows["chain"].split("│")[2:6]] == ["4", "0", "0", "–"]
    assert "solo" not in rows["chain"] and "solo" in rows["orth"]
