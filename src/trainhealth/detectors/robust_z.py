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

from typing import Any

import numpy as np

from trainhealth.detectors.base import Detector, Direction, directional
from trainhealth.detectors.rolling import RollingQuantiles, default_refresh, fill_zero as _fill_zero

__all__ = ["RobustZ"]


class RobustZ(Detector):
    name = "robust_z"
    default_threshold = 5.0
    default_critical = 10.0

    def __init__(self, window: int = 100, warmup: int = 20, direction: Direction = "both",
                 min_scale: float = 1e-12, refresh: int | None = None) -> None:
        super().__init__(warmup)
        self.refresh = refresh
        if window < warmup:
            raise ValueError("window must be >= warmup")
        self.window, self.direction, self.min_scale = window, direction, min_scale

    def params(self) -> dict[str, Any]:
        return {"window": self.window, "warmup": self.warmup, "direction": self.direction, "min_scale": self.min_scale, "refresh": self.refresh}

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
