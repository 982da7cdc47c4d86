"""The collective-operation logger: records each collective of a rank, aggregates them, writes the trace.

The wrappers (:mod:`~trainhealth.exporters.collectives.wrappers`) record into
the ring and queue of :class:`~trainhealth.exporters.collectives.recorder.CollectiveRecorder`;
a flush thread, once a second, turns new records into metrics, the in-flight
view and the abnormal filter's picks, and every ``trace_write_interval_s``
appends them to the rank's trace: ``<trace_dir>/rank-<rank>.<n>.jsonl.gz``
(trace format v1 as JSON lines, gzip members in segments,
:class:`~trainhealth.traces.segments.SegmentWriter`), so a crash loses at most
the records since the last append, and no pyarrow is needed in the pod.

A :class:`~trainhealth.Monitor` adds host-timed rows through :meth:`CollectiveLogger.add_marker`:
one ``step`` marker per training step, ``forward`` and ``optimizer``. From the
markers the flush thread splits each step into the time the rank waited in
collectives and the time it computed (:func:`step_wait`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from trainhealth import catalog
from trainhealth.exporters.collectives.abnormal import AbnormalFilter
from trainhealth.exporters.collectives.recorder import RECORD_FIELDS, CollectiveRecorder
from trainhealth.exporters.collectives.watch import FLOOR_S, HangWatch
from trainhealth.exporters.collectives.wrappers import COMMUNICATION_FUNCTIONS, instrument_ddp, wrap
from trainhealth.store import MetricStore
from trainhealth.traces.ops import COMMUNICATION_OPS
from trainhealth.traces.segments import SegmentWriter

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["COMMUNICATION_FUNCTIONS", "CollectiveLogger", "RECORD_FIELDS", "step_wait"]

log = logging.getLogger(__name__)

_COMMUNICATION = frozenset(COMMUNICATION_OPS)


class CollectiveLogger(CollectiveRecorder):
    """Records collectives of one rank; see :func:`trainhealth.comm.install` for the usual entry point.

    ``store`` receives the metrics (none when ``None``); ``trace_dir`` receives the
    trace, appended every ``trace_write_interval_s`` (0: only when :meth:`write_trace`
    runs, at uninstall and exit) and whenever half of ``ring_size`` records wait to be written.
    ``hang_floor_s`` is the shortest hang threshold (:mod:`~trainhealth.exporters.collectives.watch`).
    """

    def __init__(
        self,
        *,
        rank: int | None = None,
        host: str = "",
        gpu: int | None = None,
        ring_size: int = 65536,
        store: MetricStore | None = None,
        trace_dir: str | Path | None = None,
        flush_interval_s: float = 1.0,
        abnormal: AbnormalFilter | None = None,
        abnormal_keep: int = 10_000,
        detectors: Any = None,
        trace_write_interval_s: float = 0.0,
        hang_floor_s: float = FLOOR_S,
    ) -> None:
        super().__init__(rank=rank, host=host, gpu=gpu, ring_size=ring_size)
        if not trace_write_interval_s >= 0:
            raise ValueError("trace_write_interval_s must be >= 0")
        self.store = store
        self.detectors = detectors  # a SignalDetectors fed each (op, group)'s median duration per flush
        self.trace_dir = Path(trace_dir) if trace_dir is not None else None
        self._flushed_total = 0
        self._seen = 0  # records the flush thread took from the queue
        self._abnormal = abnormal or AbnormalFilter()
        self.abnormal_records: deque[tuple] = deque(maxlen=abnormal_keep)
        self._abnormal_total = 0
        self._known_inflight: set[tuple[str, str]] = set()
        self._flush_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._flush_interval = flush_interval_s
        self._trace_write_interval = trace_write_interval_s
        self._last_trace_write = time.monotonic()
        self._write_lock = threading.Lock()
        # records flushed but not yet appended to the trace, and the abnormal ones among them
        self._unwritten: deque[tuple] = deque(maxlen=ring_size)
        self._unwritten_abnormal: deque[tuple] = deque(maxlen=abnormal_keep)
        self._unwritten_lost = 0
        self._writers: dict[Path, SegmentWriter] = {}
        # (start, end, is_async) of collectives the flush thread has not yet given to a step marker
        self._unassigned: deque[tuple[float, float, bool]] = deque(maxlen=ring_size)
        self._marked = False  # whether a step marker has arrived: without any, keep one flush of intervals
        self.watch = HangWatch(self, hang_floor_s)  # is this rank stuck, and where (judged on the flush thread)

    # --- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        """Start the flush thread (metrics, in-flight view, abnormal filter, trace appends)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trainhealth-comm-flush", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._poller.stop()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.flush()

    def _run(self) -> None:
        while not self._stop.wait(self._flush_interval):
            self.flush()
            self._write_if_due()

    def _write_if_due(self) -> None:
        """Append to the trace when ``trace_write_interval_s`` has passed since the last append, or when
        half the ring waits to be written (flush thread)."""
        if self.trace_dir is None:
            return
        crowded = len(self._unwritten) * 2 >= cast(int, self._unwritten.maxlen)
        if not crowded and (not self._trace_write_interval
                            or time.monotonic() - self._last_trace_write < self._trace_write_interval):
            return
        try:
            self.write_trace()
        except Exception as exc:
            if self.store is not None:
                self.store.record_error("comm_trace", exc)
            else:
                log.warning("trainhealth: writing the collective trace failed", exc_info=True)

    # --- what the loop tells ------------------------------------------------------------
    def pause(self, reason: str = "pause") -> AbstractContextManager[None]:
        """A context manager for a pause the loop announces (a checkpoint save, an evaluation): while it lasts,
        neither this rank nor its peers waiting for it count as hung (``trainhealth_comm_paused``)."""
        return self.watch.pause(reason)

    # --- wrapping ---------------------------------------------------------------------
    def wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        """A wrapper of ``torch.distributed.<name>`` that records each call."""
        return wrap(self, name, original)

    def instrument_ddp(self, model: Any) -> Any:
        """Record a DDP model's bucket all-reduces with a communication hook; returns the model."""
        return instrument_ddp(self, model)

    # --- reading ----------------------------------------------------------------------
    def records(self) -> pd.DataFrame:
        """The records in the ring buffer as trace format v1 rows (start on the wall clock)."""
        self.flush()
        return self._frame(list(self._ring))

    def _frame(self, rows: list[tuple]) -> pd.DataFrame:
        import pandas as pd  # the analysis extra: only reading the records as a table needs it

        width = len(RECORD_FIELDS)
        frame = pd.DataFrame.from_records([row[:width] for row in rows], columns=list(RECORD_FIELDS))
        frame["start"] = frame["start"].astype(np.float64) + self._clock_offset
        for name in ("seq", "peer", "bytes"):
            frame[name] = pd.array(frame[name].tolist(), dtype="Int64")
        frame.insert(0, "rank", self.rank)
        frame["host"] = self.host or None
        frame["gpu"] = pd.array([self.gpu] * len(frame), dtype="Int64")
        # optional column: the collective ran beside the training thread (DDP buckets, isend/irecv, NCCL device
        # timing), so only its end can block the rank; the localizer measures compute with it
        frame["async"] = np.array([bool(row[8]) if len(row) > width else False for row in rows], dtype=bool)
        return frame

    @property
    def records_dropped(self) -> int:
        """Records lost: with a trace directory, those that never reached the trace; else those the ring let go."""
        if self.trace_dir is not None:
            never_flushed = max(0, self._recorded - self._seen - len(self._pending))  # the queue overflowed
            return self._unwritten_lost + never_flushed
        return max(0, self._recorded - cast(int, self._ring.maxlen))

    def trace_rows(self, records: Iterable[tuple]) -> list[dict[str, Any]]:
        """``records`` as trace format v1 rows (JSON objects; start on the wall clock, empty fields left out)."""
        rank, offset = self.rank, self._clock_offset
        constant = {key: value for key, value in (("host", self.host or None), ("gpu", self.gpu)) if value is not None}
        rows = []
        for step, op, group, seq, start, duration, nbytes, peer, is_async in records:
            row: dict[str, Any] = {"rank": rank, "step": step, "op": op}
            if group is not None:
                row["group"], row["seq"] = group, seq
            row["start"], row["duration"] = start + offset, duration
            if nbytes is not None:
                row["bytes"] = nbytes
            if peer is not None:
                row["peer"] = peer
            row.update(constant)
            # the collective ran beside the training thread (DDP buckets, isend/irecv, NCCL device timing), so
            # only its end can block the rank; the localizer measures compute with it
            row["async"] = bool(is_async)
            rows.append(row)
        return rows

    def write_trace(self, timeout_s: float | None = None) -> Path | None:
        """Append the records not yet written to ``<trace_dir>/rank-<rank>.<n>.jsonl.gz``, and the abnormal ones
        to ``<trace_dir>/abnormal/``; the segment holding this rank's trace, or None without a trace directory
        or records.

        Each append is one gzip member written with one call and synced to disk; a crash
        mid-append leaves a cut last member, which readers drop (see
        :mod:`trainhealth.traces.segments` for links, restarts and segment size).
        With ``timeout_s`` (a signal handler, which may have interrupted a write on its own
        thread), gives up and returns None when the locks stay held that long.
        """
        if self.trace_dir is None:
            return None
        if not self.flush(timeout_s):  # records still queued for the flush thread
            return None
        if not self._write_lock.acquire(timeout=-1 if timeout_s is None else timeout_s):
            log.warning("trainhealth: the collective trace is being written elsewhere; not written again")
            return None
        try:
            self._last_trace_write = time.monotonic()
            batch = self._take(self._unwritten)
            abnormal = self._take(self._unwritten_abnormal)
            main = self._writer(self.trace_dir)
            try:
                main.append(self.trace_rows(batch))
                if abnormal:
                    self._writer(self.trace_dir / "abnormal").append(self.trace_rows(abnormal))
            except BaseException:
                self._unwritten.extendleft(reversed(batch))  # kept for the next try (the ring bound still holds)
                self._unwritten_abnormal.extendleft(reversed(abnormal))
                raise
        finally:
            self._write_lock.release()
        if self._unwritten_lost:
            log.warning("trainhealth: %d collective records were dropped before they reached the trace; raise "
                        "TRAINHEALTH_COMM_RING_SIZE or lower TRAINHEALTH_TRACE_WRITE_INTERVAL", self._unwritten_lost)
        return main.path

    def _writer(self, directory: Path) -> SegmentWriter:
        writer = self._writers.get(directory)
        if writer is None:
            writer = self._writers[directory] = SegmentWriter(directory, f"rank-{self.rank}")
        return writer

    @staticmethod
    def _take(queue: deque[tuple]) -> list[tuple]:
        """What ``queue`` holds now, oldest first; appends made meanwhile stay for the next take."""
        popleft = queue.popleft
        return [popleft() for _ in range(len(queue))]

    # --- the flush thread -------------------------------------------------------------
    def flush(self, timeout_s: float | None = None) -> bool:
        """Aggregate new records into metrics, flag abnormal ones, refresh the in-flight view; False when
        ``timeout_s`` passed before another flush finished."""
        if not self._flush_lock.acquire(timeout=-1 if timeout_s is None else timeout_s):
            return False
        try:
            self._flush_locked()
        finally:
            self._flush_lock.release()
        return True

    def _flush_locked(self) -> None:
        batch = self._take(self._pending)
        self._ring.extend(batch)  # here, not on the training thread: one append less per collective
        self._seen += len(batch)
        if self.trace_dir is not None:  # held for the next append
            overflow = len(self._unwritten) + len(batch) - cast(int, self._unwritten.maxlen)
            if overflow > 0:
                self._unwritten_lost += overflow
            self._unwritten.extend(batch)
        self.watch.observe(batch)
        if batch and set(map(itemgetter(1), batch)) <= _COMMUNICATION:  # the usual flush: collectives only
            collectives, markers = batch, []
        else:
            collectives = [record for record in batch if record[1] in _COMMUNICATION]
            markers = [record for record in batch if record[1] == "step"]
        self._flushed_total += len(collectives)
        if collectives:
            self._aggregate(collectives)
        if not markers and not self._marked:
            self._unassigned.clear()  # nobody marks steps (yet): hold only what the first marker may need
        if collectives:
            starts = np.fromiter(map(itemgetter(4), collectives), np.float64, len(collectives))
            ends = starts + np.fromiter(map(itemgetter(5), collectives), np.float64, len(collectives))
            self._unassigned.extend(zip(starts.tolist(), ends.tolist(), map(itemgetter(8), collectives)))
        if markers:
            self._marked = True
            self._account_steps(markers)
        try:
            self.watch.check(self.store, self.trace_dir)
        except Exception as exc:  # the watcher's failure is ours: counted, never a hang
            if self.store is not None:
                self.store.record_error("comm_watch", exc)
        if self.store is not None:
            self._export_inflight(self.store)
            dropped = self.records_dropped
            if dropped:
                previous = cast(float, self.store.value(catalog.COMM_RECORDS_DROPPED) or 0.0)  # a counter
                if dropped > previous:
                    self.store.inc(catalog.COMM_RECORDS_DROPPED, dropped - previous)

    def _aggregate(self, batch: list[tuple]) -> None:
        keys = list(map(itemgetter(1, 2), batch))
        if keys.count(keys[0]) == len(keys):  # the usual flush: one op on one group
            by_key = {keys[0]: np.arange(len(keys))}
        else:
            positions: dict[tuple[str, str], list[int]] = {}
            for index, key in enumerate(keys):
                positions.setdefault(key, []).append(index)
            by_key = {key: np.asarray(indices) for key, indices in positions.items()}
        all_durations = np.fromiter(map(itemgetter(5), batch), np.float64, len(batch))
        all_sizes = np.asarray([size or 0 for size in map(itemgetter(6), batch)], dtype=np.int64)
        with np.errstate(divide="ignore"):  # int.bit_length, vectorised: 0 for 0, 4 for 8 to 15
            all_classes = np.where(all_sizes > 0, np.floor(np.log2(np.maximum(all_sizes, 1))) + 1, 0).astype(np.int64)
        for (op, group), rows in by_key.items():
            durations, sizes, classes = all_durations[rows], all_sizes[rows], all_classes[rows]
            flagged: list[tuple] = []
            for size_class in np.unique(classes).tolist():
                members = np.flatnonzero(classes == size_class)
                hits = self._abnormal.flag((op, group, size_class), durations[members])
                flagged += [batch[int(rows[members[i]])] for i in hits]
            self.abnormal_records.extend(flagged)
            if self.trace_dir is not None:
                self._unwritten_abnormal.extend(flagged)
            self._abnormal_total += len(flagged)
            if self.detectors is not None:
                self.detectors.observe("comm_duration", float(np.median(durations)), series=f"{op}/{group}",
                                       step=batch[int(rows[-1])][0])
            if self.store is not None:
                labels = (op, group)
                self.store.observe_many(catalog.COMM_OP_DURATION, durations, labels)
                self.store.inc(catalog.COMM_OPS, len(rows), labels)
                self.store.inc(catalog.COMM_BYTES, int(sizes.sum()), labels)
                if flagged:
                    self.store.inc(catalog.COMM_ABNORMAL_OPS, len(flagged), labels)

    def _account_steps(self, markers: list[tuple]) -> None:
        """Split each marked step into the time this rank waited in collectives and the time it computed."""
        intervals = sorted(self._unassigned)
        self._unassigned.clear()
        taken = 0
        wait_total = compute_total = 0.0
        wait = compute = 0.0
        for marker in sorted(markers, key=lambda record: record[4]):
            t0, t1 = marker[4], marker[4] + marker[5]
            first = taken
            while taken < len(intervals) and intervals[taken][0] < t1:
                taken += 1
            wait = step_wait(intervals[first:taken], t0, t1)
            compute = max(0.0, marker[5] - wait)
            wait_total += wait
            compute_total += compute
        self._unassigned.extend(intervals[taken:])  # collectives of steps whose marker is yet to come
        if self.store is not None:
            self.store.inc(catalog.TRAIN_STEP_WAIT, wait_total)
            self.store.inc(catalog.TRAIN_STEP_COMPUTE, compute_total)
            self.store.write([(catalog.TRAIN_LAST_STEP_WAIT, (), wait), (catalog.TRAIN_LAST_STEP_COMPUTE, (), compute)])

    def _export_inflight(self, store: MetricStore) -> None:
        now = time.perf_counter()
        waiting: dict[tuple[str, str], float] = {}
        current = self._current
        if current is not None:
            op, group, _, t0 = current
            waiting[(op, group)] = now - t0
        for (group, _), (op, t0) in list(self._async.items()):
            waiting[(op, group)] = max(waiting.get((op, group), 0.0), now - t0)
        self._known_inflight |= set(waiting)
        writes: list[tuple[catalog.MetricSpec, tuple[str, ...], float]] = [
            (catalog.COMM_INFLIGHT_DURATION, key, waiting.get(key, 0.0)) for key in sorted(self._known_inflight)]
        writes += [(catalog.COMM_STARTED_SEQ, (group,), float(seq)) for group, seq in list(self._seq.items())]
        writes += [(catalog.COMM_COMPLETED_SEQ, (group,), float(seq)) for group, seq in list(self._completed.items())]
        store.write(writes)

    @property
    def abnormal_fraction(self) -> float:
        """Share of the flushed records flagged abnormal: what would leave the node under Holmes's scheme."""
        return self._abnormal_total / self._flushed_total if self._flushed_total else 0.0


def step_wait(intervals: list[tuple[float, float, bool]], t0: float, t1: float) -> float:
    """Seconds of the step ``[t0, t1]`` a rank was blocked in the collectives ``(start, end, is_async)``.

    A synchronous collective blocks the rank throughout; an asynchronous one (a DDP bucket
    all-reduce, an isend) overlaps the rank's compute until its last asynchronous collective of
    the step was started — when backward finished producing gradients — so only its part after
    that moment counts. Overlaps count once.

    >>> step_wait([(0.0, 0.2, False), (0.1, 0.3, False)], 0.0, 1.0)  # one blocked stretch, 0.0 to 0.3
    0.3
    >>> round(step_wait([(0.1, 0.6, True), (0.5, 0.8, True)], 0.0, 1.0), 6)  # buckets: waiting from 0.5 on
    0.3
    """
    pieces = [(max(start, t0), min(end, t1)) for start, end, is_async in intervals if not is_async]
    started = [start for start, _, is_async in intervals if is_async]
    if started:
        last = max(max(started), t0)
        pieces += [(max(start, last), min(end, t1)) for start, end, is_async in intervals if is_async]
    blocked, reach = 0.0, -float("inf")
    for start, end in sorted(pieces):
        start = max(start, reach)
        if end > start:
            blocked += end - start
            reach = end
    return blocked
