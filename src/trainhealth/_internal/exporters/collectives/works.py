"""The Work behind a synchronous collective call, kept so the call counts as in flight until the Work completes.

``torch.distributed.all_reduce(t)`` calls ``group.allreduce(...)``, waits on the Work it
returns and drops it. On gloo that wait blocks until the collective is done. On NCCL it
does not: the wait only orders the current CUDA stream after the collective, the call
returns once the kernel is enqueued, and the host runs ahead while the collective may
still be stuck on the device (see the ``wait`` note in torch's ``Work`` documentation,
https://pytorch.org/docs/stable/distributed.html#torch.distributed.Work). To tell "returned"
from "completed", :func:`capture_works` wraps the ``ProcessGroup`` methods torch's
collective functions call, so the wrapper of each collective can read the Work of its own
call (:func:`last_work`, per thread) and hold it until ``is_completed()``. The methods are
wrapped on the class (and on each Python subclass that overrides them) when the installed
logger first meets a group whose backend does not block the host until the collective is done
(not gloo or MPI: there a call that returned is complete, and nothing is wrapped), and restored
by :func:`release_works`.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["capture_works", "clear_work", "last_work", "release_works"]

#: the ProcessGroup methods torch.distributed's collective functions call, each returning a Work
METHODS = (
    "allreduce",
    "allreduce_coalesced",
    "allgather",
    "_allgather_base",
    "allgather_coalesced",
    "allgather_into_tensor_coalesced",
    "all_gather_single",
    "reduce_scatter",
    "_reduce_scatter_base",
    "reduce_scatter_single",
    "reduce_scatter_tensor_coalesced",
    "alltoall",
    "alltoall_base",
    "all_to_all_single",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "barrier",
    "send",
    "recv",
    "recv_anysource",
)

_slot = threading.local()
_originals: dict[tuple[type, str], Any] = {}  # (class, method) -> the method before ours
_lock = threading.Lock()


def _capturing(original: Any) -> Any:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        work = original(self, *args, **kwargs)
        _slot.work = work
        return work

    method.__wrapped__ = original  # type: ignore[attr-defined]
    method.__name__ = getattr(original, "__name__", "method")
    method.__doc__ = getattr(original, "__doc__", None)
    return method


def capture_works(group_class: type | None = None) -> bool:
    """Wrap the methods of ``ProcessGroup`` (default), or of a Python subclass that overrides them (a backend
    written in Python, as torch's own threaded test backend is); idempotent. False when there was nothing to wrap."""
    import torch.distributed as dist

    group_class = group_class or getattr(dist, "ProcessGroup", None)
    if group_class is None:
        return False
    with _lock:
        for name in METHODS:
            original = group_class.__dict__.get(name)
            if original is None or (group_class, name) in _originals:
                continue
            try:
                setattr(group_class, name, _capturing(original))
            except (AttributeError, TypeError):  # a build whose class refuses it: those calls end at return
                continue
            _originals[(group_class, name)] = original
        return any(cls is group_class for cls, _ in _originals)


def release_works() -> None:
    """Restore every wrapped method."""
    with _lock:
        for (group_class, name), original in _originals.items():
            setattr(group_class, name, original)
        _originals.clear()


def clear_work() -> None:
    """Forget this thread's last Work (before a call, so a call that made none reads None)."""
    _slot.work = None


def last_work() -> Any:
    """The Work of this thread's last ProcessGroup call, once; None when there was none."""
    work = getattr(_slot, "work", None)
    _slot.work = None
    return work
