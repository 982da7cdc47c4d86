"""Rolling per-series state shared by the detectors, vectorised over series with numpy.

:class:`RollingMoments` keeps the mean and variance of each series' last
``window`` learnt values (Welford's update, with removal of the value leaving
the window); :class:`RollingQuantiles` keeps the windows and sorts them when
quantiles are asked for. Both take one value per series per update and a mask of
the series that learn it (the others — protected anomalies, non-finite
values — keep their state).

>>> import numpy as np
>>> moments = RollingMoments(n_series=2, window=3)
>>> for x in ([1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0]):
...     moments.update(np.array(x))
>>> moments.mean.tolist(), moments.variance(ddof=1).tolist()
([3.0, 30.0], [1.0, 100.0])
>>> q = RollingQuantiles(n_series=1, window=5)
>>> for x in (5.0, 1.0, 4.0, 2.0, 3.0, 10.0):
...     q.update(np.array([x]))
>>> q.quantile(0.5).tolist(), q.quantile(0.25).tolist()  # window 1, 4, 2, 3, 10
([[3.0]], [[2.0]])
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["LARGE", "VERY_LARGE", "RollingMoments", "RollingQuantiles", "default_refresh", "fill_zero"]


#: From this many series on, the quantile detectors re-sort their windows every other update ...
LARGE = 1024
#: ... and from this many on, every fourth: the sort is most of a quantile detector's time at that size
#: (benchmarks/detector_throughput.py), and a quartile that lags by up to 3 of its window's 100 values judges
#: a step no differently.
VERY_LARGE = 8192


def default_refresh(n_series: int, refresh: int | None) -> int:
    """The ``refresh`` of a quantile detector: as given, else exact below :data:`LARGE` series, 2 from there and
    4 from :data:`VERY_LARGE`.

    >>> default_refresh(100, None), default_refresh(1024, None), default_refresh(16384, None), default_refresh(16384, 1)
    (1, 2, 4, 1)
    """
    if refresh is not None:
        return refresh
    return 1 if n_series < LARGE else 2 if n_series < VERY_LARGE else 4


def fill_zero(values: np.ndarray, fallback: Callable[[], np.ndarray]) -> np.ndarray:
    """``values`` with zeros (and NaN) replaced from ``fallback()``, computed only when one occurs."""
    bad = ~(values > 0)
    if not bad.any():
        return values
    return np.where(bad, fallback(), values)


def _learners(values: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    learn = np.isfinite(values)
    if mask is not None:
        learn &= mask
    return np.flatnonzero(learn)


class RollingMoments:
    """Mean and variance of each series' last ``window`` values."""

    def __init__(self, n_series: int, window: int) -> None:
        if window < 2:
            raise ValueError("window must be >= 2")
        self.window = window
        self._buffer = np.zeros((n_series, window))
        self._position = np.zeros(n_series, dtype=np.int64)
        self.count = np.zeros(n_series, dtype=np.int64)
        self.mean = np.zeros(n_series)
        self._m2 = np.zeros(n_series)
        self._updates = 0

    def variance(self, ddof: int = 1) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.count > ddof, np.maximum(self._m2, 0.0) / (self.count - ddof), np.nan)

    def std(self, ddof: int = 1) -> np.ndarray:
        return np.sqrt(self.variance(ddof))

    def update(self, values: np.ndarray, mask: np.ndarray | None = None) -> None:
        """Learn ``values`` for the series in ``mask`` (default all) with finite values."""
        rows = _learners(values, mask)
        if not len(rows):
            return
        x = values[rows]
        count, mean, m2 = self.count[rows], self.mean[rows], self._m2[rows]
        full = count == self.window
        if full.any():  # remove the value leaving the window
            old = self._buffer[rows, self._position[rows]]
            remaining = np.where(full, count - 1, count)
            delta = np.where(full, old - mean, 0.0)
            new_mean = np.where(full, mean - delta / np.maximum(remaining, 1), mean)
            m2 = np.where(full, m2 - delta * (old - new_mean), m2)
            mean, count = new_mean, remaining
        count = count + 1
        delta = x - mean
        mean = mean + delta / count
        m2 = m2 + delta * (x - mean)
        self._buffer[rows, self._position[rows]] = x
        self._position[rows] = (self._position[rows] + 1) % self.window
        self.count[rows], self.mean[rows], self._m2[rows] = count, mean, m2
        self._updates += 1
        if self._updates % self.window == 0:
            self._recompute()

    def _recompute(self) -> None:
        """Recompute from the buffer, so rounding never accumulates across windows."""
        valid = np.arange(self.window)[None, :] < self.count[:, None]
        counts = np.maximum(self.count, 1)
        mean = np.where(valid, self._buffer, 0.0).sum(axis=1) / counts
        self.mean = np.where(self.count > 0, mean, 0.0)
        self._m2 = np.where(valid, (self._buffer - self.mean[:, None]) ** 2, 0.0).sum(axis=1)

    def values(self) -> np.ndarray:
        """The windows, oldest first, with NaN in unfilled slots (n_series x window)."""
        order = (self._position[:, None] + np.arange(self.window)[None, :]) % self.window
        ordered = np.take_along_axis(self._buffer, order, axis=1)
        filled = np.arange(self.window)[None, :] >= (self.window - self.count)[:, None]
        return np.where(filled, ordered, np.nan)


class RollingQuantiles:
    """Each series' last ``window`` values, sorted on demand, for rolling quantiles.

    Sorting every row of a window is one vectorised ``np.sort`` (numpy's SIMD
    sort), cheaper than maintaining sorted rows element by element. With
    ``refresh`` > 1 the sorted copy is renewed only every ``refresh`` updates, so
    quantiles may lag the window by up to ``refresh - 1`` values (the large-
    cluster setting of the detectors); ``refresh=1`` is exact.
    """

    def __init__(self, n_series: int, window: int, refresh: int = 1) -> None:
        if window < 2 or refresh < 1:
            raise ValueError("window must be >= 2 and refresh >= 1")
        self.window = window
        self.refresh = refresh
        self._buffer = np.full((n_series, window), np.inf)  # +inf marks an unfilled slot
        self._position = np.zeros(n_series, dtype=np.int64)
        self.count = np.zeros(n_series, dtype=np.int64)
        self._columns = np.arange(window)[None, :]
        self._sorted: np.ndarray | None = None
        self._aligned = True  # every series' next slot is the same (no series skipped an update)
        self._stale = 0
        self._sorted_count = self.count.copy()

    def update(self, values: np.ndarray, mask: np.ndarray | None = None) -> None:
        rows = _learners(values, mask)
        if not len(rows):
            return
        if len(rows) == len(self.count) and self._aligned:  # every series at the same slot: write one column
            slot = int(self._position[0])
            self._buffer[:, slot] = values
            self._position[:] = (slot + 1) % self.window
            np.minimum(self.count + 1, self.window, out=self.count)
        else:
            self._buffer[rows, self._position[rows]] = values[rows]
            self._position[rows] = (self._position[rows] + 1) % self.window
            self.count[rows] = np.minimum(self.count[rows] + 1, self.window)
            self._aligned = bool((self._position == self._position[0]).all())
        self._stale += 1

    def _view(self) -> tuple[np.ndarray, np.ndarray]:
        """The sorted windows and the counts they were sorted with."""
        if self._sorted is None or self._stale >= self.refresh or (self._stale and self.count.min() < self.window):
            self._sorted = np.sort(self._buffer, axis=1)
            self._sorted_count = self.count.copy()
            self._stale = 0
        return self._sorted, self._sorted_count

    def quantile(self, q: float | np.ndarray) -> np.ndarray:
        """Quantiles as numpy's default (linear) method computes them; NaN for empty windows.

        ``q`` scalar gives one column; an array of q gives one column per q.
        """
        ordered, count = self._view()
        qs = np.atleast_1d(np.asarray(q, dtype=np.float64))
        if len(count) and count[0] > 0 and (count == count[0]).all():  # every window equally full: slice columns
            position = qs * (count[0] - 1)
            low = np.floor(position).astype(np.int64)
            high = np.minimum(low + 1, count[0] - 1)
            return ordered[:, low] + (position - low)[None, :] * (ordered[:, high] - ordered[:, low])
        last = np.maximum(count - 1, 0)[:, None]
        position = qs[None, :] * last
        low = np.floor(position).astype(np.int64)
        high = np.minimum(low + 1, last)
        lower = np.take_along_axis(ordered, low, axis=1)
        upper = np.take_along_axis(ordered, high, axis=1)
        with np.errstate(invalid="ignore"):
            out = lower + (position - low) * (upper - lower)
        return np.where(count[:, None] > 0, out, np.nan)

    def robust_sigma(self) -> np.ndarray:
        """A robust standard deviation per window: IQR / 1.349, or, where half the window holds one
        value and the IQR is 0 (counts, idle periods), the 5-95% range / 3.29, else the full range / 4."""
        q = self.quantile(np.array([0.0, 0.05, 0.25, 0.75, 0.95, 1.0]))
        sigma = (q[:, 3] - q[:, 2]) / 1.349
        sigma = np.where(sigma > 0, sigma, (q[:, 4] - q[:, 1]) / 3.29)
        return np.where(sigma > 0, sigma, (q[:, 5] - q[:, 0]) / 4.0)

    def median_absolute_deviation(self, median: np.ndarray) -> np.ndarray:
        """Each window's median absolute deviation from ``median`` (one per series)."""
        ordered, count = self._view()
        deviations = np.abs(ordered - median[:, None])
        deviations[self._columns >= count[:, None]] = np.inf
        deviations.sort(axis=1)
        position = 0.5 * np.maximum(count - 1, 0)
        low = np.floor(position).astype(np.int64)
        high = np.minimum(low + 1, np.maximum(count - 1, 0))
        rows = np.arange(len(count))
        with np.errstate(invalid="ignore"):
            out = deviations[rows, low] + (position - low) * (deviations[rows, high] - deviations[rows, low])
        return np.where(count > 0, out, np.nan)
