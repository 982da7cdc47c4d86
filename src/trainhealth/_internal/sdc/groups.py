"""The process group of the cross-replica checks (fingerprints, gradient norms): their own, on gloo, with a timeout."""

from __future__ import annotations

import datetime
from typing import Any

__all__ = ["host_group", "release"]


def host_group(timeout_s: float) -> Any:
    """A new gloo group of every rank; :func:`release` frees it.

    The checks never share the training's group: a check that waits past
    ``timeout_s`` fails on its own group and leaves the training's untouched.
    Creating a group is itself a collective: every rank must call this at the
    same point (the Monitor does, at the first check, in the optimizer step).
    """
    import torch.distributed as dist

    return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))


def release(group: Any) -> None:
    """Destroy ``group`` (made by :func:`host_group`) on this rank; never raises.

    Destroying a gloo group is local to the rank. A group kept past the job's own
    ``destroy_process_group()`` would be freed only while the interpreter shuts
    down, where gloo's threads can abort the process ("terminate called without
    an active exception", https://github.com/pytorch/pytorch/issues/190489).
    """
    import torch.distributed as dist

    try:
        if dist.is_initialized():
            dist.destroy_process_group(group)
    except (RuntimeError, ValueError, KeyError):  # already destroyed with the others: nothing left to free
        pass
