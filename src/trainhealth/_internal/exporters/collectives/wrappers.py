"""The wrappers that record each collective: torch.distributed's functions and DDP's bucket hook.

Three capture paths, because none alone sees everything:

* wrappers around the explicit ``torch.distributed`` collectives (and ``isend`` /
  ``irecv``, through which ``batch_isend_irecv`` runs), timed to completion: a call is in
  flight from its launch until its Work completes. A synchronous call whose Work is not
  complete when it returns (NCCL returns at enqueue) stays in flight, held by the completion
  poller (:mod:`~trainhealth._internal.exporters.collectives.works`,
  :mod:`~trainhealth._internal.exporters.collectives.poller`), as do async works whose
  future completed before the work did (NCCL's futures complete at enqueue). torch 2.13's deprecated ``all_gather_into_tensor``
  and ``reduce_scatter_tensor`` run ``all_gather_single`` and ``reduce_scatter_single``: there
  only the latter are wrapped (:data:`DEPRECATED_ALIASES`), so each call is one record;
* a DDP communication hook (:func:`instrument_ddp`), because DDP's bucket
  all-reduces bypass ``torch.distributed.all_reduce``;
* on NCCL, the process group's completion hook, timed with CUDA events on the
  watchdog thread (:mod:`~trainhealth._internal.exporters.collectives.nccl`), so the
  training thread never synchronises.

The training-path cost is a few dictionary and clock operations (see benchmarks/comm_overhead.py).
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from trainhealth._internal.exporters.collectives.recorder import CollectiveRecorder
from trainhealth._internal.exporters.collectives.works import _slot

__all__ = ["COMMUNICATION_FUNCTIONS", "DEPRECATED_ALIASES", "instrument_ddp", "runs", "wrap"]


@dataclass(frozen=True)
class _Call:
    """How to read one torch.distributed function's arguments."""

    op: str
    inputs: str | None  # parameter holding the tensor (or list of tensors) sent
    peer: str | None = None  # dst / src for point-to-point
    always_async: bool = False
    inputs_are_list: bool = False


#: The wrapped torch.distributed functions and how their arguments are read; a name the installed torch
#: lacks (``all_gather_single`` before torch 2.13) is skipped. The trace format has no ``gather`` or
#: ``scatter``: they are recorded as the rooted collectives they resemble, ``reduce`` (many to one) and
#: ``broadcast`` (one to many). ``all_gather_object`` and the other object collectives run the tensor
#: collectives above, which record them.
COMMUNICATION_FUNCTIONS: dict[str, _Call] = {
    "all_reduce": _Call("all_reduce", "tensor"),
    "all_reduce_coalesced": _Call("all_reduce", "tensors", inputs_are_list=True),
    "all_gather": _Call("all_gather", "tensor"),
    "all_gather_single": _Call("all_gather", "input_tensor"),  # torch >= 2.13; FSDP2 calls it
    "all_gather_into_tensor": _Call("all_gather", "input_tensor"),
    "all_gather_coalesced": _Call("all_gather", "input_tensor_list", inputs_are_list=True),
    "reduce_scatter": _Call("reduce_scatter", "input_list", inputs_are_list=True),
    "reduce_scatter_single": _Call("reduce_scatter", "input"),  # torch >= 2.13; FSDP2 calls it
    "reduce_scatter_tensor": _Call("reduce_scatter", "input"),
    "all_to_all": _Call("all_to_all", "input_tensor_list", inputs_are_list=True),
    "all_to_all_single": _Call("all_to_all", "input"),
    "broadcast": _Call("broadcast", "tensor"),
    "scatter": _Call("broadcast", "tensor"),
    "reduce": _Call("reduce", "tensor"),
    "gather": _Call("reduce", "tensor"),
    "barrier": _Call("barrier", None),
    "monitored_barrier": _Call("barrier", None),
    "send": _Call("send", "tensor", peer="dst"),
    "recv": _Call("recv", "tensor", peer="src"),
    "isend": _Call("send", "tensor", peer="dst", always_async=True),
    "irecv": _Call("recv", "tensor", peer="src", always_async=True),
}

#: torch 2.13's deprecated names and the functions they run: where they run them (looked up by name in
#: torch's module, so the wrapper records the call), the deprecated name is left unwrapped.
DEPRECATED_ALIASES = {"all_gather_into_tensor": "all_gather_single", "reduce_scatter_tensor": "reduce_scatter_single"}


def runs(function: Any, name: str) -> bool:
    """Whether ``function`` (under its decorators) calls the module-level function ``name``."""
    code = getattr(inspect.unwrap(function), "__code__", None)
    return code is not None and name in code.co_names


def _nbytes(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, (list, tuple)):
        return sum(t.nbytes for t in value)
    return int(value.nbytes)


def wrap(logger: CollectiveRecorder, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """A wrapper of ``torch.distributed.<name>`` that records each call into ``logger``."""
    call = COMMUNICATION_FUNCTIONS[name]
    position = {parameter: index for index, parameter in enumerate(inspect.signature(original).parameters)}
    wrapper = (
        _wrap_p2p(logger, call, original, position) if call.peer else _wrap_collective(logger, call, original, position)
    )
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    wrapper.recorded_by = logger  # type: ignore[attr-defined]  # how a wrapper of ours is told from torch's own
    wrapper.__name__ = getattr(original, "__name__", name)
    wrapper.__doc__ = getattr(original, "__doc__", None)
    return wrapper


def _wrap_collective(
    logger: CollectiveRecorder, call: _Call, original: Callable[..., Any], position: dict[str, int]
) -> Callable[..., Any]:
    # The hot path: everything below runs per collective, so it is written out inline
    # against local references (see benchmarks/comm_overhead.py for its cost).
    op, inputs = call.op, call.inputs
    input_index = position.get(inputs, 1 << 30) if inputs else 1 << 30
    input_is_list = call.inputs_are_list
    group_index = position["group"]
    async_index = position.get("async_op", 1 << 30)
    clock, thread_id, slot = time.perf_counter, threading.get_ident, _slot
    group_ids, seqs, completed, pending_async = logger._group_ids, logger._seq, logger._completed, logger._async
    device_timed, pending_append = logger._device_timed, logger._pending.append
    host_synchronous = logger._host_synchronous

    # The default group's id, once a synchronous call on it was recorded and it is timed on the host: then
    # ``f(tensor)`` alone (the commonest call) takes the short path below, the same records with fewer steps.
    short: list[str | None] = [None]
    short_ok = input_index == 0 and not input_is_list

    def recording(*args: Any, **kwargs: Any) -> Any:
        group = short[0]
        if group is None or kwargs or len(args) != 1:
            return general(*args, **kwargs)
        seq = None
        try:
            seq = seqs[group] = seqs[group] + 1
            t0 = clock()
            logger._current = (op, group, seq, t0)
        except Exception as error:  # never let bookkeeping break a collective
            return _unrecorded(logger, error, original, args, kwargs, group, seq, False)
        early = group not in host_synchronous  # a backend whose calls may return before the collective is done
        if early:
            slot.work = None
        try:
            work = original(*args)
        except BaseException as error:
            logger.abandon(group, seq, False, error)
            raise
        end = clock()
        try:
            launched = slot.__dict__.pop("work", None) if early else None
            if launched is not None and not launched.is_completed():
                _still_in_flight(logger, launched, op, group, seq, t0, args[0].nbytes, None)  # returned at enqueue
                return work
            logger._current = None
            completed[group] = seq
            pending_append((logger.step, op, group, seq, t0, end - t0, args[0].nbytes, None, False))
            logger._recorded += 1
        except Exception as error:
            _completed_unrecorded(logger, error, group, seq, False)
        return work

    def general(*args: Any, **kwargs: Any) -> Any:
        group, seq, is_async = "", None, False
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
                logger.training_thread = thread_id()  # whose stack the hang watcher reads
        except Exception as error:  # never let bookkeeping break a collective
            return _unrecorded(logger, error, original, args, kwargs, group, seq, bool(is_async))
        early = group not in host_synchronous  # a backend whose calls may return before the collective is done
        if early:
            slot.work = None
        try:
            work = original(*args, **kwargs)
        except BaseException as error:
            logger.abandon(group, seq, bool(is_async), error)
            raise
        end = clock()
        try:
            launched = slot.__dict__.pop("work", None) if early else None
            value = args[input_index] if count > input_index else kwargs.get(inputs) if inputs else None
            nbytes = 0 if value is None else sum(t.nbytes for t in value) if input_is_list else value.nbytes
            if is_async:
                if work is not None:
                    _end_when_done(logger, work, op, group, seq, t0, nbytes, None)
                else:  # inside an NCCL coalescing block: the completion hook records it
                    pending_async.pop((group, seq), None)
                return work
            if launched is not None and not launched.is_completed():
                _still_in_flight(logger, launched, op, group, seq, t0, nbytes, None)  # returned at enqueue
                return work
            logger._current = None
            completed[group] = seq
            if group not in device_timed:
                pending_append((logger.step, op, group, seq, t0, end - t0, nbytes, None, False))
                logger._recorded += 1
                if group_object is None and short_ok:  # the training thread is known: f(tensor) may go short
                    short[0] = group
        except Exception as error:
            _completed_unrecorded(logger, error, group, seq, bool(is_async))
        return work

    return recording


def _wrap_p2p(
    logger: CollectiveRecorder, call: _Call, original: Callable[..., Any], position: dict[str, int]
) -> Callable[..., Any]:
    op, peer_name, always_async, is_recv = call.op, call.peer or "", call.always_async, call.peer == "src"
    tensor_index, group_index = position.get("tensor", 0), position["group"]
    peer_index = position.get(peer_name, 1 << 30)
    group_peer_name = f"group_{peer_name}"
    clock, inside = time.perf_counter, logger._inside

    def argument(args: tuple, kwargs: dict, index: int, name: str) -> Any:
        return args[index] if index < len(args) else kwargs.get(name)

    def recording(*args: Any, **kwargs: Any) -> Any:
        # send and recv run isend and irecv: those inner calls are the outer one, not records of their own
        if always_async and inside.__dict__.get("active"):
            return original(*args, **kwargs)
        group, seq, from_any = "", None, False
        try:
            group_object = argument(args, kwargs, group_index, "group")
            peer = argument(args, kwargs, peer_index, peer_name)
            if peer is None and kwargs.get(group_peer_name) is not None:
                import torch.distributed as dist

                # torch types group.WORLD Optional (None before init_process_group)
                group_or_world = cast("dist.ProcessGroup", group_object or dist.group.WORLD)
                peer = dist.get_global_rank(group_or_world, kwargs[group_peer_name])
            from_any = is_recv and peer is None and not always_async
            if not from_any:
                source, target = (peer, logger.rank) if is_recv else (logger.rank, peer)
                group = logger.p2p_group_id(group_object, -1 if source is None else source, target)
                t0 = clock()
                seq = logger.number(group)  # known here even if marking it fails: the peers numbered it too
                logger.mark(op, group, seq, t0, always_async)
        except Exception as error:
            return _unrecorded(logger, error, original, args, kwargs, group, seq, always_async)
        if seq is None:  # a receive from any source, outside the try: its failure is raised once, never retried
            return _recv_from_any(logger, original, group_object, args, kwargs, tensor_index)
        if not always_async:
            inside.active = True
        early = group not in logger._host_synchronous  # a backend whose calls may return before they are done
        if early:
            _slot.work = None
        try:
            work = original(*args, **kwargs)
        except BaseException as error:
            logger.abandon(group, seq, always_async, error)
            raise
        finally:
            if not always_async:
                inside.active = False
        launched = _slot.__dict__.pop("work", None) if early else None
        try:
            nbytes = _nbytes(argument(args, kwargs, tensor_index, "tensor"))
            if always_async and work is not None:
                _end_when_done(logger, work, op, group, seq, t0, nbytes, peer)
            elif always_async:
                logger.abandon(group, seq, True)
            elif launched is not None and not launched.is_completed():
                _still_in_flight(logger, launched, op, group, seq, t0, nbytes, peer)  # returned at enqueue
            else:
                logger.end(op, group, seq, t0, clock() - t0, nbytes, peer, False)
        except Exception as error:
            _completed_unrecorded(logger, error, group, seq, always_async)
        return work

    return recording


def _unrecorded(
    logger: CollectiveRecorder,
    error: Exception,
    original: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    group: str,
    seq: int | None,
    is_async: bool,
) -> Any:
    """The collective, run unrecorded after our bookkeeping failed before it (counted). Where it had already
    been numbered, it is no longer in flight (the watcher must not see a hang) and, once done, it counts as
    completed: the rank's sequence numbers stay the same as its peers'."""
    logger.bookkeeping_failed(error)
    if seq is not None:
        logger.abandon(group, seq, is_async)
    work = original(*args, **kwargs)
    if seq is not None and not is_async:
        logger._completed[group] = seq
    return work


def _completed_unrecorded(logger: CollectiveRecorder, error: Exception, group: str, seq: int, is_async: bool) -> None:
    """Our bookkeeping failed after the collective completed (counted): not in flight, completed, unrecorded."""
    logger.bookkeeping_failed(error)
    logger.abandon(group, seq, is_async)
    if not is_async:
        logger._completed[group] = seq


def _recv_from_any(
    logger: CollectiveRecorder,
    original: Callable[..., Any],
    group_object: Any,
    args: tuple,
    kwargs: dict,
    tensor_index: int,
) -> Any:
    """A blocking ``recv`` from any source: its group is known only once the sender is."""
    clock = time.perf_counter
    t0 = clock()
    waiting = logger.p2p_group_id(group_object, -1, logger.rank)
    logger._current = ("recv", waiting, logger._seq.get(waiting, -1) + 1, t0)
    logger._inside.active = True
    try:
        source = original(*args, **kwargs)
    except BaseException as error:
        logger.abandon(waiting, logger._seq.get(waiting, -1) + 1, False, error)
        raise
    finally:
        logger._current = None
        logger._inside.active = False
    try:
        group = logger.p2p_group_id(group_object, int(source), logger.rank)
        seq = logger.begin("recv", group, t0, False)
        tensor = args[tensor_index] if tensor_index < len(args) else kwargs.get("tensor")
        logger.end("recv", group, seq, t0, clock() - t0, _nbytes(tensor), int(source), False)
    except Exception as error:
        logger.bookkeeping_failed(error)
    return source


def instrument_ddp(logger: CollectiveRecorder, model: Any) -> Any:
    """Record a DDP model's bucket all-reduces with a communication hook; returns the model.

    The hook averages each bucket with an async all-reduce, as DDP's default
    does, timing it from the bucket being ready to the reduction completing.
    """
    import torch.distributed as dist

    process_group = model.process_group
    group = logger.group_id(process_group)
    c10d = dist.distributed_c10d
    world = process_group.size()
    clock = time.perf_counter

    def hook(state, bucket):  # DDP rejects annotations other than its own
        tensor = bucket.buffer()
        # the function under the recording wrapper, looked up per bucket: what a fault injector put there runs too
        all_reduce = c10d.all_reduce
        if getattr(all_reduce, "recorded_by", None) is logger:
            all_reduce = all_reduce.__wrapped__
        t0 = clock()
        seq = logger.begin("all_reduce", group, t0, True)
        nbytes = tensor.nbytes
        tensor.div_(world)
        work = all_reduce(tensor, group=process_group, async_op=True)
        future = work.get_future()

        def reduced(done):
            try:
                if group in logger._host_synchronous or work.is_completed():
                    logger.end("all_reduce", group, seq, t0, clock() - t0, nbytes, None, True)
                else:  # NCCL completes the future at enqueue: the bucket is in flight until the work is done
                    _end_on_completion(logger, work, "all_reduce", group, seq, t0, nbytes, None)
            except Exception as error:
                logger.bookkeeping_failed(error)
            return done.value()[0]

        return future.then(reduced)

    model.register_comm_hook(None, hook)
    return model


def _end_when_done(
    logger: CollectiveRecorder, work: Any, op: str, group: str, seq: int, t0: float, nbytes: int, peer: int | None
) -> None:
    """Record an async work when it completes: through its future where it has one (gloo completes the future
    with the work; NCCL at enqueue, so there a future done before its work hands the work to the poller)."""
    clock, step = time.perf_counter, logger.step

    def done(_: Any) -> None:
        try:
            if group in logger._host_synchronous or work.is_completed():
                logger.end(op, group, seq, t0, clock() - t0, nbytes, peer, True, step)
            else:
                _end_on_completion(logger, work, op, group, seq, t0, nbytes, peer)
        except Exception as error:
            logger.bookkeeping_failed(error)

    try:
        future = work.get_future()
    except RuntimeError:  # gloo's send and receive works have no future
        _end_on_completion(logger, work, op, group, seq, t0, nbytes, peer)
        return
    future.add_done_callback(done)


def _still_in_flight(
    logger: CollectiveRecorder, work: Any, op: str, group: str, seq: int, t0: float, nbytes: int, peer: int | None
) -> None:
    """A synchronous call returned before its Work completed (NCCL returns at enqueue): from now on it is an
    asynchronous collective, in flight until the work completes; the host no longer waits in it."""
    logger._current = None
    logger._async[(group, seq)] = (op, t0)
    _end_on_completion(logger, work, op, group, seq, t0, nbytes, peer)


def _end_on_completion(
    logger: CollectiveRecorder, work: Any, op: str, group: str, seq: int, t0: float, nbytes: int, peer: int | None
) -> None:
    """Record ``work`` when the poller sees it complete (in the step it was launched in); should the poller let it
    go, it is no longer in flight."""
    clock, step = time.perf_counter, logger.step

    def done() -> None:  # completed, or failed: either way no longer in flight (a failure raises where it is waited)
        try:
            logger.end(op, group, seq, t0, clock() - t0, nbytes, peer, True, step)
        except Exception as error:
            logger.bookkeeping_failed(error)

    def dropped() -> None:
        logger.abandon(group, seq, True)
        logger.bookkeeping_failed(OverflowError("more works in flight than the completion poller holds"))

    logger._poller.watch(work, done, dropped)
