"""Concurrent identical reads answered by one computation, none of them with an answer older than itself.

`GET /studies` called 200 times at once would compute the same page 200 times, one after the other
(Python runs one thread at a time). `Coalesced` runs it once for all the calls that arrived while the
previous computation of the same key was under way: every call waits for a computation that *started
after it arrived*, so none is answered from a snapshot taken before a write it could have seen (a
client that creates a study and then lists the studies finds it), and at most two computations of one
key are ever queued, whatever the number of callers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class _Flight(Generic[T]):
    """One computation and the calls that wait for it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None

    def answer(self) -> T:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]


class Coalesced(Generic[T]):
    """`run(key, compute)`: compute's answer, shared by the calls of one key that arrive while an earlier
    computation of that key runs (they all take the next one, started once it ends)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[Hashable, _Flight[T]] = {}  # started: answers calls that came before it
        self._next: dict[Hashable, _Flight[T]] = {}  # not started yet: every call that comes joins it

    def run(self, key: Hashable, compute: Callable[[], T]) -> T:
        before: _Flight[T] | None = None
        with self._lock:
            flight = self._next.get(key)
            if flight is not None:  # a computation that starts after this call arrived: share it
                leader = False
            else:
                flight = self._next[key] = _Flight()
                leader = True
                before = self._running.get(key)
        if not leader:
            return flight.answer()
        if before is not None:  # wait for the computation under way, whose snapshot may predate us
            before.done.wait()
        with self._lock:
            del self._next[key]
            self._running[key] = flight
        try:
            flight.result = compute()
        except BaseException as exc:
            flight.error = exc
        finally:
            with self._lock:
                if self._running.get(key) is flight:
                    del self._running[key]
            flight.done.set()
        return flight.answer()
