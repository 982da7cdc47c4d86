"""Rarity: how improbable a value is under the series' own long history, as -log10 of a probability.

Each series keeps its last ``history`` learnt values. A new value's upper tail
probability is the share of the history at or above it, ``(count + 1) / (n + 1)``;
beyond the history's top ``tail`` share the tail is extrapolated as exponential
(peaks over a threshold with a generalised Pareto tail of shape 0, as in
extreme-value detectors such as SPOT): the share beyond the threshold times
``exp(-excess / scale)``, the scale being the mean excess of those top values,
floored at the series' resolution (the smallest gap between distinct values it
has taken), so a value beyond the largest seen earns a probability below
``1 / n`` that falls with its distance. The threshold and scale are refitted
every ``refit_every`` learnt values, and at once when a value beyond the
history's range is learnt; the counts are exact at every step. The lower tail
is the mirror image; both ways, the probability is twice the smaller tail. The
score is ``-log10`` of it: 3 means one chance in a thousand.

Nothing in it is a unit of the signal: counts, percentages and latencies are
judged by ranks and by their own tail spread and resolution, so quantised,
heavy-tailed series (request counts, CPU percentages) do not look extreme at
every step the way they do against a median and MAD over a short window.

>>> import numpy as np
>>> detector = Rarity(history=1000, warmup=100)
>>> rng = np.random.default_rng(0)
>>> for x in rng.normal(0.0, 1.0, size=(1000, 2)):
...     _ = detector.update(x)
>>> scores = detector.score([0.1, 6.0])
>>> bool(scores[0] < 1.0 < detector.default_threshold < scores[1])
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trainhealth.detectors.base import Detector, Direction

__all__ = ["Rarity"]

_LOG10_E = float(np.log10(np.e))


@dataclass(eq=False, repr=False)
class Rarity(Detector):
    """Values rare under the last ``history`` learnt values: ``-log10`` of their tail probability.

    The score is ``-log10 p`` (default threshold 3, one chance in a thousand; critical 5),
    where ``p`` is the empirical tail probability of a value at least this extreme, with an
    exponential tail beyond the history's extremes (see the module docstring).

    Parameters
    ----------
    history
        How many learnt values the tail probabilities come from (a long memory: the rarer
        a value can be judged, the more values it takes).
    warmup
        How many values a series learns before its first verdict (NaN until then); at most ``history``.
    tail
        The share of the history at each end whose mean excess sets the exponential tail.
    direction
        ``"both"``, or ``"up"`` / ``"down"`` to judge one tail only (the other way scores 0).
    refit_every
        Re-estimate the tails (a sort of the history) every ``refit_every`` learnt values, while
        the history is short at least every quarter of it, and at once after a new extreme.
    min_scale
        Floor on the tail scale, for a history that has held a single value.

    >>> detector = Rarity(history=200, warmup=50)
    >>> series = [float(i % 10) for i in range(200)] + [4.0, 9.0, 10.0, 25.0]
    >>> [i for i, x in enumerate(series) if detector.update([x])[0] > detector.default_threshold]
    [203]
    """

    name = "rarity"
    default_threshold = 3.0
    default_critical = 5.0

    history: int = 4096
    warmup: int = 100
    tail: float = 0.1
    direction: Direction = "both"
    refit_every: int = 32
    min_scale: float = 1e-12

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.history < self.warmup:
            raise ValueError("history must be >= warmup")
        if not 0.0 < self.tail < 0.5:
            raise ValueError("tail must be above 0 and below 0.5")
        if self.refit_every < 1:
            raise ValueError("refit_every must be >= 1")

    def _allocate(self, n_series: int) -> None:
        self._values = np.full((n_series, self.history), np.nan)
        self._position = np.zeros(n_series, dtype=np.int64)
        self._count = np.zeros(n_series, dtype=np.int64)
        self._since_fit = np.zeros(n_series, dtype=np.int64)
        # the tails: where each starts, the share of the history beyond it, its scale; the median and range
        self._upper = np.full(n_series, np.inf)
        self._lower = np.full(n_series, -np.inf)
        self._share = np.ones(n_series)
        self._upper_scale = np.ones(n_series)
        self._lower_scale = np.ones(n_series)
        self._median = np.full(n_series, np.nan)
        self._largest = np.full(n_series, -np.inf)
        self._smallest = np.full(n_series, np.inf)

    def score(self, values: Any) -> np.ndarray:
        x = self._vector(values)
        n = self._count
        with np.errstate(invalid="ignore", divide="ignore"):
            log_up = np.log10((np.count_nonzero(self._values >= x[:, None], axis=1) + 1) / (n + 1))
            log_down = np.log10((np.count_nonzero(self._values <= x[:, None], axis=1) + 1) / (n + 1))
            log_share = np.log10(self._share)
            beyond_up = log_share - (x - self._upper) / self._upper_scale * _LOG10_E
            beyond_down = log_share - (self._lower - x) / self._lower_scale * _LOG10_E
        log_up = np.where(x > self._upper, np.minimum(log_up, beyond_up), log_up)
        log_down = np.where(x < self._lower, np.minimum(log_down, beyond_down), log_down)
        if self.direction == "up":
            surprise = -log_up
        elif self.direction == "down":
            surprise = -log_down
        else:
            surprise = -np.minimum(np.log10(2.0) + np.minimum(log_up, log_down), 0.0)
        return np.where((n >= self.warmup) & np.isfinite(x), np.maximum(surprise, 0.0), np.nan)

    def learn(self, values: Any, mask: np.ndarray | None = None) -> None:
        x = self._vector(values)  # allocates the state on a first call
        learn = np.isfinite(x) if mask is None else np.isfinite(x) & mask
        rows = np.flatnonzero(learn)
        self._values[rows, self._position[rows]] = x[rows]
        self._position[rows] = (self._position[rows] + 1) % self.history
        self._count[rows] = np.minimum(self._count[rows] + 1, self.history)
        self._since_fit[rows] += 1
        record = (x[rows] > self._largest[rows]) | (x[rows] < self._smallest[rows])
        stale = self._since_fit[rows] >= np.minimum(self.refit_every, np.maximum(self._count[rows] // 4, 1))
        due = rows[record | stale]
        if len(due):
            self._fit(due)

    def _fit(self, rows: np.ndarray) -> None:
        """Re-estimate the tails of ``rows`` from their sorted histories."""
        ordered = np.sort(self._values[rows], axis=1)  # NaN (unfilled) sorts last
        n = self._count[rows]
        k = np.maximum(np.floor(self.tail * n).astype(np.int64), 1)
        index = np.arange(self.history)[None, :]
        filled = index < n[:, None]
        upper = np.take_along_axis(ordered, np.maximum(n - 1 - k, 0)[:, None], axis=1)[:, 0]
        lower = np.take_along_axis(ordered, np.minimum(k, n - 1)[:, None], axis=1)[:, 0]
        top = filled & (index >= (n - k)[:, None])
        bottom = index < k[:, None]
        gaps = np.diff(ordered, axis=1)
        with np.errstate(invalid="ignore"):
            resolution = np.where(gaps > 0, gaps, np.inf).min(axis=1)
        floor = np.maximum(np.where(np.isfinite(resolution), resolution, 0.0), self.min_scale)
        self._upper_scale[rows] = np.maximum(np.where(top, ordered - upper[:, None], 0.0).sum(axis=1) / k, floor)
        self._lower_scale[rows] = np.maximum(np.where(bottom, lower[:, None] - ordered, 0.0).sum(axis=1) / k, floor)
        self._upper[rows], self._lower[rows] = upper, lower
        self._share[rows] = k / n
        self._median[rows] = np.take_along_axis(ordered, ((n - 1) // 2)[:, None], axis=1)[:, 0]
        self._largest[rows] = np.take_along_axis(ordered, (n - 1)[:, None], axis=1)[:, 0]
        self._smallest[rows] = ordered[:, 0]
        self._since_fit[rows] = 0

    def expected(self) -> np.ndarray:
        return np.where(self._count > 0, self._median, np.nan)
