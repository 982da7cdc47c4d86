"""Completion of works that have no future (gloo's isend / irecv), noticed by polling."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["CompletionPoller"]


class CompletionPoller:
    """Notices the completion of works that have no future (gloo's isend / irecv) by polling.

    Such a work completes when its owner waits on it, so the time recorded is
    when that wait returned, within ``interval_s``. The thread runs only while
    works are pending; at most ``max_pending`` are watched (the oldest give way).
    """

    def __init__(self, interval_s: float = 0.0005, max_pending: int = 10_000) -> None:
        self._interval = interval_s
        self._max_pending = max_pending
        self._pending: deque[tuple[Any, Callable[[], None]]] = deque()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False

    def watch(self, work: Any, on_done: Callable[[], None]) -> None:
        with self._wake:
            if len(self._pending) >= self._max_pending:
                self._pending.popleft()
            self._pending.append((work, on_done))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="trainhealth-comm-poller", daemon=True)
                self._thread.start()
            self._wake.notify()

    def stop(self) -> None:
        """Stop polling; works already completed but not yet seen (a busy machine) are recorded now."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._wake:
            remaining, self._pending = list(self._pending), deque()
        for _, on_done in self._completed(remaining):
            on_done()

    @staticmethod
    def _completed(entries: list[tuple[Any, Callable[[], None]]]) -> list[tuple[Any, Callable[[], None]]]:
        finished = []
        for entry in entries:
            try:
                if entry[0].is_completed():
                    finished.append(entry)
            except Exception:
                finished.append((None, lambda: None))
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
            for _, on_done in finished:
                on_done()
            if finished:
                with self._wake:
                    for entry in finished:
                        if entry in self._pending:
                            self._pending.remove(entry)
            time.sleep(self._interval)
