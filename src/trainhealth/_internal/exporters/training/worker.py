"""A background thread that runs submitted work in order, off the training thread.

The Monitor hands each step's export (metric writes, detectors) to it, so
``Monitor.step`` costs the training loop only the queueing. The queue is
bounded: when the worker falls ``max_pending`` items behind, the oldest are
dropped and counted in ``trainhealth_exporter_errors_total{source="export_queue"}``.

>>> from trainhealth._internal.store import MetricStore
>>> done = []
>>> worker = OrderedWorker(MetricStore())
>>> for n in range(3):
...     worker.submit(done.append, n)
>>> worker.flush(timeout_s=5), done
(True, [0, 1, 2])
>>> worker.close()
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from trainhealth._internal.store import MetricStore

__all__ = ["OrderedWorker"]


class OrderedWorker:
    def __init__(self, store: MetricStore, *, name: str = "trainhealth-export", max_pending: int = 10_000) -> None:
        self._store = store
        self._name = name
        self._max_pending = max_pending
        self._queue: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._changed = threading.Condition()
        self._busy = False
        self._stopping = False
        self._thread: threading.Thread | None = None

    def submit(self, function: Callable[..., Any], *args: Any) -> None:
        """Queue ``function(*args)``; never blocks."""
        with self._changed:
            if self._stopping:
                return
            if len(self._queue) >= self._max_pending:
                self._queue.popleft()
                self._store.record_error("export_queue")
            self._queue.append((function, args))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything submitted so far has run; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._queue and not self._busy, timeout=timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Run what is queued, then stop the thread."""
        self.flush(timeout_s)
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._queue or self._stopping)
                if not self._queue:
                    return
                function, args = self._queue.popleft()
                self._busy = True
            try:
                function(*args)
            except Exception as exc:  # the worker outlives any one failure
                self._store.record_error("monitor", exc)
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()
