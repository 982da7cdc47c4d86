"""Spike score exactly as OLMo 2 defines it.

A value is a spike when it is at least ``sigmas`` (7) standard deviations from
the rolling mean of the previous ``window`` (1,000) values; the spike score is
the fraction of spikes among the values that had a full window before them
(OLMo 2, arXiv 2501.00656). The rolling mean and standard deviation (ddof 1, as
pandas computes them) take every value, spikes included, so protection does
not apply: ``learn`` ignores ``mask``.

>>> import numpy as np
>>> values = np.r_[np.random.default_rng(0).normal(1.0, 0.01, 30), 2.0, 1.0]
>>> detector = SpikeScore(window=20)
>>> scores = [float(detector.update([v])[0]) for v in values]
>>> detector.spikes.tolist(), detector.evaluated.tolist(), round(float(detector.spike_score[0]), 3)
([1], [12], 0.083)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainhealth.detectors.base import Detector
from trainhealth.detectors.rolling import RollingMoments

__all__ = ["SpikeScore"]


class SpikeScore(Detector):
    name = "spike"
    default_threshold = 7.0
    default_critical = 14.0

    def __init__(self, window: int = 1000, sigmas: float = 7.0, min_periods: int | None = None) -> None:
        super().__init__(min_periods or window)
        if self.warmup > window:
            raise ValueError("min_periods must be <= window")
        self.window, self.sigmas = window, sigmas

    def params(self) -> dict[str, Any]:
        return {"window": self.window, "sigmas": self.sigmas, "min_periods": self.warmup}

    def _allocate(self, n_series: int) -> None:
        self._moments = RollingMoments(n_series, self.window)
        self.spikes = np.zeros(n_series, dtype=np.int64)
        self.evaluated = np.zeros(n_series, dtype=np.int64)

    def score(self, values: Any) -> np.ndarray:
        x = self._vector(values)
        with np.errstate(invalid="ignore", divide="ignore"):
            z = np.abs(x - self._moments.mean) / self._moments.std(ddof=1)
        return np.where(self._moments.count >= self.warmup, z, np.nan)

    def learn(self, values: Any, mask: np.ndarray | None = None) -> None:
        x = self._vector(values)
        z = self.score(x)
        judged = ~np.isnan(z) & np.isfinite(x)
        self.evaluated += judged
        self.spikes += judged & (z >= self.sigmas)
        self._moments.update(x)  # every value, as OLMo's rolling average does

    @property
    def spike_score(self) -> np.ndarray:
        """Fraction of the judged values that were spikes, per series (0 before any was judged)."""
        return np.where(self.evaluated > 0, self.spikes / np.maximum(self.evaluated, 1), 0.0)

    def expected(self) -> np.ndarray:
        return np.where(self._moments.count > 0, self._moments.mean, np.nan)
