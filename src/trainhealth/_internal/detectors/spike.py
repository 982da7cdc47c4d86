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

from dataclasses import dataclass
from typing import Any

import numpy as np

from trainhealth._internal.detectors.base import Detector
from trainhealth._internal.detectors.rolling import RollingMoments

__all__ = ["SpikeScore"]


@dataclass(eq=False, repr=False)
class SpikeScore(Detector):
    """Loss spikes as OLMo 2 counts them: values ``sigmas`` standard deviations from the previous ``window``.

    The score is ``|x - mean| / std`` (ddof 1) of the previous ``window`` values, spikes
    included (default threshold 7, critical 14); :attr:`spike_score` is the fraction of
    judged values that scored ``sigmas`` or more.

    Parameters
    ----------
    window
        How many previous values the mean and standard deviation cover.
    sigmas
        The score from which a value counts as a spike in :attr:`spike_score`.
    min_periods
        How many values a series needs before its first verdict (``None``: ``window``, as OLMo's); at most
        ``window``.

    >>> detector = SpikeScore(window=10)
    >>> series = [1.0, 1.1, 0.9, 1.0, 1.2, 0.8, 1.0, 1.1, 0.9, 1.0, 5.0, 1.0]
    >>> [i for i, x in enumerate(series) if detector.update([x])[0] > detector.default_threshold]
    [10]
    >>> detector.spikes.tolist(), detector.evaluated.tolist()
    ([1], [2])
    """

    name = "spike"
    default_threshold = 7.0
    default_critical = 14.0

    window: int = 1000
    sigmas: float = 7.0
    min_periods: int | None = None

    def __post_init__(self) -> None:
        self.warmup = self.min_periods = self.min_periods or self.window
        super().__post_init__()
        if self.warmup > self.window:
            raise ValueError("min_periods must be <= window")

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
