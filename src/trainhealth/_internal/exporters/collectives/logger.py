"""The collective-operation logger: records each collective of a rank, aggregates them, writes the trace.

The wrappers (:mod:`~trainhealth._internal.exporters.collectives.wrappers`) record into
the ring and queue of :class:`~trainhealth._internal.exporters.collectives.recorder.CollectiveRecorder`;
a flush thread, once a second, turns new records into metrics, the in-flight
view and the abnormal filter's picks, and every ``trace_write_interval_s``
has the evidence writer thread (:mod:`~trainhealth._internal.exporters.collectives.writer`,
so a stalled disk never holds up the in-flight view) append them to the rank's trace:
``<trace_dir>/rank-<rank>.<n>.jsonl.gz``
(trace format v1 as JSON lines, gzip members in segments,
:class:`~trainhealth._internal.traces.segments.SegmentWriter`), so a crash loses at most
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
from itertools import compress, repeat, starmap
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from trainhealth._internal import catalog
from trainhealth._internal.exporters.collectives.abnormal import AbnormalFilter
from trainhealth._internal.exporters.collectives.columns import RecordColumns
from trainhealth._internal.exporters.collectives.recorder import RECORD_FIELDS, CollectiveRecorder
from trainhealth._internal.exporters.collectives.watch import FLOOR_S, PAUSE_LIMIT_S, HangWatch
from trainhealth._internal.exporters.collectives.wrappers import COMMUNICATION_FUNCTIONS, instrument_ddp, wrap
from trainhealth._internal.exporters.collectives.writer import EvidenceWriter
from trainhealth._internal.store import MetricStore
from trainhealth._internal.traces.ops import COMMUNICATION_OPS
from trainhealth._internal.traces.segments import SegmentWriter

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
    ``hang_floor_s`` is the shortest hang threshold and ``pause_limit_s`` the bound of an announced pause before
    any of its kind ended (:mod:`~trainhealth._internal.exporters.collectives.watch`).
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
        pause_limit_s: float = PAUSE_LIMIT_S,
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
        self._intervals = _Intervals(ring_size)
        self._marked = False  # whether a step marker has arrived: without any, keep one flush of intervals
        self.writer = EvidenceWriter(lambda: self.store)  # trace appends, stacks and dumps: off the flush thread
        self._append_queued = threading.Event()  # a trace append waits in the writer's queue
        # is this rank stuck, and where (judged on the flush thread)
        self.watch = HangWatch(self, hang_floor_s, pause_limit_s=pause_limit_s, writer=self.writer)

    # --- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        """Start the flush thread (metrics, in-flight view, abnormal filter, trace appends)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trainhealth-comm-flush", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the flush thread (after the recorder's own), flush what is left and let the writer finish."""
        super().stop()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.flush()
        self.writer.stop(timeout_s=10.0)

    def _run(self) -> None:
        while not self._stop.wait(self._flush_interval):
            try:
                self.flush()
                self._write_if_due()
            except Exception as exc:  # our own failure: counted, and the thread goes on (it is the hang watcher)
                self._count("comm_flush", exc)

    def _count(self, source: str, exc: BaseException) -> None:
        if self.store is not None:
            self.store.record_error(source, exc)
        else:
            log.warning("trainhealth: %s failed", source, exc_info=exc)

    def _write_if_due(self) -> None:
        """Have the writer thread append to the trace when ``trace_write_interval_s`` has passed since the last
        append, or when half the ring waits to be written (flush thread; one append waits at a time)."""
        if self.trace_dir is None or self._append_queued.is_set():
            return
        crowded = len(self._unwritten) * 2 >= cast(int, self._unwritten.maxlen)
        if not crowded and (
            not self._trace_write_interval or time.monotonic() - self._last_trace_write < self._trace_write_interval
        ):
            return
        self._append_queued.set()
        if not self.writer.submit(self._append):
            self._append_queued.clear()

    def _append(self) -> None:
        """A trace append on the writer thread."""
        self._append_queued.clear()
        try:
            self.write_trace()
        except Exception as exc:
            self._count("comm_trace", exc)

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
        :mod:`trainhealth._internal.traces.segments` for links, restarts and segment size).
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
            log.warning(
                "trainhealth: %d collective records were dropped before they reached the trace; raise "
                "TRAINHEALTH_COMM_RING_SIZE or lower TRAINHEALTH_TRACE_WRITE_INTERVAL",
                self._unwritten_lost,
            )
        return main.path

    def _writer(self, directory: Path) -> SegmentWriter:
        writer = self._writers.get(directory)
        if writer is None:
            writer = self._writers[directory] = SegmentWriter(directory, f"rank-{self.rank}")
        return writer

    @staticmethod
    def _take(queue: deque[tuple]) -> list[tuple]:
        """What ``queue`` holds now, oldest first; appends made meanwhile stay for the next take."""
        return list(starmap(queue.popleft, repeat((), len(queue))))

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
        if batch:
            self._take_in(batch)
        try:
            self.watch.check(self.store, self.trace_dir)
        except Exception as exc:  # the watcher's failure is ours: counted, never a hang
            if self.store is not None:
                self.store.record_error("comm_watch", exc)
        if self.store is not None:
            self._export_inflight(self.store)
            gone = self.forget_destroyed_groups()
            if gone:
                self._forget_series(self.store, gone)
            dropped = self.records_dropped
            if dropped:
                previous = cast(float, self.store.value(catalog.COMM_RECORDS_DROPPED) or 0.0)  # a counter
                if dropped > previous:
                    self.store.inc(catalog.COMM_RECORDS_DROPPED, dropped - previous)

    def _take_in(self, batch: list[tuple]) -> None:
        """Give a flush's new records to the watcher, the aggregates and the step accounting."""
        columns = RecordColumns.of(batch)
        self.watch.observe(columns)
        if _COMMUNICATION.issuperset(columns.ops):  # the usual flush: collectives only
            collectives, markers = batch, []
        else:
            is_collective = np.fromiter(map(_COMMUNICATION.__contains__, columns.ops), bool, len(batch))
            collectives = list(compress(batch, is_collective))
            markers = [record for record in batch if record[1] == "step"]
            columns = columns.select(is_collective)
        self._flushed_total += len(collectives)
        if not markers and not self._marked:
            self._intervals.clear()  # nobody marks steps (yet): hold only what the first marker may need
        if collectives:
            self._aggregate(collectives, columns)
            self._intervals.hold(columns.starts, columns.ends, columns.is_async)
        if markers:
            self._marked = True
            self.watch.stepped()
            self._account_steps(markers)

    def _aggregate(self, batch: list[tuple], columns: RecordColumns) -> None:
        ops, groups = columns.ops, columns.groups
        if ops.count(ops[0]) == len(ops) and groups.count(groups[0]) == len(groups):  # the usual flush
            by_key = {(ops[0], groups[0]): np.arange(len(ops))}
        else:
            positions: dict[tuple[str, str | None], list[int]] = {}
            for index, key in enumerate(zip(ops, groups)):
                positions.setdefault(key, []).append(index)
            by_key = {key: np.asarray(indices) for key, indices in positions.items()}
        all_durations, all_sizes = columns.durations, columns.sizes
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
                self.detectors.observe(
                    "comm_duration", float(np.median(durations)), series=f"{op}/{group}", step=batch[int(rows[-1])][0]
                )
            if self.store is not None:
                labels = (op, cast(str, group))
                self.store.observe_many(catalog.COMM_OP_DURATION, durations, labels)
                self.store.inc(catalog.COMM_OPS, len(rows), labels)
                self.store.inc(catalog.COMM_BYTES, int(sizes.sum()), labels)
                if flagged:
                    self.store.inc(catalog.COMM_ABNORMAL_OPS, len(flagged), labels)

    def _account_steps(self, markers: list[tuple]) -> None:
        """Split each marked step into the time this rank waited in collectives and the time it computed."""
        starts, ends, is_async = self._intervals.take()
        order = np.argsort(starts, kind="stable")
        starts, ends, is_async = starts[order], ends[order], is_async[order]
        taken = 0
        wait_total = compute_total = 0.0
        wait = compute = 0.0
        for marker in sorted(markers, key=lambda record: record[4]):
            t0, t1 = marker[4], marker[4] + marker[5]
            first, taken = taken, max(taken, int(np.searchsorted(starts, t1, side="left")))
            wait = _blocked(starts[first:taken], ends[first:taken], is_async[first:taken], t0, t1)
            compute = max(0.0, marker[5] - wait)
            wait_total += wait
            compute_total += compute
        self._intervals.hold(starts[taken:], ends[taken:], is_async[taken:])  # steps whose marker is yet to come
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
            (catalog.COMM_INFLIGHT_DURATION, key, waiting.get(key, 0.0)) for key in sorted(self._known_inflight)
        ]
        writes += [(catalog.COMM_STARTED_SEQ, (group,), float(seq)) for group, seq in list(self._seq.items())]
        writes += [(catalog.COMM_COMPLETED_SEQ, (group,), float(seq)) for group, seq in list(self._completed.items())]
        store.write(writes)

    def _forget_series(self, store: MetricStore, groups: list[str]) -> None:
        """The series of groups torch destroyed: gone, so groups made and destroyed every step stay bounded."""
        dead = set(groups)

        def of_dead(group: str | None) -> bool:
            return group is not None and (group in dead or group.rsplit(":", 1)[0] in dead)

        for key in [key for key in self._known_inflight if of_dead(key[1])]:
            self._known_inflight.discard(key)
            store.remove(catalog.COMM_INFLIGHT_DURATION, key)
        for spec in (catalog.COMM_STARTED_SEQ, catalog.COMM_COMPLETED_SEQ):
            for labels, _ in store.series(spec):
                if of_dead(labels[0]):
                    store.remove(spec, labels)
        for spec in (catalog.COMM_OP_DURATION, catalog.COMM_OPS, catalog.COMM_BYTES, catalog.COMM_ABNORMAL_OPS):
            for labels, _ in store.series(spec):
                if of_dead(labels[1]):
                    store.remove(spec, labels)
        self.watch.forget(store, groups)

    @property
    def abnormal_fraction(self) -> float:
        """Share of the flushed records flagged abnormal: what would leave the node under Holmes's scheme."""
        return self._abnormal_total / self._flushed_total if self._flushed_total else 0.0


class _Intervals:
    """The (start, end, is_async) columns of collectives not yet given to a step marker, the newest ``limit``."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._chunks: deque[tuple[np.ndarray, np.ndarray, np.ndarray]] = deque()
        self._held = 0

    def hold(self, starts: np.ndarray, ends: np.ndarray, is_async: np.ndarray) -> None:
        if len(starts):
            self._chunks.append((starts, ends, is_async))
            self._held += len(starts)
        while self._held > self._limit:
            oldest = self._chunks.popleft()
            excess = self._held - self._limit
            if excess < len(oldest[0]):
                self._chunks.appendleft((oldest[0][excess:], oldest[1][excess:], oldest[2][excess:]))
            self._held -= min(excess, len(oldest[0]))

    def take(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All held columns, oldest first; none held after."""
        chunks = list(self._chunks)
        self.clear()
        if not chunks:
            return np.empty(0), np.empty(0), np.empty(0, bool)
        starts, ends, is_async = zip(*chunks)
        return np.concatenate(starts), np.concatenate(ends), np.concatenate(is_async)

    def clear(self) -> None:
        self._chunks.clear()
        self._held = 0


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
    columns = np.asarray(intervals, dtype=np.float64).reshape(-1, 3)
    return _blocked(columns[:, 0], columns[:, 1], columns[:, 2] != 0, t0, t1)


def _blocked(starts: np.ndarray, ends: np.ndarray, is_async: np.ndarray, t0: float, t1: float) -> float:
    """:func:`step_wait` on columns."""
    if not len(starts):
        return 0.0
    pieces_start = np.maximum(starts, t0)
    if is_async.any():  # an asynchronous collective blocks from the last one's start on
        pieces_start = np.where(is_async, np.maximum(starts, max(float(starts[is_async].max()), t0)), pieces_start)
    pieces_end = np.minimum(ends, t1)
    order = np.argsort(pieces_start, kind="stable")
    pieces_start, pieces_end = pieces_start[order], pieces_end[order]
    # the union's length: each piece counts from where the pieces before it reached
    reach = np.maximum.accumulate(np.concatenate(([-np.inf], pieces_end[:-1])))
    return float(np.sum(np.maximum(pieces_end - np.maximum(pieces_start, reach), 0.0)))
