"""`GET /studies?state=` listed the study states written out a second time (a Literal beside
`StudyState`), so a state added to `StudyState` would have been refused as a filter. It is made of
`StudyState`'s values and `queued`: a state added there is a filter value at once, and the OpenAPI
schema stays an enum of those values."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fastapi.testclient import TestClient

from service.api import create_app
from service.core.states import QUEUED, StudyState
from tests.service.test_api_units import settings

#: in a fresh interpreter: `service.core.states` with one more study state, then the filter's values
WITH_A_NEW_STATE = """
import json, sys, types
from pathlib import Path
import service.core
source = Path(service.core.__file__).with_name("states.py").read_text()
source = source.replace('    CANCELLED = "cancelled"\\n', '    CANCELLED = "cancelled"\\n    PAUSED = "paused"\\n', 1)
states = types.ModuleType("service.core.states")
states.__file__ = "states.py"
sys.modules["service.core.states"] = states
exec(compile(source, "states.py", "exec"), states.__dict__)
from typing import get_args
from service.api.routes.studies import ListedState
print(json.dumps(list(get_args(ListedState))))
"""


def test_the_listings_filter_is_every_study_state_and_queued(tmp_path: Path) -> None:
    with TestClient(create_app(settings(tmp_path))) as c:
        (param,) = [p for p in c.get("/openapi.json").json()["paths"]["/studies"]["get"]["parameters"]
                    if p["name"] == "state"]  # fmt: skip
        enum, none = param["schema"]["anyOf"]
        assert enum == {"type": "string", "enum": [*StudyState, QUEUED]} and none == {"type": "null"}
        for state in enum["enum"]:
            assert c.get("/studies", params={"state": state}).status_code == 200, state
        assert c.get("/studies", params={"state": "paused"}).status_code == 422


def test_a_new_study_state_is_a_filter_value_at_once() -> None:
    out = subprocess.run(
        [sys.executable, "-c", WITH_A_NEW_STATE], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert json.loads(out.splitlines()[-1]) == [*StudyState, "paused", QUEUED]
