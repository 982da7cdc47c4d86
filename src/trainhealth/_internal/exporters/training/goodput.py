"""Checkpoints and goodput: how much of the wall time moved training forward.

Goodput is productive time over elapsed time since the process started
(the Monitor's creation). Time is lost to:

* ``startup`` — from the start to the first step (loading, compiling, restoring);
* ``stall`` — the part of a step beyond ``stall_factor`` times the recent median
  step time (a hang, a slow collective, a pause);
* ``redone`` — steps whose number is at or below one already done (rolled back
  to a checkpoint and run again).

Checkpoints are reported with :meth:`Goodput.checkpoint_saved`; their history
lets advice name the last checkpoint before an event (say, a loss spike that
does not recover).

>>> g = Goodput(start=0.0)
>>> for step, now in enumerate([10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 27.0, 28.0]):
...     g.step(step, now)
>>> g.step(7, 29.0)  # step 7 again, after a rollback
>>> round(g.ratio(now=29.0), 2), g.lost
(0.34, {'startup': 10.0, 'stall': 8.0, 'redone': 1.0})
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

__all__ = ["Checkpoint", "Goodput"]


@dataclass(frozen=True)
class Checkpoint:
    step: int
    time: float
    duration_s: float | None


class Goodput:
    """Goodput bookkeeping of one process; all times are Unix seconds."""

    def __init__(self, start: float, stall_factor: float = 3.0, window: int = 50, max_checkpoints: int = 64) -> None:
        self.start = start
        self.stall_factor = stall_factor
        self.lost = {"startup": 0.0, "stall": 0.0, "redone": 0.0}
        self.checkpoints: deque[Checkpoint] = deque(maxlen=max_checkpoints)
        self._recent: deque[float] = deque(maxlen=window)
        self._last_time: float | None = None
        self._highest: int | None = None

    def step(self, step: int, now: float) -> None:
        """A step ``step`` finished at ``now``."""
        if self._last_time is None:
            self.lost["startup"] = max(0.0, now - self.start)
        else:
            duration = max(0.0, now - self._last_time)
            if self._highest is not None and step <= self._highest:
                self.lost["redone"] += duration
            elif len(self._recent) >= 5:
                typical = statistics.median(self._recent)
                self.lost["stall"] += max(0.0, duration - self.stall_factor * typical)
            self._recent.append(duration)
        self._last_time = now
        self._highest = step if self._highest is None else max(self._highest, step)

    def ratio(self, now: float) -> float:
        """Productive over elapsed time, in [0, 1]."""
        elapsed = now - self.start
        if elapsed <= 0:
            return 1.0
        return max(0.0, min(1.0, 1.0 - sum(self.lost.values()) / elapsed))

    def checkpoint_saved(self, step: int, now: float, duration_s: float | None = None) -> Checkpoint:
        checkpoint = Checkpoint(step, now, duration_s)
        self.checkpoints.append(checkpoint)
        return checkpoint

    def last_checkpoint_before(self, step: int) -> Checkpoint | None:
        """The latest checkpoint saved at a step before ``step``."""
        earlier = [c for c in self.checkpoints if c.step < step]
        return max(earlier, key=lambda c: c.step) if earlier else None
