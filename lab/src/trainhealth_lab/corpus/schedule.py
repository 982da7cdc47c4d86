"""Learning-rate schedules of the corpus runs: linear warm-up, then cosine decay with one warm restart,
or a constant rate with two step decays. Both change the rate abruptly somewhere (the restart, the decays),
so every run holds healthy schedule changes.

>>> schedule = draw_schedule("step", steps=1000, peak=1e-3, seed="mlp-0")
>>> schedule.warmup, schedule.lr(0) < schedule.lr(schedule.warmup) == 1e-3
(80, True)
>>> [round(schedule.lr(change) / schedule.lr(change - 1), 2) for change in schedule.changes]
[0.3, 0.3]
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["SCHEDULES", "Schedule", "draw_schedule"]

SCHEDULES = ("cosine_restart", "step")
STEP_DECAY = 0.3
RESTART_LEVEL = 0.6  # of the peak
COSINE_FLOOR = 0.1  # of the level the cosine starts from


@dataclass(frozen=True)
class Schedule:
    """``kind`` over ``steps`` steps: ``warmup`` steps up to ``peak``; ``changes`` are the abrupt steps."""

    kind: str
    steps: int
    peak: float
    warmup: int
    changes: tuple[int, ...]

    def lr(self, step: int) -> float:
        if step < self.warmup:
            return self.peak * (step + 1) / self.warmup
        if self.kind == "step":
            return self.peak * STEP_DECAY ** sum(step >= change for change in self.changes)
        (restart,) = self.changes
        start, end, level = (self.warmup, restart, 1.0) if step < restart else (restart, self.steps, RESTART_LEVEL)
        progress = (step - start) / max(1, end - start)
        return self.peak * level * (COSINE_FLOOR + (1 - COSINE_FLOOR) * 0.5 * (1 + math.cos(math.pi * progress)))


def draw_schedule(kind: str, *, steps: int, peak: float, seed: str) -> Schedule:
    """A schedule of ``kind`` whose change steps are drawn from ``seed``: the restart within 30-80% of the run,
    the step decays within 25-50% and 60-85%."""
    if kind not in SCHEDULES:
        raise ValueError(f"unknown schedule {kind!r}: one of {', '.join(SCHEDULES)}")
    draw = random.Random(f"schedule-{seed}")
    warmup = max(10, round(0.08 * steps))
    changes: tuple[int, ...]
    if kind == "step":
        changes = (
            draw.randint(round(0.25 * steps), round(0.5 * steps)),
            draw.randint(round(0.6 * steps), round(0.85 * steps)),
        )
    else:
        changes = (draw.randint(round(0.3 * steps), round(0.8 * steps)),)
    return Schedule(kind, steps, peak, warmup, changes)
