"""The success table's CSV export dropped the table's `notes`: a researcher who exported a count at a
budget past every run's end lost the note that each run was counted at its end. The notes are a
`# notes:` header line, beside the criterion's; pandas reads the table as before (`comment="#"`),
`tables.read_csv` has them in `frame.attrs`."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from service.api import create_app
from service.reports.tables import read_csv
from tests.service.test_api_units import finish_all, grid, settings


@pytest.fixture
def client(tmp_path: Path) -> Any:
    with TestClient(create_app(settings(tmp_path))) as c:
        yield c


def test_the_success_csv_carries_the_tables_notes_and_reads_cleanly(client: TestClient) -> None:
    study = client.post("/studies", json=grid(name="notes")).json()["id"]
    finish_all(client, study)  # every run trained 20 steps
    table = client.get(f"/studies/{study}/success", params={"at_step": 99_999}).json()
    (note,) = table["notes"]
    assert "counted at its end" in note
    text = client.get(f"/studies/{study}/success", params={"at_step": 99_999, "format": "csv"}).text
    assert f"# notes: {note}\n" in text
    frame = read_csv(io.StringIO(text))
    assert frame.attrs["notes"] == note
    plain = pd.read_csv(io.StringIO(text), comment="#")
    assert list(plain.columns) == list(frame.columns) and "notes" not in plain.columns
    assert len(plain) == 1 + len(table["by_model"]) + sum(
        len(values) for fields in table["by_value"].values() for values in fields.values()
    )
    assert plain[plain.table == "total"].iloc[0].succeeded == table["total"]["succeeded"]
    without = client.get(f"/studies/{study}/success", params={"format": "csv"}).text
    assert "# notes:" not in without  # a table without notes has no such line
