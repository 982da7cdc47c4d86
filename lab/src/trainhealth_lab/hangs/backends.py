"""The torch.distributed backends a hang-lab job runs on: gloo, and ``ncclsim``, a CPU backend with NCCL's semantics.

On gloo a collective call returns when the collective is done: a rank that waits for a
peer waits inside the call. On NCCL the call returns once the kernel is enqueued; the host
runs ahead and blocks where it reads a value (``loss.item()``, a gradient norm for
clipping or logging), outside every collective call, while the collective it launched
is still in flight. ``ncclsim`` is :mod:`trainhealth_lab.nccl_semantics` (gloo
underneath; calls return at once and complete later on a per-group stream thread, their
Work's ``is_completed()`` true only then), whose ``synchronize()`` blocks the host until
the streams drain, as ``torch.cuda.synchronize()`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["BACKENDS", "Backend", "open_backend"]

#: the lab's names of the backends a case can run on
BACKENDS = ("gloo", "ncclsim")


@dataclass(frozen=True)
class Backend:
    """A backend as the rank workload uses it: the name ``init_process_group`` takes, and where the host
    blocks for the device (a no-op on gloo, whose calls return only when done)."""

    name: str
    torch_name: str
    synchronize: Callable[[], None]


def _nothing() -> None:
    return None


def open_backend(name: str) -> Backend:
    """The backend ``name`` (one of :data:`BACKENDS`), registered with torch.distributed where it needs to be."""
    if name == "gloo":
        return Backend("gloo", "gloo", _nothing)
    if name != "ncclsim":
        raise ValueError(f"backend {name!r} is not one of {', '.join(BACKENDS)}")
    from trainhealth_lab import nccl_semantics  # imports torch: only in the ranks that use it

    return Backend("ncclsim", nccl_semantics.register(), nccl_semantics.synchronize)
