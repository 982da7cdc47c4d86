"""The thread that writes a rank's evidence to disk, so a stalled disk never silences the hang watcher.

The trace appends, the stack files and the Flight Recorder dumps all sync to disk, and a
disk (a shared filesystem, a full volume) can stall for seconds or minutes. They run here,
one job at a time, off the flush thread that exports the in-flight view: the page goes out
whatever the disk does, and the evidence follows when the disk lets it. At most ``limit``
jobs wait; one more is dropped and counted (``trainhealth_exporter_errors_total{source="comm_writer"}``).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainhealth._internal.store import MetricStore

__all__ = ["EvidenceWriter"]

log = logging.getLogger(__name__)


class EvidenceWriter:
    """Runs write jobs in order on one daemon thread, started at the first job."""

    def __init__(self, store_of: Callable[[], MetricStore | None], limit: int = 16) -> None:
        self._store_of = store_of
        self._jobs: queue.Queue[Callable[[], object] | None] = queue.Queue(maxsize=limit)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.dropped = 0

    def submit(self, job: Callable[[], object]) -> bool:
        """Queue ``job``; False (counted) when ``limit`` jobs already wait behind a slow disk."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="trainhealth-comm-writer", daemon=True)
                self._thread.start()
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            self.dropped += 1
            self._count(OverflowError("the evidence writer is behind (a stalled disk?): a write was dropped"))
            return False
        return True

    def drain(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the queued jobs to finish; whether they did."""
        if self._thread is None:
            return True
        done = threading.Event()
        if not self.submit(done.set):
            return False
        return done.wait(timeout_s)

    def stop(self, timeout_s: float) -> None:
        """Finish the queued jobs (waiting at most ``timeout_s``) and end the thread."""
        thread = self._thread
        if thread is None:
            return
        try:
            self._jobs.put(None, timeout=timeout_s)
        except queue.Full:
            return
        thread.join(timeout_s)
        with self._lock:
            if not thread.is_alive():
                self._thread = None

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except Exception as exc:  # a job's failure is ours: counted, the next job runs
                self._count(exc)

    def _count(self, exc: BaseException) -> None:
        store = self._store_of()
        if store is not None:
            store.record_error("comm_writer", exc)
        else:
            log.warning("trainhealth: writing evidence failed: %s", exc)
