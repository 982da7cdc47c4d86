"""What a part of the Monitor sees of each step: :class:`StepObserver`, the step path's one extension point.

Model signals, the cross-replica checks and loss-spike recovery watch the steps this way
(:mod:`trainhealth._internal.exporters.model_health`); the step path calls every observer at the same
points and takes nothing back from them but the tensors they ask it to read.

>>> class Counter(StepObserver):
...     def __init__(self):
...         self.finished_steps = []
...
...     def finished(self, index, stats, read):
...         self.finished_steps.append(stats.step)
>>> Counter().device_values(0)
[]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainhealth._internal.exporters.step_records import StepStats

__all__ = ["StepObserver"]


class StepObserver:
    """Watches the steps of one Monitor. Every method does nothing unless overridden; one that raises is
    counted in ``trainhealth_exporter_errors_total{source}`` (``source``) and the step goes on.

    On the training thread, in this order for step ``index`` (counted from 0):

    * :meth:`device_values`: tensors to read with the step, without a host synchronisation;
    * :meth:`lockstep`: the point every rank reaches together (after ``optimizer.step()`` when the
      Monitor hooks the optimizer, else in :meth:`~trainhealth.Monitor.step`); the only place an
      observer may issue a collective;
    * :meth:`recorded`: the step is queued; prepare for the next.

    On the export thread, :meth:`finished` once the step's values are read.
    """

    #: the ``source`` label under which this observer's errors are counted
    source = "monitor"

    def device_values(self, index: int) -> list[tuple[str, Any, int]]:
        """This step's tensors for the readout, as (name, tensor, length); their values come back in ``read``."""
        return []

    def lockstep(self, index: int, step: int) -> None:
        """Every rank is at this point of step ``index`` (the training loop's ``step``)."""

    def recorded(self, index: int) -> None:
        """Step ``index`` is queued."""

    def finished(self, index: int, stats: StepStats, read: Mapping[str, Any]) -> None:
        """Step ``index`` as exported (``stats``); ``read``: every value read for it, by name."""

    def close(self) -> None:
        """The Monitor closes."""
