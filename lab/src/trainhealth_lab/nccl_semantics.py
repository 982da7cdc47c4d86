"""A torch.distributed backend with NCCL's asynchronous semantics, on CPU: ``"ncclsim"``, for tests and the hang lab.

On NCCL a collective returns to the host once its kernel is enqueued, ``work.wait()`` does not block the host, the
collective completes later on the device, in order per communicator stream, and only then does ``is_completed()``
turn True; ``get_future()`` is complete at enqueue; a barrier blocks the host; the process group calls its completion
hook when each work completes. A collective a peer never joins therefore shows on the host as calls that return at
once and a host that runs ahead until something synchronises the device (``loss.item()``). This backend reproduces
that on CPU: every call is handed to an in-order "stream" (a worker thread) that runs it on an inner gloo process
group and waits for it, so a stuck operation holds back every later one, while the host goes on.

A workload registers the backend in each rank's process before it initialises torch.distributed, and puts a
:func:`synchronize` where a GPU job synchronises the device::

    dist.init_process_group(register(), rank=rank, world_size=world)
    dist.all_reduce(grad)        # returns at once; the stream runs it when the peers join
    synchronize()                # the host waits for the device, as loss.item() does on a GPU

How it differs from NCCL:

* There is no device. Tensors are CPU tensors; a collective runs on the group's stream thread through gloo. The
  input is copied at the call (what a kernel ordered after the producing work would read) and the output is written
  by the stream thread when the operation runs. Nothing orders host code after a collective the way a CUDA stream
  orders kernels, so the host can read an output before the collective wrote it, and a host write to an output
  between the call and the completion is overwritten: read results only after :func:`synchronize` (or
  ``work.wait(timeout=...)``), never rely on values before.
* Code that reads a collective's result on the host right after the call, which on a GPU synchronises through
  ``.item()`` or ``.cpu()``: the object collectives (``all_gather_object``, ``broadcast_object_list``, ...) and
  ``DistributedDataParallel``'s construction checks. Run it inside :func:`blocking_wait`, the stand-in for
  ``TORCH_NCCL_BLOCKING_WAIT=1`` around a block of host code.
* ``work.wait()`` returns at once; with a timeout (``work.wait(timedelta(seconds=5))``) or inside
  :func:`blocking_wait` it blocks until the operation completed, raising its error or on the timeout, as NCCL's
  blocking wait does. ``dist.barrier()`` blocks the host until the barrier ran (NCCL synchronises the device in
  it); an asynchronous barrier's ``wait()`` blocks. A work's future is complete at the call and holds the output
  tensors, as NCCL's does, so its callbacks run at the call, not at the completion.
* The completion hook (:meth:`NcclSimProcessGroup.register_on_completion_hook`, and the private
  ``group._register_on_completion_hook`` torch offers on NCCL) is called on the stream thread, after an operation
  completed and before :func:`synchronize` returns; NCCL calls it on its watchdog thread. It is called once per
  operation that succeeded, not for a failed one. ``time_started`` is the host call (NCCL: the work's creation),
  ``active_duration`` the time the operation ran on the stream (NCCL: between CUDA events), ``time_finished`` its
  end, all as :class:`~datetime.timedelta` on the clock of :func:`time.perf_counter` (CLOCK_MONOTONIC on Linux, the
  steady clock NCCL's times are on).
* Sequence numbers follow NCCL's: collectives count in one sequence (``group._get_sequence_number_for_group()``
  returns how many were issued), sends and receives in another. A barrier is reported as ``ALLREDUCE``, as on NCCL,
  whose barrier is a one-element all-reduce; ``all_reduce_coalesced`` as ``COALESCED``.
* Streams: one in-order stream per group runs its collectives. Sends and receives run on two more in-order streams
  of the group, one for sends and one for receives. NCCL runs point-to-point on a stream per peer pair and
  ``batch_isend_irecv`` groups a pair's sends and receives so an exchange cannot deadlock; torch runs
  ``batch_isend_irecv`` as single operations on a process group written in Python, and gloo's send waits for the
  matching receive, so sends and receives have separate streams here, or every exchange would deadlock.
* Failures: an operation that fails (gloo's timeout, the group's ``timeout``, ran out; a peer is gone) completes
  with its error and every later operation of the group fails at once, as on an aborted communicator. The process
  is not torn down (NCCL's watchdog would, under ``TORCH_NCCL_ASYNC_ERROR_HANDLING``); :func:`synchronize` raises.
* Bounded: a group holds at most :data:`MAX_IN_FLIGHT` operations not yet completed; a call beyond that blocks the
  host until one completes, as a full CUDA launch queue does. Each group has at most three daemon threads, which
  exit when the group is destroyed (``destroy_process_group`` lets the streams finish what was enqueued, waiting
  at most the group's timeout).
* What torch 2.13 allows a backend written in Python: c10d's ``Backend`` class has no Python constructor, so the
  backend is a ``ProcessGroup`` subclass (as torch's own ``threaded`` test backend), which ``init_process_group``
  and ``new_group`` return as the group itself, with no c10d backend registered in it. torch's Python collectives
  reach it, and so do C++ callers of the group's virtual methods (DDP's reducer, the functional ``all_reduce``).
  What looks up the group's c10d backend fails with "No backend type associated with device type cpu": the
  ``torch.ops.c10d.*`` operators, other functional collectives (``all_gather_tensor``; so DTensor and compiled
  FSDP2), the coalescing manager. ``group._get_backend(torch.device("cpu"))``, called from Python, returns the
  group itself (overridden; torch's C++ lookup is not). The group's class overrides the collective methods, so a
  wrapper set on ``torch.distributed.ProcessGroup``'s methods does not see its calls; one set on
  ``type(group)`` does. ReduceOp.AVG is a sum divided by the group size (gloo has no AVG);
  ``all_gather_coalesced``, ``recv`` from any source and ``monitored_barrier`` are not supported, as on NCCL.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (  # type: ignore[attr-defined]  # OpType: not in torch's stub
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    OpType,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
    Work,
)
from torch.distributed.distributed_c10d import GroupName
from torch.futures import Future

__all__ = [
    "BACKEND",
    "MAX_IN_FLIGHT",
    "NcclSimProcessGroup",
    "NcclSimWork",
    "WorkInfo",
    "blocking_wait",
    "register",
    "synchronize",
]

log = logging.getLogger(__name__)

#: The backend's name, for ``init_process_group`` and ``new_group``.
BACKEND = "ncclsim"
#: Operations of one group not yet completed, at most; a call beyond blocks the host.
MAX_IN_FLIGHT = 1024

_COLLECTIVES, _SENDS, _RECEIVES = "collectives", "sends", "receives"


@dataclass(frozen=True)
class WorkInfo:
    """What the completion hook is given: the attributes of torch's ``WorkInfo``.

    ``time_started``, ``time_finished``: :func:`time.perf_counter` times; ``active_duration``: the time the
    operation ran on its stream.
    """

    op_type: OpType
    seq: int
    time_started: timedelta
    time_finished: timedelta
    active_duration: timedelta


class _Blocking(threading.local):
    depth = 0


_blocking = _Blocking()


@contextlib.contextmanager
def blocking_wait() -> Iterator[None]:
    """Within the block, ``work.wait()`` of this thread blocks until the operation completed (NCCL's
    ``TORCH_NCCL_BLOCKING_WAIT``): for host code that reads a result right after the call (object collectives,
    DDP's construction)."""
    _blocking.depth += 1
    try:
        yield
    finally:
        _blocking.depth -= 1


class NcclSimWork(Work):
    """One operation: ``wait()`` returns at once, ``is_completed()`` turns True when its stream ran it."""

    def __init__(self, op_type: OpType, seq: int, outputs: list[torch.Tensor], *, barrier: bool = False) -> None:
        super().__init__()
        self.op_type, self.seq, self.time_started = op_type, seq, time.perf_counter()
        self._outputs, self._barrier = outputs, barrier
        self._error: BaseException | None = None
        self._completed = threading.Event()  # ran (or failed): is_completed()
        self._retired = threading.Event()  # and the completion hooks ran: what synchronize() waits for
        self._future: Future[list[torch.Tensor]] = Future()
        self._future.set_result(outputs)  # complete at enqueue, as NCCL's (CUDA-event semantics)

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Return at once (NCCL's ``wait`` only orders the current CUDA stream); block until the operation completed
        for a barrier, with a ``timeout`` and inside :func:`blocking_wait`, raising its error or on the timeout."""
        limit = timeout.total_seconds() if timeout is not None and timeout > timedelta(0) else None
        if not (self._barrier or limit is not None or _blocking.depth):
            return True
        if not self._completed.wait(limit):
            raise dist.DistBackendError(
                f"{BACKEND}: {self.op_type.name} (seq {self.seq}) not completed after {limit} s (work.wait timeout)"
            )
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._completed.is_set()

    def is_success(self) -> bool:
        """Completed without an error (False while it has not run)."""
        return self._completed.is_set() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def get_future(self) -> Future[list[torch.Tensor]]:
        return self._future

    def result(self) -> list[torch.Tensor]:
        return self._outputs

    def synchronize(self) -> None:
        """Nothing to do: NCCL's makes the current CUDA stream wait, and there is none."""

    def _finish(self, error: BaseException | None) -> None:
        self._error = error
        self._completed.set()


class _Streams:
    """A group's in-order streams (a worker thread each, started on first use) and what they share: the bound on
    operations in flight, the failure that broke the group, the completion hooks."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.hooks: list[Callable[[WorkInfo], Any]] = []
        self._cond = threading.Condition()
        self._queues: dict[str, deque[tuple[NcclSimWork, Callable[[], None]]]] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._last: dict[str, NcclSimWork] = {}
        self._in_flight = 0
        self._seq = {_COLLECTIVES: 0, _SENDS: 0}  # NCCL's seqCollective_ and seqP2P_ (sends and receives)
        self._closed = False
        self._aborted = False
        self.failure: BaseException | None = None

    def issued(self) -> int:
        return self._seq[_COLLECTIVES]

    def enqueue(
        self, lane: str, op_type: OpType, outputs: list[torch.Tensor], run: Callable[[], None], barrier: bool = False
    ) -> NcclSimWork:
        with self._cond:
            while self._in_flight >= MAX_IN_FLIGHT and not self._closed:
                self._cond.wait()
            if self._closed:
                raise dist.DistBackendError(f"{BACKEND}: process group {self.name} was shut down")
            counter = _COLLECTIVES if lane == _COLLECTIVES else _SENDS
            self._seq[counter] += 1
            work = NcclSimWork(op_type, self._seq[counter], outputs, barrier=barrier)
            self._queues.setdefault(lane, deque()).append((work, run))
            self._last[lane] = work
            self._in_flight += 1
            if lane not in self._threads:
                thread = threading.Thread(
                    target=self._run, args=(lane,), name=f"{BACKEND}-{self.name}-{lane}", daemon=True
                )
                self._threads[lane] = thread
                thread.start()
            self._cond.notify_all()
        return work

    def _run(self, lane: str) -> None:
        queue = self._queues[lane]
        while True:
            with self._cond:
                while not queue and not self._closed:
                    self._cond.wait()
                if not queue:
                    return
                work, run = queue[0]
                failure, aborted = self.failure, self._aborted
            started = time.perf_counter()
            error: BaseException | None = None
            if aborted:
                error = dist.DistBackendError(f"{BACKEND}: process group {self.name} was aborted")
            elif failure is not None:
                error = dist.DistBackendError(f"{BACKEND}: an earlier operation of group {self.name} failed: {failure}")
            else:
                try:
                    run()
                except Exception as exc:  # gloo's timeout, a peer gone: the work carries it
                    error = exc
            finished = time.perf_counter()
            with self._cond:
                if error is not None and self.failure is None:
                    self.failure = error
            work._finish(error)
            if error is None:
                self._call_hooks(work, started, finished)
            with self._cond:
                queue.popleft()
                self._in_flight -= 1
                work._retired.set()
                self._cond.notify_all()

    def _call_hooks(self, work: NcclSimWork, started: float, finished: float) -> None:
        info = WorkInfo(
            op_type=work.op_type,
            seq=work.seq,
            time_started=timedelta(seconds=work.time_started),
            time_finished=timedelta(seconds=finished),
            active_duration=timedelta(seconds=finished - started),
        )
        for hook in list(self.hooks):
            try:
                hook(info)
            except Exception:  # a hook's failure must not stop the stream (NCCL logs and goes on)
                log.warning("%s: a completion hook failed", BACKEND, exc_info=True)

    def drain(self, timeout_s: float | None = None) -> None:
        """Block until every operation enqueued so far completed and its hooks ran; raise the group's failure."""
        with self._cond:
            last = list(self._last.values())
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for work in last:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not work._retired.wait(remaining):
                raise TimeoutError(f"{BACKEND}: group {self.name} still has operations running after {timeout_s} s")
        if self.failure is not None:
            raise dist.DistBackendError(f"{BACKEND}: group {self.name} failed: {self.failure}") from self.failure

    def close(self, timeout_s: float, abort: bool = False) -> None:
        """Stop taking operations; let the streams finish what was enqueued (fail it, with ``abort``), waiting at
        most ``timeout_s``, and their threads exit."""
        with self._cond:
            self._closed = True
            self._aborted = self._aborted or abort
            threads = list(self._threads.values())
            self._cond.notify_all()
        _device.discard(self)
        deadline = time.monotonic() + timeout_s
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))


#: The live groups' streams in this process: what :func:`synchronize` drains (the "device").
_device: weakref.WeakSet[_Streams] = weakref.WeakSet()


def synchronize(group: dist.ProcessGroup | None = None, timeout: float | None = None) -> None:
    """Block the host until every operation enqueued so far ran, as ``torch.cuda.synchronize()`` (or reading
    ``loss.item()``) does on a GPU: of ``group``, or, with ``None``, of every ``ncclsim`` group of this process (the
    whole device). Raises the error of a group whose operation failed, and :class:`TimeoutError` after ``timeout``
    seconds (``None``: no limit, as the device's)."""
    if group is None:
        streams = list(_device)
    elif isinstance(group, NcclSimProcessGroup):
        streams = [group._streams]
    else:
        raise TypeError(f"synchronize needs a {BACKEND} process group, not {type(group).__name__}")
    deadline = None if timeout is None else time.monotonic() + timeout
    for stream in streams:
        stream.drain(None if deadline is None else max(0.0, deadline - time.monotonic()))


def _clone(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [tensor.detach().clone() for tensor in tensors]


def _land(targets: Sequence[torch.Tensor], results: Sequence[torch.Tensor]) -> None:
    with torch.no_grad():
        for target, result in zip(targets, results):
            target.copy_(result)


def _is_avg(op: Any) -> bool:
    return bool(op == ReduceOp.AVG)


def _averaged(opts: Any) -> tuple[Any, bool]:
    """gloo has no AVG: ``opts`` with a SUM in its place (a copy), and whether to divide by the group size."""
    if not _is_avg(opts.reduceOp):
        return opts, False
    summed = type(opts)()
    for name in ("asyncOp", "rootRank", "rootTensor", "timeout"):
        if hasattr(opts, name):
            setattr(summed, name, getattr(opts, name))
    summed.reduceOp = ReduceOp.SUM
    return summed, True


class NcclSimProcessGroup(dist.ProcessGroup):
    """A process group with NCCL's asynchronous semantics, on an inner gloo group (see the module's docstring)."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # the (store, rank, size) form is not subclassable
        self._rank, self._size, self._timeout = rank, size, timeout
        # the inner gloo group, on its own prefix of the store (Any: torch's stub lacks gloo's collectives)
        self._inner: Any = dist.ProcessGroupGloo(dist.PrefixStore(f"{BACKEND}/", store), rank, size, timeout)
        self._group_name, self._group_desc = "", ""
        self._streams = _Streams(f"rank {rank} of {size}")
        _device.add(self._streams)
        weakref.finalize(self, self._streams.close, 0.0, True).atexit = False

    def __repr__(self) -> str:
        return f"NcclSimProcessGroup(rank={self._rank}, size={self._size}, name={self._group_name!r})"

    # --- identity ---------------------------------------------------------------------
    def getBackendName(self) -> str:
        return BACKEND

    def setGroupName(self, name: str) -> None:
        self._group_name = name
        self._streams.name = name

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return self._group_desc

    @property
    def group_name(self) -> GroupName:
        return GroupName(self._group_name)

    @property
    def group_desc(self) -> str:
        return self._group_desc

    def _get_backend(self, device: torch.device) -> NcclSimProcessGroup:  # type: ignore[override]
        """The group itself, for the CPU (torch's C++ lookup knows no backend of a Python group)."""
        if torch.device(device).type != "cpu":
            raise RuntimeError(f"No backend type associated with device type {torch.device(device).type}")
        return self

    def _get_sequence_number_for_group(self) -> int:
        """Collectives issued on this group (NCCL's ``seqCollective_``)."""
        return self._streams.issued()

    # --- completion hook and lifetime -------------------------------------------------
    def register_on_completion_hook(self, hook: Callable[[WorkInfo], Any]) -> None:
        """Call ``hook(WorkInfo)`` on the stream thread after each operation of this group completed."""
        self._streams.hooks.append(hook)

    def _register_on_completion_hook(self, hook: Callable[[WorkInfo], Any]) -> None:
        self.register_on_completion_hook(hook)

    def _enable_collectives_timing(self) -> None:
        """Always on: every operation is timed."""

    def _has_hooks(self) -> bool:
        return bool(self._streams.hooks)

    def _wait_for_pending_works(self) -> None:
        self._streams.drain(self._timeout.total_seconds())

    def shutdown(self) -> None:
        """Let the streams finish what was enqueued (at most the group's timeout) and stop them."""
        self._streams.close(self._timeout.total_seconds())

    def abort(self) -> None:
        """Fail what was enqueued and not started; stop the streams."""
        self._streams.close(0.0, abort=True)

    # --- collectives ------------------------------------------------------------------
    def _collective(
        self, op_type: OpType, outputs: list[torch.Tensor], run: Callable[[], None], barrier: bool = False
    ) -> NcclSimWork:
        return self._streams.enqueue(_COLLECTIVES, op_type, outputs, run, barrier)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> NcclSimWork:  # type: ignore[override]
        opts, average = _averaged(opts or AllreduceOptions())
        staged = _clone(tensors)

        def run() -> None:
            self._inner.allreduce(staged, opts).wait()
            _land(tensors, [t / self._size for t in staged] if average else staged)

        return self._collective(OpType.ALLREDUCE, tensors, run)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> NcclSimWork:
        opts, average = _averaged(opts or AllreduceCoalescedOptions())
        staged = _clone(tensors)

        def run() -> None:
            self._inner.allreduce_coalesced(staged, opts).wait()
            _land(tensors, [t / self._size for t in staged] if average else staged)

        return self._collective(OpType.COALESCED, tensors, run)  # NCCL's op type for it

    def allgather(  # type: ignore[override]
        self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> NcclSimWork:
        opts, staged = opts or AllgatherOptions(), _clone(inputs)

        def run() -> None:
            self._inner.allgather(output_lists, staged, opts).wait()

        return self._collective(OpType.ALLGATHER, [t for outputs in output_lists for t in outputs], run)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> NcclSimWork:
        opts, staged = opts or AllgatherOptions(), input.detach().clone()

        def run() -> None:
            self._inner._allgather_base(output, staged, opts).wait()

        return self._collective(OpType._ALLGATHER_BASE, [output], run)

    def reduce_scatter(  # type: ignore[override]
        self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None
    ) -> NcclSimWork:
        opts, average = _averaged(opts or ReduceScatterOptions())
        staged = [_clone(inputs) for inputs in input_lists]

        def run() -> None:
            self._inner.reduce_scatter(outputs, staged, opts).wait()
            if average:
                _land(outputs, [t / self._size for t in outputs])

        return self._collective(OpType.REDUCE_SCATTER, outputs, run)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> NcclSimWork:
        opts, average = _averaged(opts or ReduceScatterOptions())
        staged = input.detach().clone()

        def run() -> None:
            self._inner._reduce_scatter_base(output, staged, opts).wait()
            if average:
                _land([output], [output / self._size])

        return self._collective(OpType._REDUCE_SCATTER_BASE, [output], run)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> NcclSimWork:
        opts, staged = opts or AllToAllOptions(), _clone(inputs)

        def run() -> None:
            self._inner.alltoall(outputs, staged, opts).wait()

        return self._collective(OpType.ALLTOALL, outputs, run)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> NcclSimWork:
        opts, staged = opts or AllToAllOptions(), input.detach().clone()
        output_splits, input_splits = list(output_split_sizes), list(input_split_sizes)

        def run() -> None:
            self._inner.alltoall_base(output, staged, output_splits, input_splits, opts).wait()

        return self._collective(OpType.ALLTOALL_BASE, [output], run)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> NcclSimWork:  # type: ignore[override]
        opts, staged = opts or BroadcastOptions(), _clone(tensors)

        def run() -> None:
            self._inner.broadcast(staged, opts).wait()
            if self._rank != opts.rootRank:
                _land(tensors, staged)

        return self._collective(OpType.BROADCAST, tensors, run)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> NcclSimWork:  # type: ignore[override]
        opts, average = _averaged(opts or ReduceOptions())
        staged = _clone(tensors)
        root = opts.rootRank

        def run() -> None:
            self._inner.reduce(staged, opts).wait()
            if self._rank == root:
                _land(tensors, [t / self._size for t in staged] if average else staged)

        return self._collective(OpType.REDUCE, tensors, run)

    def gather(  # type: ignore[override]
        self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> NcclSimWork:
        opts, staged = opts or GatherOptions(), _clone(inputs)

        def run() -> None:
            self._inner.gather(output_lists, staged, opts).wait()

        return self._collective(OpType.GATHER, [t for outputs in output_lists for t in outputs], run)

    def scatter(  # type: ignore[override]
        self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None
    ) -> NcclSimWork:
        opts, staged = opts or ScatterOptions(), [_clone(inputs) for inputs in input_lists]

        def run() -> None:
            self._inner.scatter(outputs, staged, opts).wait()

        return self._collective(OpType.SCATTER, outputs, run)

    def barrier(self, opts: Any = None) -> NcclSimWork:
        """Block until every member reached it (NCCL synchronises the device in a barrier); an asynchronous
        barrier's ``wait()`` blocks instead."""
        opts = opts or BarrierOptions()

        inner = BarrierOptions()
        inner.timeout = opts.timeout

        def run() -> None:
            self._inner.barrier(inner).wait()

        # NCCL's barrier is a one-element all-reduce, and its hook says so
        work = self._collective(OpType.ALLREDUCE, [], run, barrier=True)
        if not opts.asyncOp:
            work.wait()
        return work

    # --- point to point ---------------------------------------------------------------
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> NcclSimWork:
        staged = _clone(tensors)

        def run() -> None:
            self._inner.send(staged, dst, tag).wait()

        return self._streams.enqueue(_SENDS, OpType.SEND, tensors, run)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> NcclSimWork:
        def run() -> None:
            self._inner.recv(tensors, src, tag).wait()

        return self._streams.enqueue(_RECEIVES, OpType.RECV, tensors, run)


def _create(store: dist.Store, rank: int, size: int, timeout: timedelta) -> NcclSimProcessGroup:
    return NcclSimProcessGroup(store, rank, size, timeout)


_registering = threading.Lock()


def register() -> str:
    """Register the backend with torch.distributed (once; later calls do nothing) and return its name.

    >>> register()
    'ncclsim'
    >>> register() == BACKEND
    True
    """
    with _registering:
        if BACKEND not in dist.Backend.backend_list:
            dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
    return BACKEND
