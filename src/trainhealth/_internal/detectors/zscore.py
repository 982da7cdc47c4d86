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

from dataclasses import dataclass
from typing import Any

import numpy as np

from trainhealth._internal.detectors.base import Detector, Direction, directional
from trainhealth._internal.detectors.rolling import RollingMoments

__all__ = ["ZScore"]


@dataclass(eq=False, repr=False)
class ZScore(Detector):
    """Values far from the recent mean: ``|x - mean| / std`` of the last ``window`` learnt values.

    The score is in standard deviations (default threshold 4, critical 8).

    Parameters
    ----------
    window
        How many learnt values the mean and standard deviation cover.
    warmup
        How many values a series learns before its first verdict (NaN until then); at most ``window``.
    direction
        ``"both"``, or ``"up"`` / ``"down"`` to score deviations one way only (the other way scores 0).
    min_std
        Floor on the standard deviation, so a constant baseline does not divide by zero.

    >>> detector = ZScore(window=20, warmup=5)
    >>> series = [1.0, 1.1, 0.9, 1.0, 1.2, 0.8, 1.0, 1.1, 5.0, 1.0]
    >>> [i for i, x in enumerate(series) if detector.update([x])[0] > detector.default_threshold]
    [8]
    """

    name = "zscore"
    default_threshold = 4.0
    default_critical = 8.0

    window: int = 100
    warmup: int = 20
    direction: Direction = "both"
    min_std: float = 1e-12

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.window < self.warmup:
            raise ValueError("window must be >= warmup")

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
