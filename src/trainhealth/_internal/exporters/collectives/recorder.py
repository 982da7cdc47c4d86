"""The training-path half of the collective logger: sequence numbers, in-flight state, records.

Records are tuples ``(step, op, group, seq, start, duration, bytes, peer, is_async)``,
the first eight the trace columns (:data:`RECORD_FIELDS`), ``start`` on the
``time.perf_counter`` clock. A group id is the same string on every member
(``<desc>:<name>`` of the process group, and ``<pg>:<src>-><dst>`` for
point-to-point), and ``seq`` numbers the group's operations, so one collective
has the same (group, seq) on all its members. Everything here is a few
dictionary and deque operations: it runs inside each collective
(:mod:`~trainhealth._internal.exporters.collectives.wrappers`); aggregation and writing
happen on the flush thread of :class:`~trainhealth._internal.exporters.collectives.logger.CollectiveLogger`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainhealth._internal.exporters.collectives.poller import CompletionPoller
from trainhealth._internal.exporters.collectives.works import capture_works

if TYPE_CHECKING:
    from trainhealth._internal.store import MetricStore

__all__ = ["RECORD_FIELDS", "CollectiveFailure", "CollectiveRecorder"]

RECORD_FIELDS = ("step", "op", "group", "seq", "start", "duration", "bytes", "peer")


@dataclass(frozen=True)
class CollectiveFailure:
    """The first collective that raised on this rank: what it was, when (unix time), and the error's first line."""

    op: str
    group: str
    seq: int
    time: float
    error: str


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300] if text else ''}"


class CollectiveRecorder:
    """Records the collectives of one rank into a ring of ``ring_size`` and a queue for the flush thread."""

    def __init__(
        self, *, rank: int | None = None, host: str = "", gpu: int | None = None, ring_size: int = 65536
    ) -> None:
        if ring_size < 1:
            raise ValueError("ring_size must be >= 1")
        self.step = 0
        self._rank = rank
        self.host = host
        self.gpu = gpu
        self._ring: deque[tuple] = deque(maxlen=ring_size)  # the last records, kept by the flush thread
        self._pending: deque[tuple] = deque(maxlen=ring_size)  # records the flush thread has not seen
        self._recorded = 0
        self._seq: dict[str, int] = {}
        self._completed: dict[str, int] = {}
        self._current: tuple[str, str, int, float] | None = None  # the synchronous collective in progress
        self._async: dict[tuple[str, int], tuple[str, float]] = {}  # async collectives not yet complete
        self._group_ids: dict[int, str] = {}  # id() of a live group object -> its id (the object is held below)
        self._group_objects: dict[int, Any] = {}  # held while cached, so no new group can take a cached id()
        self._members: dict[str, tuple[int, ...]] = {}  # group id -> its global ranks (who should be there)
        self.training_thread: int | None = None  # the thread that last entered a collective
        self.failure: CollectiveFailure | None = None  # the first collective that raised
        self.store: MetricStore | None = None  # where our own errors are counted (the logger's)
        self.failures = 0  # collectives that raised
        self._p2p_ids: dict[tuple[str, int, int], str] = {}
        self._device_timed: set[str] = set()  # groups recorded by the NCCL completion hook
        # groups on a backend whose wait blocks the host until the collective is done (gloo, MPI): there a call that
        # returned is complete (some of gloo's works never report is_completed, e.g. reduce_scatter's)
        self._host_synchronous: set[str] = set()
        # whether to wrap the ProcessGroup methods (install() sets it) when a group on another backend appears
        self.hold_works = False
        self._clock_offset = time.time() - time.perf_counter()
        self._poller = CompletionPoller()
        self._inside = threading.local()  # set while a wrapped call runs, so nested ones pass through

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
        """The id of a process group (``None`` = the default group): ``<desc>:<name>``, equal on every member.

        torch names groups in creation order (``new_group`` counts them), the same on every
        member, so a group created after another one was destroyed gets a name, and sequence
        numbers, of its own. The object is held while its id is cached, so Python cannot give
        a new group a cached object's ``id()``; :meth:`forget_destroyed_groups` lets go of
        destroyed ones.
        """
        key = id(group)
        found = self._group_ids.get(key)
        if found is not None:
            return found
        held = group
        if group is None:
            import torch.distributed as dist

            group = dist.distributed_c10d._get_default_group()
        name = str(getattr(group, "group_name", "") or "")
        desc = str(getattr(group, "group_desc", "") or "")
        found = f"{desc}:{name}" if desc and desc != "undefined" and desc != name else (name or "default")
        self._group_objects[key] = held
        self._group_ids[key] = found
        self._members[found] = _members(group)
        if _backend_name(group) in HOST_SYNCHRONOUS_BACKENDS:
            self._host_synchronous.add(found)
        elif self.hold_works:  # calls may return before their Work completes: read the Work they wait on
            capture_works()
            capture_works(type(group))  # a process group written in Python overrides the methods wrapped
        from trainhealth._internal.exporters.collectives.nccl import time_on_device

        if time_on_device(self, group, found):
            self._device_timed.add(found)
        return found

    def forget_destroyed_groups(self) -> list[str]:
        """Let go of the groups torch has destroyed since the last call (flush thread); their ids. A group is
        forgotten only when nothing of it is in flight."""
        try:
            import torch.distributed as dist

            if not dist.is_initialized():
                return []
            live = dist.distributed_c10d._world.pg_map
        except Exception:  # torch without the map, or the default group being torn down: keep everything
            return []
        in_flight = {group for group, _ in list(self._async)}
        current = self._current
        if current is not None:
            in_flight.add(current[1])
        gone = []
        for key, held in list(self._group_objects.items()):
            if held is None or held in live:
                continue
            name = self._group_ids.get(key)
            if name is None or name in in_flight:
                continue
            del self._group_ids[key], self._group_objects[key]
            gone.append(name)
        for name in gone:
            self._members.pop(name, None)
            for table in (self._seq, self._completed):
                for group in [g for g in table if g == name or g.startswith(name + ":")]:
                    del table[group]
            for p2p in [k for k, v in self._p2p_ids.items() if k[0] == name]:
                del self._p2p_ids[p2p]
        return gone

    @property
    def members(self) -> dict[str, tuple[int, ...]]:
        """Each group this rank used: the global ranks in it (empty when torch could not say)."""
        return dict(self._members)

    def p2p_group_id(self, group: Any, source: int, target: int) -> str:
        base = self.group_id(group)
        key = (base, source, target)
        found = self._p2p_ids.get(key)
        if found is None:
            found = self._p2p_ids[key] = f"{base}:{source}->{target}"
            if base in self._host_synchronous:
                self._host_synchronous.add(found)
        return found

    # --- the training path ----------------------------------------------------------
    def begin(self, op: str, group: str, t0: float, is_async: bool) -> int:
        """Enter a collective: its sequence number in ``group``; marks it in flight."""
        seq = self.number(group)
        self.mark(op, group, seq, t0, is_async)
        return seq

    def number(self, group: str) -> int:
        """The next sequence number in ``group`` (its peers give the same call the same number)."""
        seq = self._seq[group] = self._seq.get(group, -1) + 1
        return seq

    def mark(self, op: str, group: str, seq: int, t0: float, is_async: bool) -> None:
        """Mark collective ``seq`` of ``group`` in flight since ``t0``."""
        if is_async:  # possibly on another thread (DDP's hook runs on autograd's device thread)
            self._async[(group, seq)] = (op, t0)
        else:
            self.training_thread = threading.get_ident()
            self._current = (op, group, seq, t0)

    def end(
        self,
        op: str,
        group: str,
        seq: int,
        t0: float,
        duration: float,
        nbytes: int,
        peer: int | None,
        is_async: bool,
        step: int | None = None,
    ) -> None:
        """Leave a collective and record it (unless the NCCL completion hook records this group); ``step``: the
        training step it was launched in, when it completes later (default: the current one)."""
        if is_async:
            self._async.pop((group, seq), None)
        else:
            self._current = None
        if seq > self._completed.get(group, -1):  # works polled to completion may be seen out of order
            self._completed[group] = seq
        if group not in self._device_timed:
            record = (self.step if step is None else step, op, group, seq, t0, duration, nbytes, peer, is_async)
            self._pending.append(record)
            self._recorded += 1

    def abandon(self, group: str, seq: int, is_async: bool, error: BaseException | None = None) -> None:
        """A collective raised (a timeout, a peer gone, an aborted communicator) with ``error``, or its bookkeeping
        failed (no error): no longer in flight, not recorded. The first error is kept for the hang watcher."""
        if is_async:
            entered = self._async.pop((group, seq), None)
            op = entered[0] if entered else ""
        else:
            op = self._current[0] if self._current is not None else ""
            self._current = None
        if error is not None:
            self.failures += 1
            if self.failure is None:
                self.failure = CollectiveFailure(op, group, seq, time.time(), _first_line(error))

    def bookkeeping_failed(self, error: Exception) -> None:
        """Our own recording around a collective failed (the collective itself still ran): counted in
        ``trainhealth_exporter_errors_total{source="comm_bookkeeping"}``, that call left unrecorded."""
        if self.store is not None:
            self.store.record_error("comm_bookkeeping", error)

    def add_device_record(self, op: str, group: str, seq: int, start_monotonic: float, duration: float) -> None:
        """A record from the NCCL completion hook (start on the monotonic clock, duration from CUDA events)."""
        self._completed[group] = max(seq, self._completed.get(group, -1))
        # the host does not wait for a device-timed collective as it runs: it counts as asynchronous
        record = (self.step, op, group, seq, start_monotonic, duration, 0, None, True)
        self._pending.append(record)
        self._recorded += 1

    def device_timed(self, group: str) -> None:
        self._device_timed.add(group)

    def stop(self) -> None:
        """Stop the thread that watches gloo's send and receive works for their completion."""
        self._poller.stop()

    def add_marker(self, op: str, step: int, t0: float, duration: float) -> None:
        """Record a host-timed row that is no collective: a ``step`` marker, a ``forward`` or an ``optimizer``.

        ``t0`` is on the clock of the collective records (``time.perf_counter``); group, seq,
        bytes and peer stay empty. Two deque appends: cheap enough for the training path.
        """
        record = (step, op, None, None, t0, duration, None, None, False)
        self._pending.append(record)
        self._recorded += 1


#: backends whose ``Work.wait()`` blocks the host until the collective completed
HOST_SYNCHRONOUS_BACKENDS = frozenset({"gloo", "mpi"})


def _backend_name(group: Any) -> str:
    """The name of a process group's backend ("gloo", "nccl", a registered one), or "" when torch cannot say."""
    try:
        return str(group._get_backend_name()).lower()
    except Exception:  # a test double, an older torch
        return ""


def _members(group: Any) -> tuple[int, ...]:
    """The global ranks of a process group, from torch.distributed (empty when it cannot say)."""
    try:
        import torch.distributed as dist

        return tuple(int(rank) for rank in dist.get_process_group_ranks(group))
    except Exception:  # not a c10d group (a test double), or torch without the call: the members stay unknown
        return ()
