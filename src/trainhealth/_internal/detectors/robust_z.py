"""Robust z-score: distance from the window median in MAD units (1.4826 * MAD ~ one sigma).

Where the MAD is 0 (more than half the window holds one value: counts, idle
periods) a wider quantile range stands in for it, so a change is not
infinitely surprising.

>>> import numpy as np
>>> detector = RobustZ(window=40, warmup=10)
>>> for x in [1.0, 1.2, 0.9, 1.1, 1.0] * 8:
...     _ = detector.update([x])
>>> float(np.round(detector.score([3.0])[0], 2))  # median 1.0, MAD 0.1
13.49
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trainhealth._internal.detectors.base import Detector, Direction, directional
from trainhealth._internal.detectors.rolling import RollingQuantiles, default_refresh
from trainhealth._internal.detectors.rolling import fill_zero as _fill_zero

__all__ = ["RobustZ"]


@dataclass(eq=False, repr=False)
class RobustZ(Detector):
    """Values far from the recent median: ``|x - median| / (1.4826 * MAD)`` over the last ``window`` learnt values.

    The score is in robust standard deviations (1.4826 * MAD is one sigma for Gaussian
    noise; default threshold 5, critical 10), and outliers in the window barely move it.

    Parameters
    ----------
    window
        How many learnt values the median and MAD cover.
    warmup
        How many values a series learns before its first verdict (NaN until then); at most ``window``.
    direction
        ``"both"``, or ``"up"`` / ``"down"`` to score deviations one way only (the other way scores 0).
    min_scale
        Floor on the scale, so a constant baseline does not divide by zero.
    refresh
        Re-sort the windows every ``refresh`` updates (``None``: 1, or 2 from 1,024 series on).

    >>> detector = RobustZ(window=20, warmup=5)
    >>> series = [1.0, 1.1, 0.9, 1.0, 1.2, 0.8, 1.0, 1.1, 5.0, 1.0]
    >>> [i for i, x in enumerate(series) if detector.update([x])[0] > detector.default_threshold]
    [8]
    """

    name = "robust_z"
    default_threshold = 5.0
    default_critical = 10.0

    window: int = 100
    warmup: int = 20
    direction: Direction = "both"
    min_scale: float = 1e-12
    refresh: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.window < self.warmup:
            raise ValueError("window must be >= warmup")

    def _allocate(self, n_series: int) -> None:
        self._window = RollingQuantiles(n_series, self.window, default_refresh(n_series, self.refresh))

    def score(self, values: Any) -> np.ndarray:
        x = self._vector(values)
        median = self._window.quantile(0.5)[:, 0]
        scale = 1.4826 * self._window.median_absolute_deviation(median)
        scale = np.maximum(_fill_zero(scale, self._window.robust_sigma), self.min_scale)
        with np.errstate(invalid="ignore"):
            z = (x - median) / scale
        z = np.where(self._window.count >= self.warmup, z, np.nan)
        return directional(z, self.direction)

    def learn(self, values: Any, mask: np.ndarray | None = None) -> None:
        x = self._vector(values)  # allocates the state on a first call
        self._window.update(x, mask)

    def expected(self) -> np.ndarray:
        return self._window.quantile(0.5)[:, 0]
