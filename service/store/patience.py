"""How long a ledger call waits on its database: a call that finds it unreachable (PostgreSQL
restarting, SQLite locked past its timeout) is retried for as long as its context allows, so that a
database restart loses no result. A call that gives up says so on its error (`outage`): the engine
then pauses its study, charging its trials nothing, and its runner resumes it once the database
answers (`service.study.engine`, `service.runner`)."""

from __future__ import annotations

import contextvars
import functools
import logging
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from sqlalchemy.exc import InterfaceError, OperationalError

log = logging.getLogger(__name__)

#: how long a ledger call waits for its database to come back (a restart, a failover) before it fails
OUTAGE_PATIENCE = 120.0
#: how long a ledger call waits on its database in this context: OUTAGE_PATIENCE for the engine (a
#: result is recorded, not lost, across a restart), less for a REST request (`service.api.limits`),
#: which answers 503 rather than hold its client for two minutes
PATIENCE: contextvars.ContextVar[float] = contextvars.ContextVar("ledger_patience", default=OUTAGE_PATIENCE)

F = TypeVar("F", bound=Callable[..., Any])

#: what a ledger call that outlasted its patience says (`outage`), as a note on its error: a traceback's
#: text carries it too (Ray Tune re-raises a callback's error as a TuneError of its traceback's text)
OUTAGE_SAID = re.compile(r"the ledger \([^()\n]*\) did not answer for [\d.]+ s: [^\n]*")


def outlasting(method: F) -> F:
    """Retry a ledger call while its database is unreachable (PostgreSQL restarting, SQLite locked
    past its timeout), up to OUTAGE_PATIENCE seconds, so that a database restart loses no result: the
    engine's recording waits instead of failing. Each call is one transaction, written to be safe to
    repeat (inserts check what exists). Past its patience it raises the database's error, with a note
    saying so in one line (`outage`)."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.monotonic()
        deadline = began + PATIENCE.get()
        delay, tries = 0.2, 0
        while True:
            try:
                result = method(*args, **kwargs)
            except (OperationalError, InterfaceError) as exc:
                if time.monotonic() + delay > deadline:
                    if outage(exc) is None:  # said once, by the call that gave up first
                        waited = time.monotonic() - began
                        exc.add_note(
                            f"the ledger ({_database(args)}) did not answer for "
                            f"{waited:.{0 if waited >= 10 else 1}f} s: {_said(exc)}"
                        )
                    raise
                # once a call, then quietly: a minute's outage is not forty lines of the same warning
                log.log(
                    logging.WARNING if not tries else logging.DEBUG,
                    "ledger: the database is unreachable (%s); %s retrying for up to %.0f s",
                    str(exc).splitlines()[0],
                    method.__name__,
                    deadline - began,
                )
                tries += 1
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            if tries:
                log.warning(
                    "ledger: the database answers again; %s went through after %.1f s",
                    method.__name__,
                    time.monotonic() - began,
                )
            return result

    return cast(F, wrapper)


def outage(exc: BaseException) -> str | None:
    """Why a ledger call gave up, in one line, when `exc` (or what it was raised from, or the traceback
    text it embeds) is the error of a call that outlasted its patience (`outlasting`): the database did
    not answer for that long, the driver's or the engine's fault, not a trial's. None for any other error."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for text in (*getattr(current, "__notes__", ()), str(current)):
            said = OUTAGE_SAID.search(str(text))
            if said is not None:
                return said.group(0)
        current = current.__cause__ or current.__context__
    return None


def _database(args: tuple[Any, ...]) -> str:
    """The database a ledger call (`args[0]`: the `Ledger`) waited on, without its credentials."""
    url = getattr(getattr(args[0], "database", None), "url", None) if args else None
    if url is None:
        return "its database"
    backend = url.get_backend_name()
    if backend == "sqlite":
        return f"SQLite {url.database or 'in memory'}"
    port = f":{url.port}" if url.port else ""
    return f"{'PostgreSQL' if backend == 'postgresql' else backend} at {url.host or 'localhost'}{port}/{url.database or ''}"


def _said(exc: Exception) -> str:
    """The driver's first line (SQLAlchemy's own text adds the statement and its parameters)."""
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    return lines[0][:300] if lines else type(cause).__name__
