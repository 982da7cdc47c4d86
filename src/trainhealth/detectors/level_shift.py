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

from typing import Any

import numpy as np

from trainhealth.detectors.base import Detector, Direction
from trainhealth.detectors.rolling import RollingQuantiles, default_refresh, fill_zero as _fill_zero

__all__ = ["LevelShift"]


class LevelShift(Detector):
    name = "level_shift"
    default_threshold = 8.0
    default_critical = 30.0

    def __init__(self, window: int = 100, warmup: int = 50, k: float = 0.5, clip: float = 4.0,
                 direction: Direction = "both", adapt_after: int | None = None, min_scale: float = 1e-12, refresh: int | None = None) -> None:
        super().__init__(warmup)
        self.refresh = refresh
        if window < warmup or k < 0 or clip <= k:
            raise ValueError("need window >= warmup, k >= 0 and clip > k")
        self.window, self.k, self.clip, self.direction, self.min_scale = window, k, clip, direction, min_scale
        self.adapt_after = adapt_after if adapt_after is not None else window

    def params(self) -> dict[str, Any]:
        return {"window": self.window, "warmup": self.warmup, "k": self.k, "clip": self.clip, "direction": self.direction,
                "adapt_after": self.adapt_after, "min_scale": self.min_scale, "refresh": self.refresh}

    def _allocate(self, n_series: int) -> None:
        self._reference = RollingQuantiles(n_series, self.window, default_refresh(n_series, self.refresh))
        self._up = np.zeros(n_series)
        self._down = np.zeros(n_series)
        self._protected_run = np.zeros(n_series, dtype=np.int64)

    def _standardise(self, x: np.ndarray) -> np.ndarray:
        median = self._reference.quantile(0.5)[:, 0]
        scale = 1.4826 * self._reference.median_absolute_deviation(median)
        scale = np.maximum(_fill_zero(scale, self._reference.robust_sigma), self.min_scale)
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
        adapting = self._protected_run > self.adapt_after
        learning |= adapting
        self._up = np.where(adapting, 0.0, self._up)  # the new level is the normal one now
        self._down = np.where(adapting, 0.0, self._down)
        self._reference.update(x, learning)

    def expected(self) -> np.ndarray:
        return self._reference.quantile(0.5)[:, 0]
