"""The writer pool: MLflow's writes on a few threads, one key's in order, different keys in parallel."""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

log = logging.getLogger(__name__)

#: one write: a call with its arguments bound; what it returns is not kept
Write = Callable[[], object]


class WriterPool:
    """Writes on a few threads. The writes of one key (a trial's child run) run one after another, in
    the order they were submitted; different keys, and writes without one, run in parallel. A write
    that raises is logged and its error kept (`errors`), never raised: a tracking problem never takes
    a study down (a sync repairs it).

    Lifecycle: `submit` any number of times, from any thread (a write may submit more); `flush` waits
    for every write submitted before it returns, those submitted meanwhile included, and may be called
    again; then once either `close` (flush, then stop the threads) or `abandon` (drop the queued
    writes, stop without waiting). Nothing may be submitted after either.
    """

    def __init__(self, threads: int) -> None:
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="mlflow-writer")
        self._lock = threading.Lock()
        self._pending: list[Future[None]] = []  # tasks not yet waited for: a write, or a key's drain
        self._queues: dict[str, collections.deque[Write]] = {}  # key → its writes, the running one first
        self._errors: list[str] = []

    @property
    def errors(self) -> list[str]:
        """The failed writes so far, as `Type: message`, oldest first."""
        with self._lock:
            return list(self._errors)

    def submit(self, write: Write, key: str | None = None) -> None:
        """Queue a write: after the writes of its `key` submitted so far, or on its own (no key)."""
        with self._lock:
            if key is None:
                self._pending.append(self._executor.submit(self._run, write))
                return
            queue = self._queues.setdefault(key, collections.deque())
            queue.append(write)
            if len(queue) == 1:  # no drain of this key is under way: start one
                self._pending.append(self._executor.submit(self._drain, key))

    def _drain(self, key: str) -> None:
        """Run a key's writes, oldest first, until its queue is empty (or abandoned)."""
        while True:
            with self._lock:
                queue = self._queues.get(key)
                if not queue:
                    return
                write = queue[0]
            self._run(write)
            with self._lock:
                queue = self._queues.get(key)
                if queue is None:
                    return
                queue.popleft()
                if not queue:
                    del self._queues[key]
                    return

    def _run(self, write: Write) -> None:
        try:
            write()
        except Exception as exc:
            log.warning("MLflow write failed: %s", exc)
            with self._lock:
                self._errors.append(f"{type(exc).__name__}: {exc}")

    def flush(self) -> list[str]:
        """Wait for every queued write; the errors so far."""
        while True:
            with self._lock:
                pending, self._pending = self._pending, []
            if not pending:
                return self.errors
            for task in pending:
                task.result()

    def close(self) -> None:
        """Wait for every queued write, then stop the threads."""
        self.flush()
        self._executor.shutdown(wait=True)

    def abandon(self) -> int:
        """Stop without the queued writes (a running one finishes on its own); how many queued tasks
        were dropped (a key's queue counts once)."""
        with self._lock:
            self._queues.clear()
            pending, self._pending = self._pending, []
        dropped = sum(task.cancel() for task in pending)
        self._executor.shutdown(wait=False, cancel_futures=True)
        return dropped
