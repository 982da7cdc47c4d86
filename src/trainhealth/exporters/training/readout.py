"""Reading device scalars on the host without stalling the training thread.

Each step's scalar tensors (loss, norms, ratios) are concatenated into one
vector. On a CUDA device it is copied to pinned host memory with a
non-blocking copy and a CUDA event; :meth:`DeferredReadout.ready` hands back
the vectors whose event has completed, usually one step later, so the loop
never waits for the GPU. On the CPU the values are ready at once. Only
:meth:`DeferredReadout.drain` (at close) waits.

>>> import torch
>>> readout = DeferredReadout(torch)
>>> readout.submit([torch.tensor(2.0), torch.tensor([3.0, 4.0])], tag="step-1")
>>> readout.ready()
[('step-1', [2.0, 3.0, 4.0])]
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["DeferredReadout"]


class DeferredReadout:
    """A bounded queue of device-to-host copies, oldest first."""

    def __init__(self, torch: ModuleType, max_pending: int = 64) -> None:
        self._torch = torch
        self._pending: deque[tuple[Any, Any, Any]] = deque()  # (tag, host tensor, event or None)
        self._max_pending = max_pending

    def submit(self, tensors: Sequence[Any], tag: Any) -> None:
        """Queue ``tensors`` (any shapes, one device or several) for reading under ``tag``."""
        torch = self._torch
        if not tensors:
            self._pending.append((tag, None, None))
            return
        device = tensors[0].device
        flat = torch.cat([t.detach().reshape(-1).to(device=device, dtype=torch.float32) for t in tensors])
        if device.type == "cuda":
            host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            host.copy_(flat, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._pending.append((tag, host, event))
        else:
            self._pending.append((tag, flat.to("cpu"), None))
        if len(self._pending) > self._max_pending:  # the device is far behind: wait for the oldest
            _, _, event = self._pending[0]
            if event is not None:
                event.synchronize()

    def ready(self) -> list[tuple[Any, list[float]]]:
        """Every queued entry whose copy has completed, in submission order; never blocks."""
        out = []
        while self._pending:
            tag, host, event = self._pending[0]
            if event is not None and not event.query():
                break
            self._pending.popleft()
            out.append((tag, [] if host is None else host.tolist()))
        return out

    def drain(self) -> list[tuple[Any, list[float]]]:
        """Wait for every queued copy and return them all."""
        for _, _, event in self._pending:
            if event is not None:
                event.synchronize()
        return self.ready()

    def __len__(self) -> int:
        return len(self._pending)
