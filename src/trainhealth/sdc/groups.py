"""A process group for small host-side exchanges (fingerprints, gradient norms) next to any training backend."""

from __future__ import annotations

from typing import Any

__all__ = ["host_group"]

_created: dict[int, Any] = {}


def host_group() -> Any:
    """The default group when it runs on gloo, else a gloo group of every rank, created once.

    Creating a group is itself a collective: every rank must call this at the
    same point (the Monitor does, at the first check step).
    """
    import torch.distributed as dist

    if dist.get_backend() == "gloo":
        return None  # the default group
    key = id(dist.group.WORLD)
    if key not in _created:
        _created[key] = dist.new_group(backend="gloo")
    return _created[key]
