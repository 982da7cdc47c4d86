"""Tukey fences on rolling quartiles: how far beyond Q1 - c*IQR or Q3 + c*IQR a value lies.

The score is the distance outside the interquartile box in IQR units, so the
default threshold ``c = 3.0`` (ADTK's and Kats's default) is Tukey's far-out fence.
Where the quartiles coincide (counts, idle periods), a wider quantile range
scaled to an IQR stands in for it.

>>> import numpy as np
>>> detector = IQR(window=20, warmup=8)
>>> for x in range(20):
...     _ = detector.update([float(x % 5)])  # quartiles 1 and 3
>>> detector.score([2.0]).tolist(), detector.score([13.0]).tolist()
([0.0], [5.0])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trainhealth._internal.detectors.base import Detector, Direction, directional
from trainhealth._internal.detectors.rolling import RollingQuantiles, default_refresh
from trainhealth._internal.detectors.rolling import fill_zero as _fill_zero

__all__ = ["IQR"]


@dataclass(eq=False, repr=False)
class IQR(Detector):
    """Values outside Tukey's fences: how far beyond the quartiles of the last ``window`` learnt values.

    The score is the distance below Q1 or above Q3 in interquartile ranges, 0 inside
    the box (default threshold 3, Tukey's far-out fence; critical 6).

    Parameters
    ----------
    window
        How many learnt values the quartiles cover.
    warmup
        How many values a series learns before its first verdict (NaN until then); at most ``window``.
    direction
        ``"both"``, or ``"up"`` / ``"down"`` to score values beyond one fence only (the other scores 0).
    min_iqr
        Floor on the interquartile range, so a constant baseline does not divide by zero.
    refresh
        Re-sort the windows every ``refresh`` updates (``None``: 1, or 2 from 1,024 series on).

    >>> detector = IQR(window=20, warmup=5)
    >>> series = [1.0, 1.1, 0.9, 1.0, 1.2, 0.8, 1.0, 1.1, 5.0, 1.0]
    >>> [i for i, x in enumerate(series) if detector.update([x])[0] > detector.default_threshold]
    [8]
    """

    name = "iqr"
    default_threshold = 3.0
    default_critical = 6.0

    window: int = 100
    warmup: int = 20
    direction: Direction = "both"
    min_iqr: float = 1e-12
    refresh: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.window < self.warmup:
            raise ValueError("window must be >= warmup")

    def _allocate(self, n_series: int) -> None:
        self._window = RollingQuantiles(n_series, self.window, default_refresh(n_series, self.refresh))

    def score(self, values: Any) -> np.ndarray:
        x = self._vector(values)
        quartiles = self._window.quantile(np.array([0.25, 0.75]))
        q1, q3 = quartiles[:, 0], quartiles[:, 1]
        spread = q3 - q1
        spread = np.maximum(_fill_zero(spread, lambda: 1.349 * self._window.robust_sigma()), self.min_iqr)
        with np.errstate(invalid="ignore"):
            signed = np.where(x > q3, (x - q3) / spread, np.where(x < q1, (x - q1) / spread, 0.0))
        signed = np.where(self._window.count >= self.warmup, signed, np.nan)
        return directional(signed, self.direction)

    def learn(self, values: Any, mask: np.ndarray | None = None) -> None:
        x = self._vector(values)  # allocates the state on a first call
        self._window.update(x, mask)

    def expected(self) -> np.ndarray:
        return self._window.quantile(0.5)[:, 0]
