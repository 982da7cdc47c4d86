"""The decision step: from scores to events, so one anomaly is one event and not a burst.

Per series, an event opens when the score reaches ``threshold`` for
``min_consecutive`` points in a row; it stays open while the score is at least
``release`` (hysteresis: release <= threshold) and closes after ``cooldown``
further points below it. ``flagged`` marks the points to keep out of the
baseline (with ``protect``): those at or above the threshold, and those of an
open event — but no more than ``max_protected`` in a row (a change that lasts
longer is the new normal, and the baseline follows it), and none while more than
``max_protected_share`` of a series' recent points were flagged (sparse, spiky
data: kept out, its spikes would leave a baseline of zero spread).

>>> import numpy as np
>>> decide = Decision(threshold=3.0, release=2.0, cooldown=1)
>>> [decide.step(np.array([s])).opened.tolist() for s in (1.0, 3.5, 2.5, 4.0, 0.5, 0.2, 3.1)]
[[], [0], [], [], [], [], [0]]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Decision", "DecisionStep"]


@dataclass(frozen=True)
class DecisionStep:
    """What one update decided: series whose event opened or closed, and points to protect."""

    opened: np.ndarray  # series indices
    closed: np.ndarray  # series indices
    flagged: np.ndarray  # bool per series
    active: np.ndarray  # bool per series: an event is open after this update


class Decision:
    """Thresholds scores into events, per series, with hysteresis, cooldown and protection."""

    def __init__(
        self,
        threshold: float,
        *,
        release: float | None = None,
        cooldown: int = 0,
        min_consecutive: int = 1,
        protect: bool = True,
        max_protected: int = 32,
        max_protected_share: float = 0.05,
    ) -> None:
        release = threshold if release is None else release
        if release > threshold:
            raise ValueError("release must not exceed threshold")
        if cooldown < 0 or min_consecutive < 1 or max_protected < 1:
            raise ValueError("cooldown must be >= 0, min_consecutive and max_protected >= 1")
        self.threshold = threshold
        self.release = release
        self.cooldown = cooldown
        self.min_consecutive = min_consecutive
        self.protect = protect
        self.max_protected = max_protected
        self.max_protected_share = max_protected_share
        self._protected_run = np.zeros(0, dtype=np.int64)
        self._flagged_share = np.zeros(0)  # exponentially weighted, over about 64 points
        self._above = np.zeros(0, dtype=np.int64)
        self._quiet = np.zeros(0, dtype=np.int64)
        self._active: np.ndarray | None = None

    def step(self, scores: np.ndarray) -> DecisionStep:
        if self._active is None:
            n = len(scores)
            self._above = np.zeros(n, dtype=np.int64)
            self._quiet = np.zeros(n, dtype=np.int64)
            self._active = np.zeros(n, dtype=bool)
            self._protected_run = np.zeros(n, dtype=np.int64)
            self._flagged_share = np.zeros(n)
        with np.errstate(invalid="ignore"):
            hit = scores >= self.threshold  # NaN (no verdict) is never a hit
            held = scores >= self.release
        self._above = np.where(hit, self._above + 1, 0)
        was_active = self._active
        opening = ~was_active & (self._above >= self.min_consecutive)
        self._quiet = np.where(was_active & ~held, self._quiet + 1, 0)
        closing = was_active & (self._quiet > self.cooldown)
        self._active = (was_active & ~closing) | opening
        flagged = (hit | (was_active & held)) if self.protect else np.zeros(len(scores), dtype=bool)
        self._protected_run = np.where(flagged, self._protected_run + 1, 0)
        self._flagged_share += (flagged - self._flagged_share) / 64.0
        flagged = (
            flagged & (self._protected_run <= self.max_protected) & (self._flagged_share <= self.max_protected_share)
        )
        return DecisionStep(np.flatnonzero(opening), np.flatnonzero(closing), flagged, self._active.copy())

    @property
    def active(self) -> np.ndarray:
        return np.zeros(0, dtype=bool) if self._active is None else self._active.copy()
