"""Reading device scalars on the host without stalling the training thread.

Each step's scalar tensors (loss, norms, ratios) are concatenated into one
vector. On a CUDA device it is copied to pinned host memory with a
non-blocking copy and a CUDA event; :meth:`DeferredReadout.ready` hands back
the vectors whose event has completed, usually one step later, so the loop
never waits for the GPU. On the CPU the values are ready at once. Only
:meth:`DeferredReadout.drain` (at close) waits. :class:`StepValues` gathers one step's
values for it, leaving out (and counting) any it cannot take; :func:`learning_rates`
reads an optimizer's learning rates into it.

>>> import torch
>>> readout = DeferredReadout(torch)
>>> readout.submit([torch.tensor(2.0), torch.tensor([3.0, 4.0])], tag="step-1")
>>> readout.ready()
[('step-1', [2.0, 3.0, 4.0])]
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from trainhealth._internal.store import MetricStore

__all__ = ["ON_DEVICE", "DeferredReadout", "StepValues", "learning_rates"]

#: A learning rate read with the step's device values (the group's ``lr`` is a tensor).
ON_DEVICE = object()


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


@dataclass
class StepValues:
    """One step's values: device tensors laid out for one read (``tensors``, ``fields``), host numbers (``values``).

    :meth:`add` leaves out a value it cannot take, counted under its ``source`` in
    ``trainhealth_exporter_errors_total``, so one bad signal never costs the step the others.

    >>> import torch
    >>> from trainhealth._internal import catalog
    >>> store = MetricStore()
    >>> values = StepValues(torch, store)
    >>> values.add("loss", torch.tensor(2.0)), values.add("grad_norm", torch.ones(3)), values.add("tokens", 8)
    (True, False, True)
    >>> values.fields, values.values, store.value(catalog.EXPORTER_ERRORS, ("monitor",))
    ([('loss', 1)], {'tokens': 8.0}, 1.0)
    """

    torch: Any
    store: MetricStore
    tensors: list[Any] = field(default_factory=list)
    fields: list[tuple[str, int]] = field(default_factory=list)
    values: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, value: Any, length: int = 1, *, source: str = "monitor") -> bool:
        """Add ``value`` (a tensor of ``length`` elements or a number) as ``name``; False when left out."""
        if value is None:
            return False
        try:
            if isinstance(value, self.torch.Tensor):
                if value.numel() != length:
                    raise ValueError(f"{name}: expected {length} value(s), got a tensor of shape {tuple(value.shape)}")
                self.tensors.append(value)
                self.fields.append((name, length))
            else:
                self.values[name] = float(value)
            return True
        except Exception as exc:
            self.store.record_error(source, exc)
            return False

    def merge(self, other: StepValues) -> None:
        """Take ``other``'s values too (read earlier in the same step, e.g. at the optimizer step)."""
        self.tensors.extend(other.tensors)
        self.fields.extend(other.fields)
        self.values.update(other.values)


def learning_rates(optimizer: Any, values: StepValues) -> list[float | object | None]:
    """The learning rate of each of ``optimizer``'s parameter groups (read at the optimizer step by the Monitor:
    the rate that step applied, before a per-step scheduler moves it).

    A number; :data:`ON_DEVICE` when it is a tensor (added to ``values`` as ``lr<group>``);
    ``None`` when it cannot be read (Hugging Face's Adafactor with ``relative_step=True``
    leaves it None), counted in ``trainhealth_exporter_errors_total{source="learning_rate"}``.

    >>> import torch
    >>> from trainhealth._internal import catalog
    >>> store = MetricStore()
    >>> optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    >>> optimizer.add_param_group({"params": [torch.nn.Parameter(torch.ones(1))]})
    >>> optimizer.param_groups[1]["lr"] = None
    >>> learning_rates(optimizer, StepValues(torch, store)), store.value(catalog.EXPORTER_ERRORS, ("learning_rate",))
    ([0.1, None], 1.0)
    """
    try:
        groups = list(optimizer.param_groups)
    except Exception as exc:  # an optimizer without torch's param_groups
        values.store.record_error("learning_rate", exc)
        return []
    rates: list[float | object | None] = []
    for position, group in enumerate(groups):
        try:
            lr = group.get("lr")
            if isinstance(lr, values.torch.Tensor):
                # a copy: a scheduler may move a tensor learning rate in place before the step is read
                copy = lr.detach().clone()
                rates.append(ON_DEVICE if values.add(f"lr{position}", copy, source="learning_rate") else None)
            elif lr is None or isinstance(lr, bool):
                values.store.record_error(
                    "learning_rate",
                    TypeError(f"param_groups[{position}]['lr'] is {lr!r}, not a number: its learning rate is left out"),
                )
                rates.append(None)
            else:
                rates.append(float(lr))
        except Exception as exc:
            values.store.record_error("learning_rate", exc)
            rates.append(None)
    return rates
