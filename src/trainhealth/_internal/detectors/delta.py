"""δ-irregularity (Holmes): an iteration that takes δ times longer than the window average.

Training goes on, but a step takes ``delta`` x the average of the recent normal
steps. The score is the ratio to that average (threshold ``delta``, 1.5 by
default); :attr:`DeltaIrregularity.irregularity_rate` is the share of
irregular steps among the last ``rate_window`` of each series.

>>> detector = DeltaIrregularity(window=20, warmup=5)
>>> for seconds in [1.0, 1.02, 0.98, 1.01, 0.99] * 4:
...     _ = detector.update([seconds])
>>> round(float(detector.score([1.6])[0]), 2), float(detector.irregularity_rate[0])
(1.6, 0.0)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainhealth._internal.detectors.base import Detector
from trainhealth._internal.detectors.rolling import RollingMoments

__all__ = ["DeltaIrregularity"]


@dataclass(eq=False, repr=False)
class DeltaIrregularity(Detector):
    """Slow iterations (Holmes's δ-irregularity): a step time ``delta`` times the recent average or more.

    The score is the ratio of a value to the mean of the last ``window`` learnt values
    (default threshold ``delta`` = 1.5, critical 3); :attr:`irregularity_rate` is the
    share of irregular values among the last ``rate_window`` updates of each series.

    Parameters
    ----------
    delta
        The ratio (> 1) from which a value is irregular, for :attr:`irregularity_rate`.
    window
        How many learnt values the average covers.
    warmup
        How many values a series learns before its first verdict (NaN until then); at most ``window``.
    rate_window
        How many recent updates :attr:`irregularity_rate` covers.

    >>> detector = DeltaIrregularity(window=20, warmup=5)
    >>> seconds = [1.0, 1.02, 0.98, 1.01, 0.99, 1.0, 1.6, 1.0]
    >>> [i for i, x in enumerate(seconds) if detector.update([x])[0] > detector.default_threshold]
    [6]
    """

    name = "delta"
    default_threshold = 1.5
    default_critical = 3.0

    delta: float = 1.5
    window: int = 50
    warmup: int = 10
    rate_window: int = 100

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.delta <= 1.0:
            raise ValueError("delta must be > 1")
        if self.window < self.warmup or self.rate_window < 1:
            raise ValueError("window must be >= warmup and rate_window >= 1")

    def _allocate(self, n_series: int) -> None:
        self._moments = RollingMoments(n_series, self.window)
        self._recent: deque[np.ndarray] = deque(maxlen=self.rate_window)

    def score(self, values: Any) -> np.ndarray:
        x = self._vector(values)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = x / self._moments.mean
        return np.where((self._moments.count >= self.warmup) & (self._moments.mean > 0), ratio, np.nan)

    def learn(self, values: Any, mask: np.ndarray | None = None) -> None:
        x = self._vector(values)
        with np.errstate(invalid="ignore"):
            self._recent.append(self.score(x) >= self.delta)
        self._moments.update(x, mask)

    @property
    def irregularity_rate(self) -> np.ndarray:
        """Share of irregular steps among the last ``rate_window`` updates, per series."""
        if not self._recent:
            return np.zeros(self.n_series or 0)
        return np.mean(np.vstack(self._recent), axis=0)

    def expected(self) -> np.ndarray:
        return np.where(self._moments.count > 0, self._moments.mean, np.nan)
