"""The writer pool on its own (`service.tracking.pool.WriterPool`): one key's writes in order and one
at a time, different keys in parallel, `flush` waits for all (those queued meanwhile too), a failed
write is recorded and the next one runs, `close` writes what is queued, `abandon` drops it."""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from collections.abc import Callable
from functools import partial

import pytest

from service.tracking.pool import WriterPool

WAIT = 10.0  # seconds an event may take before the test fails (never reached when the pool works)


def test_one_keys_writes_run_in_order_and_one_at_a_time():
    pool = WriterPool(threads=4)
    lock = threading.Lock()
    done: dict[str, list[int]] = collections.defaultdict(list)
    running: collections.Counter[str] = collections.Counter()
    overlaps: list[str] = []

    def write(key: str, i: int) -> Callable[[], None]:
        def run() -> None:
            with lock:
                running[key] += 1
                if running[key] > 1:
                    overlaps.append(f"{key}#{i}")
            time.sleep(random.uniform(0, 0.002))  # jitter: a pool that reordered would show it
            with lock:
                running[key] -= 1
                done[key].append(i)

        return run

    keys = ("a", "b", "c")
    for i in range(40):
        for key in keys:
            pool.submit(write(key, i), key=key)
    assert pool.flush() == []
    pool.close()
    assert {k: done[k] for k in keys} == {k: list(range(40)) for k in keys}
    assert overlaps == []


def test_different_keys_and_keyless_writes_run_while_a_key_is_held_up():
    pool = WriterPool(threads=3)
    gate, started = threading.Event(), threading.Event()
    ran: list[str] = []
    other, keyless = threading.Event(), threading.Event()

    def held() -> None:
        started.set()
        assert gate.wait(WAIT)
        ran.append("a1")

    pool.submit(held, key="a")
    pool.submit(lambda: ran.append("a2"), key="a")  # queued behind the held write
    assert started.wait(WAIT)
    pool.submit(other.set, key="b")
    pool.submit(keyless.set)
    try:
        assert other.wait(WAIT) and keyless.wait(WAIT)  # a free thread ran them meanwhile
        assert ran == []  # but not `a`'s next write: it waits for the one before it
    finally:
        gate.set()
    pool.close()
    assert ran == ["a1", "a2"]


def test_flush_waits_for_writes_queued_while_it_waits():
    pool = WriterPool(threads=2)
    done: list[str] = []

    def second() -> None:
        time.sleep(0.05)  # still running when the first write's task has ended
        done.append("second")

    def first() -> None:
        pool.submit(second, key="other")
        done.append("first")

    pool.submit(first, key="one")
    pool.flush()
    assert done == ["first", "second"]
    pool.close()


def test_a_failed_write_is_recorded_and_its_keys_next_write_still_runs(caplog):
    pool = WriterPool(threads=2)
    ran: list[str] = []

    def fails(message: str) -> Callable[[], None]:
        def run() -> None:
            raise ValueError(message)

        return run

    with caplog.at_level(logging.WARNING, logger="service.tracking.pool"):
        pool.submit(fails("lane"), key="a")
        pool.submit(lambda: ran.append("after"), key="a")
        errors = pool.flush()
        pool.submit(fails("keyless"))
        assert pool.flush() == ["ValueError: lane", "ValueError: keyless"]
    assert errors == ["ValueError: lane"]  # what a flush returns is the errors so far, not a view
    assert ran == ["after"]
    assert "MLflow write failed: lane" in caplog.text
    pool.close()


def test_close_writes_everything_queued_and_then_takes_no_more():
    pool = WriterPool(threads=2)
    done: list[int] = []
    for i in range(20):
        pool.submit(partial(done.append, i), key="a")
    pool.close()
    assert done == list(range(20))
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)


def test_abandon_drops_the_queued_writes_without_waiting_for_the_running_one():
    pool = WriterPool(threads=1)
    gate, started = threading.Event(), threading.Event()
    ran: list[str] = []
    worker: list[threading.Thread] = []

    def held() -> None:
        worker.append(threading.current_thread())
        started.set()
        assert gate.wait(WAIT)
        ran.append("held")

    pool.submit(held, key="a")
    assert started.wait(WAIT)
    pool.submit(lambda: ran.append("a2"), key="a")  # behind the running write in its lane
    pool.submit(lambda: ran.append("b"), key="b")  # a lane of its own, not started (one thread)
    pool.submit(lambda: ran.append("keyless"))
    assert pool.abandon() == 2  # b's lane and the keyless write; a2 goes with the running lane
    gate.set()
    worker[0].join(WAIT)
    assert not worker[0].is_alive()
    assert ran == ["held"]
