"""The collective-operation logger: one record per collective, in a bounded ring buffer.

Three capture paths, because none alone sees everything:

* wrappers around the explicit ``torch.distributed`` collectives (and ``isend`` /
  ``irecv``, through which ``batch_isend_irecv`` runs), timed to completion —
  async work handles through their future;
* a DDP communication hook (:meth:`CollectiveLogger.instrument_ddp`), because
  DDP's bucket all-reduces bypass ``torch.distributed.all_reduce``;
* on NCCL, the process group's completion hook, timed with CUDA events on the
  watchdog thread, so the training thread never synchronises.

The training-path cost is a few dictionary and clock operations (see
benchmarks/comm_overhead.py); metrics, the in-flight view and the abnormal
filter are computed by a flush thread once a second, which also rewrites the
trace every ``trace_write_interval_s``. Records are tuples
``(step, op, group, seq, start, duration, bytes, peer, is_async)``, the first
eight the trace columns; a group id is the same
string on every member (``<desc>:<name>`` of the process group, and
``<pg>:<src>-><dst>`` for point-to-point), and ``seq`` numbers the group's
operations, so one collective has the same (group, seq) on all its members.

A :class:`~trainhealth.Monitor` adds host-timed rows through :meth:`CollectiveLogger.add_marker`:
one ``step`` marker per training step, ``forward`` and ``optimizer``. From the
markers the flush thread splits each step into the time the rank waited in
collectives and the time it computed (:func:`step_wait`).
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from trainhealth import catalog
from trainhealth.exporters.collectives.abnormal import AbnormalFilter
from trainhealth.store import MetricStore
from trainhealth.traces.ops import COMMUNICATION_OPS

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["COMMUNICATION_FUNCTIONS", "CollectiveLogger", "RECORD_FIELDS", "step_wait"]

log = logging.getLogger(__name__)

RECORD_FIELDS = ("step", "op", "group", "seq", "start", "duration", "bytes", "peer")
_COMMUNICATION = frozenset(COMMUNICATION_OPS)


@dataclass(frozen=True)
class _Call:
    """How to read one torch.distributed function's arguments."""

    op: str
    inputs: str | None  # parameter holding the tensor (or list of tensors) sent
    peer: str | None = None  # dst / src for point-to-point
    always_async: bool = False


#: The wrapped torch.distributed functions and how their arguments are read.
COMMUNICATION_FUNCTIONS: dict[str, _Call] = {
    "all_reduce": _Call("all_reduce", "tensor"),
    "all_gather": _Call("all_gather", "tensor"),
    "all_gather_into_tensor": _Call("all_gather", "input_tensor"),
    "reduce_scatter": _Call("reduce_scatter", "input_list"),
    "reduce_scatter_tensor": _Call("reduce_scatter", "input"),
    "all_to_all": _Call("all_to_all", "input_tensor_list"),
    "all_to_all_single": _Call("all_to_all", "input"),
    "broadcast": _Call("broadcast", "tensor"),
    "reduce": _Call("reduce", "tensor"),
    "barrier": _Call("barrier", None),
    "send": _Call("send", "tensor", peer="dst"),
    "recv": _Call("recv", "tensor", peer="src"),
    "isend": _Call("send", "tensor", peer="dst", always_async=True),
    "irecv": _Call("recv", "tensor", peer="src", always_async=True),
}


def _nbytes(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, (list, tuple)):
        return sum(t.nbytes for t in value)
    return int(value.nbytes)


class CollectiveLogger:
    """Records collectives of one rank; see :func:`trainhealth.comm.install` for the usual entry point.

    ``store`` receives the metrics (none when ``None``); ``trace_dir`` receives
    ``rank-<rank>.parquet`` when :meth:`write_trace` runs (at uninstall and exit).
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
    ) -> None:
        if ring_size < 1:
            raise ValueError("ring_size must be >= 1")
        if not trace_write_interval_s >= 0:
            raise ValueError("trace_write_interval_s must be >= 0")
        self.step = 0
        #: Fault injection (trainhealth.lab.injectors): seconds to sleep inside each collective, as a slow link would
        self.injected_delay: Callable[[], float] | None = None
        self._rank = rank
        self.host = host
        self.gpu = gpu
        self.store = store
        self.detectors = detectors  # a SignalDetectors fed each (op, group)'s median duration per flush
        self.trace_dir = Path(trace_dir) if trace_dir is not None else None
        self._ring: deque[tuple] = deque(maxlen=ring_size)
        self._pending: deque[tuple] = deque(maxlen=ring_size)  # records the flush thread has not seen
        self._recorded = 0
        self._flushed_total = 0
        self._seq: dict[str, int] = {}
        self._completed: dict[str, int] = {}
        self._current: tuple[str, str, int, float] | None = None  # the synchronous collective in progress
        self._async: dict[tuple[str, int], tuple[str, float]] = {}  # async collectives not yet complete
        self._group_ids: dict[int, str] = {}
        self._p2p_ids: dict[tuple[str, int, int], str] = {}
        self._device_timed: set[str] = set()  # groups recorded by the NCCL completion hook
        self._abnormal = abnormal or AbnormalFilter()
        self.abnormal_records: deque[tuple] = deque(maxlen=abnormal_keep)
        self._abnormal_total = 0
        self._clock_offset = time.time() - time.perf_counter()
        self._known_inflight: set[tuple[str, str]] = set()
        self._flush_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._flush_interval = flush_interval_s
        self._poller = _CompletionPoller()
        self._inside = threading.local()  # set while a wrapped call runs, so nested ones pass through
        self._trace_write_interval = trace_write_interval_s
        self._last_trace_write = time.monotonic()
        self._write_lock = threading.Lock()
        # (start, end, is_async) of collectives the flush thread has not yet given to a step marker
        self._unassigned: deque[tuple[float, float, bool]] = deque(maxlen=ring_size)
        self._marked = False  # whether a step marker has arrived: without any, keep one flush of intervals

    # --- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        """Start the flush thread (metrics, in-flight view, abnormal filter)."""
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
        """Rewrite the trace when ``trace_write_interval_s`` has passed since the last write (flush thread)."""
        if not self._trace_write_interval or self.trace_dir is None:
            return
        now = time.monotonic()
        if now - self._last_trace_write < self._trace_write_interval:
            return
        self._last_trace_write = now
        try:
            self.write_trace()
        except Exception as exc:
            if self.store is not None:
                self.store.record_error("comm_trace", exc)
            else:
                log.warning("trainhealth: writing the collective trace failed", exc_info=True)

    @property
    def rank(self) -> int:
        """This process's global rank: as given, else torch.distributed's once it is initialised."""
        if self._rank is None:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                return 0
            self._rank = dist.get_rank()
        return self._rank

    # --- group ids --------------------------------------------------------------------
    def group_id(self, group: Any) -> str:
        """The id of a process group (``None`` = the default group): ``<desc>:<name>``, equal on every member."""
        key = id(group)
        found = self._group_ids.get(key)
        if found is not None:
            return found
        if group is None:
            import torch.distributed as dist

            group = dist.distributed_c10d._get_default_group()
        name = str(getattr(group, "group_name", "") or "")
        desc = str(getattr(group, "group_desc", "") or "")
        found = f"{desc}:{name}" if desc and desc != "undefined" and desc != name else (name or "default")
        self._group_ids[key] = found
        from trainhealth.exporters.collectives.nccl import time_on_device

        if time_on_device(self, group, found):
            self._device_timed.add(found)
        return found

    def p2p_group_id(self, group: Any, source: int, target: int) -> str:
        base = self.group_id(group)
        key = (base, source, target)
        found = self._p2p_ids.get(key)
        if found is None:
            found = self._p2p_ids[key] = f"{base}:{source}->{target}"
        return found

    # --- the training path ----------------------------------------------------------
    def begin(self, op: str, group: str, t0: float, is_async: bool) -> int:
        """Enter a collective: its sequence number in ``group``; marks it in flight."""
        seq = self._seq[group] = self._seq.get(group, -1) + 1
        if is_async:
            self._async[(group, seq)] = (op, t0)
        else:
            self._current = (op, group, seq, t0)
        return seq

    def end(self, op: str, group: str, seq: int, t0: float, duration: float, nbytes: int, peer: int | None,
            is_async: bool) -> None:
        """Leave a collective and record it (unless the NCCL completion hook records this group)."""
        if is_async:
            self._async.pop((group, seq), None)
        else:
            self._current = None
        self._completed[group] = seq
        if group not in self._device_timed:
            record = (self.step, op, group, seq, t0, duration, nbytes, peer, is_async)
            self._ring.append(record)
            self._pending.append(record)
            self._recorded += 1

    def abandon(self, group: str, seq: int, is_async: bool) -> None:
        """A collective raised (a timeout, an aborted communicator): no longer in flight, not recorded."""
        if is_async:
            self._async.pop((group, seq), None)
        else:
            self._current = None

    def add_device_record(self, op: str, group: str, seq: int, start_monotonic: float, duration: float) -> None:
        """A record from the NCCL completion hook (start on the monotonic clock, duration from CUDA events)."""
        self._completed[group] = max(seq, self._completed.get(group, -1))
        # the host does not wait for a device-timed collective as it runs: it counts as asynchronous
        record = (self.step, op, group, seq, start_monotonic, duration, 0, None, True)
        self._ring.append(record)
        self._pending.append(record)
        self._recorded += 1

    def device_timed(self, group: str) -> None:
        self._device_timed.add(group)

    def add_marker(self, op: str, step: int, t0: float, duration: float) -> None:
        """Record a host-timed row that is no collective: a ``step`` marker, a ``forward`` or an ``optimizer``.

        ``t0`` is on the clock of the collective records (``time.perf_counter``); group, seq,
        bytes and peer stay empty. Two deque appends: cheap enough for the training path.
        """
        record = (step, op, None, None, t0, duration, None, None, False)
        self._ring.append(record)
        self._pending.append(record)
        self._recorded += 1

    # --- wrapping ---------------------------------------------------------------------
    def wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        """A wrapper of ``torch.distributed.<name>`` that records each call."""
        call = COMMUNICATION_FUNCTIONS[name]
        position = {parameter: index for index, parameter in enumerate(inspect.signature(original).parameters)}
        wrapper = self._wrap_p2p(call, original, position) if call.peer else self._wrap_collective(call, original, position)
        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        wrapper.__name__ = getattr(original, "__name__", name)
        wrapper.__doc__ = getattr(original, "__doc__", None)
        return wrapper

    def _wrap_collective(self, call: _Call, original: Callable[..., Any], position: dict[str, int]) -> Callable[..., Any]:
        # The hot path: everything below runs per collective, so it is written out inline
        # against local references (see benchmarks/comm_overhead.py for its cost).
        op, inputs = call.op, call.inputs
        input_index = position.get(inputs, 1 << 30) if inputs else 1 << 30
        input_is_list = inputs in ("input_list", "input_tensor_list")
        group_index = position["group"]
        async_index = position.get("async_op", 1 << 30)
        logger, clock = self, time.perf_counter
        group_ids, seqs, completed, pending_async = self._group_ids, self._seq, self._completed, self._async
        device_timed, ring_append, pending_append = self._device_timed, self._ring.append, self._pending.append

        def recording(*args: Any, **kwargs: Any) -> Any:
            try:
                count = len(args)
                group_object = args[group_index] if count > group_index else kwargs.get("group")
                is_async = args[async_index] if count > async_index else kwargs.get("async_op", False)
                group = group_ids.get(id(group_object)) or logger.group_id(group_object)
                seq = seqs[group] = seqs.get(group, -1) + 1
                t0 = clock()
                if is_async:
                    pending_async[(group, seq)] = (op, t0)
                else:
                    logger._current = (op, group, seq, t0)
                if logger.injected_delay is not None:
                    _sleep(logger.injected_delay())
            except Exception:  # never let bookkeeping break a collective
                return original(*args, **kwargs)
            try:
                work = original(*args, **kwargs)
            except BaseException:
                logger.abandon(group, seq, bool(is_async))
                raise
            end = clock()
            try:
                value = args[input_index] if count > input_index else kwargs.get(inputs) if inputs else None
                nbytes = 0 if value is None else sum(t.nbytes for t in value) if input_is_list else value.nbytes
                if is_async:
                    if work is not None:
                        logger._end_when_done(work, op, group, seq, t0, nbytes, None)
                    else:  # inside an NCCL coalescing block: the completion hook records it
                        pending_async.pop((group, seq), None)
                    return work
                logger._current = None
                completed[group] = seq
                if group not in device_timed:
                    record = (logger.step, op, group, seq, t0, end - t0, nbytes, None, False)
                    ring_append(record)
                    pending_append(record)
                    logger._recorded += 1
            except Exception:
                logger.abandon(group, seq, bool(is_async))
            return work

        return recording

    def _wrap_p2p(self, call: _Call, original: Callable[..., Any], position: dict[str, int]) -> Callable[..., Any]:
        op, peer_name, always_async, is_recv = call.op, call.peer or "", call.always_async, call.peer == "src"
        tensor_index, group_index = position.get("tensor", 0), position["group"]
        peer_index = position.get(peer_name, 1 << 30)
        group_peer_name = f"group_{peer_name}"
        logger, clock, inside = self, time.perf_counter, self._inside

        def argument(args: tuple, kwargs: dict, index: int, name: str) -> Any:
            return args[index] if index < len(args) else kwargs.get(name)

        def recording(*args: Any, **kwargs: Any) -> Any:
            # send and recv run isend and irecv: those inner calls are the outer one, not records of their own
            if always_async and inside.__dict__.get("active"):
                return original(*args, **kwargs)
            try:
                group_object = argument(args, kwargs, group_index, "group")
                peer = argument(args, kwargs, peer_index, peer_name)
                if peer is None and kwargs.get(group_peer_name) is not None:
                    import torch.distributed as dist

                    # torch types group.WORLD Optional (None before init_process_group)
                    group_or_world = cast("dist.ProcessGroup", group_object or dist.group.WORLD)
                    peer = dist.get_global_rank(group_or_world, kwargs[group_peer_name])
                if is_recv and peer is None and not always_async:
                    return logger._recv_from_any(original, group_object, args, kwargs, tensor_index)
                source, target = (peer, logger.rank) if is_recv else (logger.rank, peer)
                group = logger.p2p_group_id(group_object, -1 if source is None else source, target)
                t0 = clock()
                seq = logger.begin(op, group, t0, always_async)
                if logger.injected_delay is not None:
                    _sleep(logger.injected_delay())
            except Exception:
                return original(*args, **kwargs)
            if not always_async:
                inside.active = True
            try:
                work = original(*args, **kwargs)
            except BaseException:
                logger.abandon(group, seq, always_async)
                raise
            finally:
                if not always_async:
                    inside.active = False
            try:
                nbytes = _nbytes(argument(args, kwargs, tensor_index, "tensor"))
                if always_async and work is not None:
                    logger._end_when_done(work, op, group, seq, t0, nbytes, peer)
                elif always_async:
                    logger.abandon(group, seq, True)
                else:
                    logger.end(op, group, seq, t0, clock() - t0, nbytes, peer, False)
            except Exception:
                logger.abandon(group, seq, always_async)
            return work

        return recording

    def _recv_from_any(self, original: Callable[..., Any], group_object: Any, args: tuple, kwargs: dict,
                       tensor_index: int) -> Any:
        """A blocking ``recv`` from any source: its group is known only once the sender is."""
        clock = time.perf_counter
        t0 = clock()
        waiting = self.p2p_group_id(group_object, -1, self.rank)
        self._current = ("recv", waiting, self._seq.get(waiting, -1) + 1, t0)
        self._inside.active = True
        try:
            source = original(*args, **kwargs)
        finally:
            self._current = None
            self._inside.active = False
        try:
            group = self.p2p_group_id(group_object, int(source), self.rank)
            seq = self.begin("recv", group, t0, False)
            tensor = args[tensor_index] if tensor_index < len(args) else kwargs.get("tensor")
            self.end("recv", group, seq, t0, clock() - t0, _nbytes(tensor), int(source), False)
        except Exception:
            log.debug("trainhealth: recording a recv failed", exc_info=True)
        return source

    def instrument_ddp(self, model: Any) -> Any:
        """Record a DDP model's bucket all-reduces with a communication hook; returns the model.

        The hook averages each bucket with an async all-reduce, as DDP's default
        does, timing it from the bucket being ready to the reduction completing.
        """
        import torch.distributed as dist

        process_group = model.process_group
        group = self.group_id(process_group)
        all_reduce = getattr(dist.distributed_c10d.all_reduce, "__wrapped__", dist.distributed_c10d.all_reduce)
        world = process_group.size()
        clock = time.perf_counter

        def hook(state, bucket):  # DDP rejects annotations other than its own
            tensor = bucket.buffer()
            t0 = clock()
            seq = self.begin("all_reduce", group, t0, True)
            if self.injected_delay is not None:
                _sleep(self.injected_delay())
            nbytes = tensor.nbytes
            tensor.div_(world)
            future = all_reduce(tensor, group=process_group, async_op=True).get_future()

            def reduced(done):
                try:
                    self.end("all_reduce", group, seq, t0, clock() - t0, nbytes, None, True)
                except Exception:
                    log.debug("trainhealth: recording a DDP bucket failed", exc_info=True)
                return done.value()[0]

            return future.then(reduced)

        model.register_comm_hook(None, hook)
        return model

    def _end_when_done(self, work: Any, op: str, group: str, seq: int, t0: float, nbytes: int,
                       peer: int | None) -> None:
        clock = time.perf_counter

        def done(_: Any) -> None:
            try:
                self.end(op, group, seq, t0, clock() - t0, nbytes, peer, True)
            except Exception:
                log.debug("trainhealth: recording an async collective failed", exc_info=True)

        try:
            future = work.get_future()
        except RuntimeError:  # gloo's send and receive works have no future
            self._poller.watch(work, lambda: done(None))
            return
        future.add_done_callback(done)

    # --- reading ----------------------------------------------------------------------
    def records(self) -> pd.DataFrame:
        """The records in the ring buffer as trace format v1 rows (start on the wall clock)."""
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
        return max(0, self._recorded - self._ring.maxlen) if self._ring.maxlen else 0

    def write_trace(self, trace_dir: str | Path | None = None) -> Path | None:
        """Write the ring as ``rank-<rank>.parquet`` and the abnormal records as ``abnormal/rank-<rank>.parquet``.

        Each file is written to a new file beside it (created exclusively, never through an
        existing link) and then renamed over it, so a reader sees the old trace or the new one.
        """
        from trainhealth.traces.io import write_trace

        directory = Path(trace_dir) if trace_dir is not None else self.trace_dir
        rows = list(self._ring)
        if directory is None or not rows:
            return None
        path = directory / f"rank-{self.rank}.parquet"
        with self._write_lock:
            write_trace(self._frame(rows), path)
            abnormal = list(self.abnormal_records)
            if abnormal:
                write_trace(self._frame(abnormal), directory / "abnormal" / f"rank-{self.rank}.parquet")
        if self.records_dropped:
            log.warning("trainhealth: the ring buffer held the last %d of %d collectives; raise "
                        "TRAINHEALTH_COMM_RING_SIZE to keep them all", len(rows), self._recorded)
        return path

    # --- the flush thread -------------------------------------------------------------
    def flush(self) -> None:
        """Aggregate new records into metrics, flag abnormal ones, refresh the in-flight view."""
        with self._flush_lock:
            batch = []
            while True:
                try:
                    batch.append(self._pending.popleft())
                except IndexError:
                    break
            collectives = [record for record in batch if record[1] in _COMMUNICATION]
            markers = [record for record in batch if record[1] == "step"]
            self._flushed_total += len(collectives)
            if collectives:
                self._aggregate(collectives)
            if not markers and not self._marked:
                self._unassigned.clear()  # nobody marks steps (yet): hold only what the first marker may need
            self._unassigned.extend((record[4], record[4] + record[5], record[8]) for record in collectives)
            if markers:
                self._marked = True
                self._account_steps(markers)
            if self.store is not None:
                self._export_inflight()
                dropped = self.records_dropped
                if dropped:
                    previous = cast(float, self.store.value(catalog.COMM_RECORDS_DROPPED) or 0.0)  # a counter
                    if dropped > previous:
                        self.store.inc(catalog.COMM_RECORDS_DROPPED, dropped - previous)

    def _aggregate(self, batch: list[tuple]) -> None:
        by_key: dict[tuple[str, str], list[tuple]] = {}
        for record in batch:
            by_key.setdefault((record[1], record[2]), []).append(record)
        for (op, group), records in by_key.items():
            durations = np.fromiter((r[5] for r in records), dtype=np.float64, count=len(records))
            sizes = [int(r[6] or 0) for r in records]
            flagged = []
            for size_class in sorted(set(s.bit_length() for s in sizes)):
                members = [i for i, s in enumerate(sizes) if s.bit_length() == size_class]
                hits = self._abnormal.flag((op, group, size_class), durations[members])
                flagged += [records[members[i]] for i in hits]
            self.abnormal_records.extend(flagged)
            self._abnormal_total += len(flagged)
            if self.detectors is not None:
                self.detectors.observe("comm_duration", float(np.median(durations)), series=f"{op}/{group}",
                                       step=records[-1][0])
            if self.store is not None:
                labels = (op, group)
                self.store.observe_many(catalog.COMM_OP_DURATION, durations.tolist(), labels)
                self.store.inc(catalog.COMM_OPS, len(records), labels)
                self.store.inc(catalog.COMM_BYTES, sum(sizes), labels)
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

    def _export_inflight(self) -> None:
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
        self.store.write(writes)  # type: ignore[union-attr]

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


class _CompletionPoller:
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


def _sleep(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)
