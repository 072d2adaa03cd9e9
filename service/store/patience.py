"""How long a ledger call waits on its database: a call that finds it unreachable (PostgreSQL
restarting, SQLite locked past its timeout) is retried for as long as its context allows, so that a
database restart loses no result."""

from __future__ import annotations

import contextvars
import functools
import logging
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


def outlasting(method: F) -> F:
    """Retry a ledger call while its database is unreachable (PostgreSQL restarting, SQLite locked
    past its timeout), up to OUTAGE_PATIENCE seconds, so that a database restart loses no result: the
    engine's recording waits instead of failing. Each call is one transaction, written to be safe to
    repeat (inserts check what exists)."""

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
