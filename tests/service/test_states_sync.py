"""`memsweep sync` on a machine where nothing ran made a ledger (and its home) to then say "no study":
like the reads, it says this machine has no ledger, naming where it looked, and makes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.cli import commands
from tests.service.test_client_shell import no_ledger  # noqa: F401  (a fixture)


def test_a_sync_where_no_ledger_was_made_says_so_and_makes_none(no_ledger: Path) -> None:  # noqa: F811
    with pytest.raises(SystemExit) as refused:
        commands.main(["sync", "abc123"])
    said = str(refused.value)
    assert f"this machine has no ledger yet ({no_ledger})" in said and "give --url URL" in said, said
    assert not no_ledger.exists() and not no_ledger.parent.exists()
