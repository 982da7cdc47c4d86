"""Level shift and persistent degradation: a two-sided CUSUM on robustly standardised values.

Each value is standardised against the median and MAD of a reference window
(z = (x - median) / (1.4826 * MAD)) and clipped to +-``clip`` so that one
outlier, however large, cannot raise an alarm alone; the CUSUM statistics
``up = max(0, up + z - k)`` and ``down = max(0, down - z - k)`` add up evidence
of a sustained shift of more than ``k`` sigmas, so a step time 0.5 sigma slower
for good is caught within tens of steps while single outliers are not. The score
is the larger statistic (per ``direction``). The textbook h = 5 raised about one
false alarm per 370 points on Gaussian noise with an estimated baseline here, so
the default threshold is h = 8: one per ~3,000 points, while a lasting 1-sigma
shift is caught after 12-41 points (seeded simulation, see the tests).
Protected points stay out of the reference window; after ``adapt_after``
protected points in a row the new level is accepted as normal.

>>> import numpy as np
>>> detector = LevelShift(window=100, warmup=50)
>>> rng = np.random.default_rng(1)
>>> before = [float(detector.update([1.0 + 0.01 * e])[0]) for e in rng.normal(size=150)]
>>> after = [float(detector.update([1.02 + 0.01 * e])[0]) for e in rng.normal(size=40)]
>>> max(before[50:]) < 8 < max(after)
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trainhealth._internal.detectors.base import Detector, Direction
from trainhealth._internal.detectors.rolling import RollingQuantiles, default_refresh
from trainhealth._internal.detectors.rolling import fill_zero as _fill_zero

__all__ = ["LevelShift"]


@dataclass(eq=False, repr=False)
class LevelShift(Detector):
    """A lasting change of level: a two-sided CUSUM of values standardised by a median and MAD.

    The score is the accumulated evidence, in robust sigmas beyond ``k`` per value
    (default threshold h = 8, critical 30); one value adds at most ``clip - k``, so a
    lone spike does not alarm and a lasting shift does.

    Parameters
    ----------
    window
        How many learnt values the reference median and MAD cover.
    warmup
        How many values a series learns before its first verdict (NaN until then); at most ``window``.
    k
        Allowance in robust sigmas: shifts smaller than ``k`` add no evidence.
    clip
        Standardised values are clipped to +-``clip`` (> ``k``), so one value adds at most ``clip - k``.
    direction
        ``"both"``, or ``"up"`` / ``"down"`` to score shifts one way only.
    adapt_after
        After this many protected values in a row the new level becomes the reference (``None``: ``window``).
    min_relative
        Floor on the scale relative to the reference median: with ``min_relative=0.2`` and
        ``k=0.5`` a shift smaller than 10% of the level adds no evidence however quiet the
        series (a timing signal on a quiet machine has a robust sigma of 1-2%, and a shared
        host moves every rank's step time by 5-10% for minutes). 0 (the default) judges by
        the measured noise alone.
    min_scale
        Floor on the scale, so a constant reference does not divide by zero.
    refresh
        Re-sort the windows every ``refresh`` updates (``None``: 1, or 2 from 1,024 series on).

    >>> detector = LevelShift(window=10, warmup=10)
    >>> noise = [1.0, 1.1, 0.9, 1.0, 1.2, 0.8, 1.0, 1.1, 0.9, 1.0]
    >>> series = noise * 2 + [5.0] + noise + [2.0] * 4  # a spike at 20, a shift from 31
    >>> [i for i, x in enumerate(series) if detector.update([x])[0] > detector.default_threshold]
    [33, 34]
    """

    name = "level_shift"
    default_threshold = 8.0
    default_critical = 30.0

    window: int = 100
    warmup: int = 50
    k: float = 0.5
    clip: float = 4.0
    direction: Direction = "both"
    adapt_after: int | None = None
    min_relative: float = 0.0
    min_scale: float = 1e-12
    refresh: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.window < self.warmup or self.k < 0 or self.clip <= self.k or not 0 <= self.min_relative < 1e6:
            raise ValueError("need window >= warmup, k >= 0, clip > k and min_relative >= 0")
        if self.adapt_after is None:
            self.adapt_after = self.window
        self._adapt_after = self.adapt_after  # never None from here

    def _allocate(self, n_series: int) -> None:
        self._reference = RollingQuantiles(n_series, self.window, default_refresh(n_series, self.refresh))
        self._up = np.zeros(n_series)
        self._down = np.zeros(n_series)
        self._protected_run = np.zeros(n_series, dtype=np.int64)

    def _standardise(self, x: np.ndarray) -> np.ndarray:
        median = self._reference.quantile(0.5)[:, 0]
        scale = 1.4826 * self._reference.median_absolute_deviation(median)
        scale = np.maximum(
            _fill_zero(scale, self._reference.robust_sigma),
            np.maximum(self.min_relative * np.abs(median), self.min_scale),
        )
        with np.errstate(invalid="ignore"):
            return np.clip((x - median) / scale, -self.clip, self.clip)

    def _statistics(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        z = self._standardise(x)
        ready = (self._reference.count >= self.warmup) & np.isfinite(z)
        up = np.where(ready, np.maximum(0.0, self._up + z - self.k), self._up)
        down = np.where(ready, np.maximum(0.0, self._down - z - self.k), self._down)
        return up, down, ready

    def score(self, values: Any) -> np.ndarray:
        up, down, ready = self._statistics(self._vector(values))
        score = {"up": up, "down": down}.get(self.direction, np.maximum(up, down))
        return np.where(ready, score, np.nan)

    def learn(self, values: Any, mask: np.ndarray | None = None) -> None:
        x = self._vector(values)
        self._up, self._down, _ = self._statistics(x)
        learning = np.ones(len(x), dtype=bool) if mask is None else mask.copy()
        self._protected_run = np.where(learning, 0, self._protected_run + 1)
        adapting = self._protected_run > self._adapt_after
        learning |= adapting
        self._up = np.where(adapting, 0.0, self._up)  # the new level is the normal one now
        self._down = np.where(adapting, 0.0, self._down)
        self._reference.update(x, learning)

    def expected(self) -> np.ndarray:
        return self._reference.quantile(0.5)[:, 0]
