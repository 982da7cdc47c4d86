"""Faults the hang lab installs into a rank process from outside the training path: wrappers, never product code.

* :class:`SlowCollective` delays one ``torch.distributed`` collective on the rank that arms it:
  installed *under* trainhealth's wrapper (before the Monitor), so the collective logger sees
  a collective that every rank entered and that completes late, as a large all-gather over
  a slow link does.
* :class:`DiskStall` makes ``os.fsync`` block for the stall's length once it began, as a
  shared filesystem (NFS, Lustre) that stops answering does: every write that must reach
  the disk (trace appends, stack files, Flight Recorder dumps) waits until the disk is back.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["DiskStall", "SlowCollective"]


class SlowCollective:
    """Wraps ``torch.distributed.<name>`` (and its c10d definition): the call after :meth:`arm` sleeps
    ``seconds`` before it runs the collective. Install it before trainhealth's wrappers."""

    def __init__(self, name: str) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        self._delay = 0.0
        original: Callable[..., Any] = getattr(c10d, name)

        def slowed(*args: Any, **kwargs: Any) -> Any:
            delay, self._delay = self._delay, 0.0
            if delay > 0:
                time.sleep(delay)  # the transfer takes this long; every peer is inside its own call meanwhile
            return original(*args, **kwargs)

        slowed.__name__ = getattr(original, "__name__", name)
        slowed.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(c10d, name, slowed)
        if getattr(dist, name, None) is original:
            setattr(dist, name, slowed)

    def arm(self, seconds: float) -> None:
        """The next call takes ``seconds`` longer."""
        self._delay = float(seconds)


class DiskStall:
    """``os.fsync`` blocks while the disk is stalled: from the onset the case's target wrote (``onset-*.json``
    under ``out``) for ``seconds``. A call made during the stall returns when it ends; calls before the onset
    and after the stall pass straight through. Every rank installs it: the trace directory is shared."""

    def __init__(self, out: Path, seconds: float) -> None:
        self._out = out
        self._seconds = float(seconds)
        self._onset: float | None = None
        self._fsync = os.fsync
        os.fsync = self.fsync

    def _began(self) -> float | None:
        if self._onset is None:
            found = next(iter(self._out.glob("onset-*.json")), None)
            if found is not None:
                try:
                    self._onset = float(json.loads(found.read_text())["time"])
                except (OSError, ValueError, KeyError):
                    return None  # being written: looked at again at the next call
        return self._onset

    def fsync(self, fd: Any) -> None:
        onset = self._began()
        if onset is not None:
            remaining = onset + self._seconds - time.time()
            if remaining > 0:
                time.sleep(remaining)
        self._fsync(fd)
