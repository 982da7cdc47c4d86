"""Completion of works the host does not wait for, noticed by polling ``Work.is_completed()``.

Two kinds of work end here. gloo's isend / irecv have no future: they complete when their
owner waits on them. And on NCCL every call returns once its kernel is enqueued: a
synchronous ``all_reduce`` too, and its future is marked complete at enqueue (CUDA-event
semantics), so only ``is_completed()`` (the device's end event) says when the collective
ended on the device. A collective is in flight from its launch until then; a collective
stuck on the device stays in flight while the host runs ahead.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["CompletionPoller"]


class CompletionPoller:
    """Calls ``on_done`` once a watched work completes (or its ``is_completed`` raises: it failed).

    The time seen is within ``interval_s`` of the completion. The thread runs only while
    works are pending, and drops the reference to each work as soon as it saw it complete
    (a work holds its tensors). At most ``max_pending`` are watched: the oldest give way,
    and their ``on_drop`` runs (so whoever holds them in flight lets them go) and is counted.
    """

    def __init__(self, interval_s: float = 0.0005, max_pending: int = 10_000) -> None:
        self._interval = interval_s
        self._max_pending = max_pending
        self._pending: deque[tuple[Any, Callable[[], None], Callable[[], None] | None]] = deque()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.dropped = 0

    def watch(self, work: Any, on_done: Callable[[], None], on_drop: Callable[[], None] | None = None) -> None:
        dropped = None
        with self._wake:
            if len(self._pending) >= self._max_pending:
                dropped = self._pending.popleft()[2]
                self.dropped += 1
            self._pending.append((work, on_done, on_drop))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="trainhealth-comm-poller", daemon=True)
                self._thread.start()
            self._wake.notify()
        if dropped is not None:
            dropped()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def stop(self) -> None:
        """Stop polling; works already completed but not yet seen (a busy machine) are recorded now."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._wake:
            remaining, self._pending = list(self._pending), deque()
        for _, on_done, _ in self._completed(remaining):
            on_done()

    @staticmethod
    def _completed(entries: list) -> list:
        finished = []
        for entry in entries:
            try:
                done = entry[0].is_completed()
            except Exception:  # an aborted or failed work: it is no longer in flight
                done = True
            if done:
                finished.append(entry)
        return finished

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self._stopping:
                    self._wake.wait()
                if self._stopping:
                    return
                watched = list(self._pending)
            finished = self._completed(watched)
            if finished:
                with self._wake:
                    gone = {id(entry) for entry in finished}
                    self._pending = deque(entry for entry in self._pending if id(entry) not in gone)
                for _, on_done, _ in finished:
                    on_done()
            del watched, finished  # the works' last references here: their tensors may be freed
            time.sleep(self._interval)
