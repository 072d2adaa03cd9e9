"""Each concept has one source that its front ends read: the success cell's fields (`SuccessCell`), read by
the CSV and by the client's frame; the plugin contract check (`service.study.plugins.check_report`), run by
`memsweep plugins check` and, in a child process, by the door, which never goes through the CLI."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.client import MemsweepClient
from service.reports.summary import SuccessCell, success_table
from service.reports.tables import read_csv, success_csv
from tests.plugin_dists import env_with, memsweep, toy_dist
from tests.service.test_units import T

# ----- the success cell's columns ---------------------------------------------------------------------


def _raised_table() -> dict[str, Any]:
    """A success table (as REST answers it) in which one run of 'mine' raised an exception."""
    crashed = T("mine", {"lr": 1e-3, "seed": 1}, None, "failed")
    crashed.traceback = "Traceback (most recent call last): …\nRuntimeError: shape mismatch"
    trials = [crashed, T("mine", {"lr": 1e-4, "seed": 1}, 0.05), T("chain", {"lr": 1e-3, "seed": 1}, 0.05)]
    return success_table(trials).model_dump(mode="json")


def _client_for(table: dict[str, Any]) -> MemsweepClient:
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/studies/s1/success", request.url
        return httpx.Response(200, json=table)

    http = httpx.Client(base_url="http://testserver", transport=httpx.MockTransport(answer))
    return MemsweepClient("http://testserver", token=None, http=http)


def _columns(fields: list[str]) -> list[str]:
    return [c for f in fields for c in ((f"{f}_low", f"{f}_high") if f == "ci95" else (f,))]


@pytest.mark.parametrize("by", ["model", "value"])
def test_the_clients_success_frame_has_a_column_for_every_field_of_a_success_cell(by: str) -> None:
    """The client listed its own columns and lost `raised`: a frame of a crashing cell read as one
    whose runs failed by the protocol's rule."""
    client = _client_for(_raised_table())
    frame = client.success_table("s1", by=by)
    assert list(frame.columns) == _columns(list(SuccessCell.model_fields))
    mine = frame.loc["mine"] if by == "model" else frame.loc[("mine", "lr", "0.001")]
    assert (mine["raised"], mine["failed"]) == (1, 1)


def test_the_csv_and_the_clients_frame_have_the_same_cell_columns() -> None:
    table = _raised_table()
    csv = read_csv(io.StringIO(success_csv(table, "s1")))
    frame = _client_for(table).success_table("s1")
    assert list(csv.columns)[4:] == list(frame.columns)  # after table, model, field, value


# ----- the plugin contract check ----------------------------------------------------------------------


def test_the_door_checks_plugins_in_a_child_of_the_study_layer_not_of_the_cli(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The door ran `python -m service.cli plugins check --json` and read the CLI's output: the study
    layer depended on a front end above it."""
    from service.study import plugins as door

    ran: list[list[str]] = []

    def run(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        ran.append(cmd)
        report = [{"kind": "cell", "name": "toy", "identity": "memsweep-toy==1", "problems": ["shapes: no"]}]
        return subprocess.CompletedProcess(cmd, 0, "a plugin's own print\n" + json.dumps(report) + "\n", "")

    monkeypatch.setattr(door.subprocess, "run", run)
    assert door._child_check(["cell:toy"], 5) == {"cell:toy": ["shapes: no"]}
    ((_, *args),) = ran
    assert args == ["-P", "-m", "service.study.plugins", "cell:toy"]


def test_the_check_the_door_runs_is_what_memsweep_plugins_check_prints_without_the_cli(
    tmp_path: Path,
) -> None:
    """One report, two front ends: the door's child prints the JSON `memsweep plugins check --json` prints,
    and loads no module of the CLI (`-X importtime` lists every module it imported)."""
    dist = toy_dist(tmp_path / "site", "1.0", name="toy-nan", extra_forward="out = out * float('nan')")
    child = subprocess.run(
        [sys.executable, "-P", "-X", "importtime", "-m", "service.study.plugins", "toy-nan"],
        env=env_with(dist), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr[-3000:]
    imported = {
        line.rpartition("|")[2].strip()
        for line in child.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "trainers.contract" in imported  # the check ran in this process
    assert sorted(m for m in imported if m == "service.cli" or m.startswith("service.cli.")) == []
    (report,) = json.loads(child.stdout.strip().splitlines()[-1])
    assert report["name"] == "toy-nan" and report["problems"][0].startswith("loss: on task 'addition'")
    cli = memsweep("plugins", "check", "toy-nan", "--json", paths=(dist,))
    assert cli.returncode == 1, cli.stderr[-3000:]
    assert json.loads(cli.stdout.strip().splitlines()[-1]) == [report]


def test_a_name_the_child_does_not_know_is_said_as_the_cli_says_it() -> None:
    child = subprocess.run(
        [sys.executable, "-P", "-m", "service.study.plugins", "nonesuch"],
        env=env_with(), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    cli = memsweep("plugins", "check", "nonesuch")
    assert child.returncode == cli.returncode == 2 and child.stdout == cli.stdout == ""
    assert child.stderr == cli.stderr and child.stderr.startswith("error: no plugin 'nonesuch'; installed: ")
