"""The success query (`service.core.criterion_query`) as each layer carries it: the REST routes' query
parameters (names, bounds, descriptions and order as they were as loose parameters), the CLI's flags,
this machine's ledger and the Python client (its keywords, or the one object), each refusing alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from service.api import create_app
from service.cli import commands
from service.cli.local import LocalStudies
from service.client import MemsweepAPIError, MemsweepClient
from service.core.criterion_query import OWN, CriterionQuery, SuccessQuery
from tests.service.test_answers import Cli, served  # noqa: F401  (a fixture)
from tests.service.test_api_units import finish_all, grid, settings


def parameters(path: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = create_app().openapi()["paths"][path]["get"]["parameters"]
    return found


def test_the_query_is_the_routes_query_parameters_in_their_place() -> None:
    """Each route's parameters, in order, as the loose `Annotated` aliases declared them; a curve
    against budget takes no budget, and `reference` (a row of the table, not a criterion) stays beside."""
    names = {path: [p["name"] for p in parameters(path)] for path in
             ("/studies/{study_id}/success", "/studies/{study_id}/success/budget", "/compare")}  # fmt: skip
    assert names == {
        "/studies/{study_id}/success": ["study_id", "fraction", "threshold", "baseline", "at_step", "reference",
                                        "format"],
        "/studies/{study_id}/success/budget": ["study_id", "fraction", "threshold", "baseline"],
        "/compare": ["studies", "by", "fraction", "threshold", "baseline", "at_step", "log", "format"],
    }  # fmt: skip
    fraction, threshold, baseline, at_step = parameters("/compare")[2:6]
    assert fraction["required"] is False and fraction["description"] == (
        "judge under this fraction of the baseline instead"
    )
    assert fraction["schema"]["anyOf"][0] == {"type": "number", "maximum": 1.0, "exclusiveMinimum": 0.0}
    assert threshold["schema"]["anyOf"][0] == {"type": "number", "exclusiveMinimum": 0.0}
    assert baseline["schema"]["anyOf"][0] == {"type": "string", "maxLength": 64}
    assert at_step["schema"]["anyOf"][0] == {"type": "integer", "minimum": 1}


def test_the_query_is_frozen_and_names_only_what_judges_or_counts() -> None:
    query = SuccessQuery(fraction=0.25, at_step=100)
    with pytest.raises(ValidationError):
        query.fraction = 0.5  # frozen: a query passed down is the one asked
    assert set(CriterionQuery.model_fields) == {"fraction", "threshold", "baseline"}
    assert set(SuccessQuery.model_fields) == {"fraction", "threshold", "baseline", "at_step"}
    assert SuccessQuery() == OWN and query != OWN
    for bad in ({"fraction": 0}, {"fraction": 1.5}, {"threshold": float("inf")}, {"at_step": 0}):
        with pytest.raises(ValidationError):
            SuccessQuery(**bad)


def test_a_server_and_this_machines_ledger_refuse_a_bad_value_alike(
    served: tuple[TestClient, Cli],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The ledger counted `--at-step 0` at each run's end, where a server refused `?at_step=0`."""
    c, cli = served
    sid = c.post("/studies", json=grid()).json()["id"]
    finish_all(c, sid)
    r = c.get(f"/studies/{sid}/success", params={"at_step": 0})
    assert (
        r.status_code == 422 and r.json()["detail"][0]["msg"] == "Input should be greater than or equal to 1"
    )
    for argv in (["success", sid, "--at-step", "0"], ["compare", sid, sid, "--at-step", "0"]):
        capsys.readouterr()
        with pytest.raises(SystemExit) as refused:
            commands.main(argv)
        assert refused.value.code == 2
        assert capsys.readouterr().err == "error: --at-step 0: Input should be greater than or equal to 1\n"
    # a criterion's bounds in its own words, as the local ledger said them before the query refused them
    capsys.readouterr()
    with pytest.raises(SystemExit):
        commands.main(["success", sid, "--fraction", "1.5"])
    assert capsys.readouterr().err.startswith(
        "error: --fraction 1.5: success fraction = 1.5 must be in (0, 1]: a run succeeds when its final validation"
    )
    # a misspelt parameter is still named, with the query's fields among those the route takes
    r = c.get(f"/studies/{sid}/success", params={"fractoin": 0.3})
    assert r.status_code == 422 and "did you mean 'fraction'?" in r.text
    assert "takes at_step, baseline, format, fraction, reference, threshold" in r.text
    assert "at 10 steps" in cli("success", sid, "--at-step", "10")


def test_the_client_and_the_ledger_take_the_keywords_or_the_one_query(tmp_path: Path) -> None:
    """The published keywords still work; `query=` says the same in one object; both at once: refused.
    The client sends a keyword unchecked (a server of another version judges by its own bounds)."""
    with TestClient(create_app(settings(tmp_path))) as c:
        a = c.post("/studies", json=grid()).json()["id"]
        b = c.post("/studies", json=grid(name="B")).json()["id"]
        finish_all(c, a)
        finish_all(c, b)
        client, local = MemsweepClient("http://testserver", http=c), LocalStudies(settings(tmp_path))
        asked = SuccessQuery(fraction=0.7, at_step=10)
        expected = c.get(f"/studies/{a}/success", params={"fraction": 0.7, "at_step": 10}).json()
        for studies in (client, local):
            assert studies.success(a, fraction=0.7, at_step=10) == expected
            assert studies.success(a, query=asked) == expected
            assert studies.comparison([a, b], query=asked) == studies.comparison(
                [a, b], fraction=0.7, at_step=10
            )
            with pytest.raises(TypeError, match="give query= or fraction, not both"):
                studies.success(a, fraction=0.5, query=asked)
        assert client.success_vs_budget(a, query=CriterionQuery(threshold=0.5)) == client.success_vs_budget(
            a, threshold=0.5
        )
        assert client.success_table(a, query=asked).attrs["at_step"] == 10
        with pytest.raises(MemsweepAPIError) as refused:
            client.success(a, fraction=5)
        assert refused.value.status == 422
        with pytest.raises(ValidationError):  # the ledger checks what a server would
            local.success(a, fraction=5)
