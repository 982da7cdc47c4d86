"""The process group of the cross-replica checks (fingerprints, gradient norms): their own, on gloo, with a timeout."""

from __future__ import annotations

import datetime
from typing import Any

__all__ = ["host_group"]

_created: dict[tuple[int, float], Any] = {}


def host_group(timeout_s: float) -> Any:
    """A gloo group of every rank, created once per default group and timeout.

    The checks never share the training's group: a check that waits past
    ``timeout_s`` fails on its own group and leaves the training's untouched.
    Creating a group is itself a collective: every rank must call this at the
    same point (the Monitor does, at the first check, in the optimizer step).
    """
    import torch.distributed as dist

    key = (id(dist.group.WORLD), timeout_s)
    if key not in _created:
        _created[key] = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return _created[key]
