"""Rolling z-score: distance from the window mean in window standard deviations.

The mean and variance come from Welford's update over the last ``window``
learnt values, so the point being scored is never part of its own baseline.

>>> import numpy as np
>>> detector = ZScore(window=50, warmup=10)
>>> rng = np.random.default_rng(0)
>>> for x in rng.normal(0.0, 1.0, size=(50, 3)):
...     _ = detector.update(x)
>>> scores = detector.score([0.1, 9.0, -0.2])
>>> bool(scores[1] > 5 > scores[0])
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainhealth.detectors.base import Detector, Direction, directional
from trainhealth.detectors.rolling import RollingMoments

__all__ = ["ZScore"]


class ZScore(Detector):
    name = "zscore"
    default_threshold = 4.0
    default_critical = 8.0

    def __init__(self, window: int = 100, warmup: int = 20, direction: Direction = "both",
                 min_std: float = 1e-12) -> None:
        super().__init__(warmup)
        if window < warmup:
            raise ValueError("window must be >= warmup")
        self.window, self.direction, self.min_std = window, direction, min_std

    def params(self) -> dict[str, Any]:
        return {"window": self.window, "warmup": self.warmup, "direction": self.direction, "min_std": self.min_std}

    def _allocate(self, n_series: int) -> None:
        self._moments = RollingMoments(n_series, self.window)

    def score(self, values: Any) -> np.ndarray:
        x = self._vector(values)
        std = np.maximum(self._moments.std(), self.min_std)
        with np.errstate(invalid="ignore"):
            z = (x - self._moments.mean) / std
        z = np.where(self._moments.count >= self.warmup, z, np.nan)
        return directional(z, self.direction)

    def learn(self, values: Any, mask: np.ndarray | None = None) -> None:
        x = self._vector(values)  # allocates the state on a first call
        self._moments.update(x, mask)

    def expected(self) -> np.ndarray:
        return np.where(self._moments.count > 0, self._moments.mean, np.nan)
