"""Rarity: how improbable a value is under the series' own long history, as -log10 of a probability.

Each series keeps its last ``history`` learnt values. A new value's upper tail
probability is the share of the history at or above it, ``(count + 1) / (n + 1)``,
everywhere inside the history's range: a value the history has already reached
is judged by its rank alone. Beyond the largest value the probability is
``1 / (n + 1)``, the chance that a fresh value goes past the largest of ``n``,
times the chance of going as far past it under a generalised Pareto tail (peaks
over a threshold, as in extreme-value detectors such as SPOT) fitted to the
history's top ``tail`` share by probability-weighted moments (Hosking & Wallis,
1987), its shape held between 0 (exponential) and ``_MAX_SHAPE`` and its scale
at the largest value floored at the series' resolution (the smallest gap between
distinct values it has taken). A heavy tail (Student-t, lognormal, Pareto) thus
falls as slowly beyond the history as inside it, and a count one step beyond
its largest is not infinitely rare. The tail is refitted every ``refit_every``
learnt values, and at once when a value beyond the history's range is learnt;
the counts are exact at every step. The lower tail is the mirror image; both
ways, the probability is twice the smaller tail. The score is ``-log10`` of it:
3 means one chance in a thousand.

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

from trainhealth._internal.detectors.base import Detector, Direction

__all__ = ["Rarity"]

_LOG10_E = float(np.log10(np.e))
#: The largest tail shape fitted (probability-weighted moments need one below 1): 0.75 is a tail falling as
#: x ** -1.33, heavier than Student-t(2)'s (0.5) or Pareto(1.5)'s (0.67). Chosen on seeds 0-4 of the calibration
#: draws described in docs/detectors.md (0.5 to 0.95 changed little there; 0, an exponential, did).
_MAX_SHAPE = 0.75


@dataclass(eq=False, repr=False)
class Rarity(Detector):
    """Values rare under the last ``history`` learnt values: ``-log10`` of their tail probability.

    The score is ``-log10 p`` (default threshold 3, one chance in a thousand; critical 5),
    where ``p`` is the empirical tail probability of a value at least this extreme, with a
    generalised Pareto tail beyond the history's extremes (see the module docstring).

    Parameters
    ----------
    history
        How many learnt values the tail probabilities come from (a long memory: the rarer
        a value can be judged, the more values it takes).
    warmup
        How many values a series learns before its first verdict (NaN until then); at most ``history``.
    tail
        The share of the history at each end to which the tail beyond the extremes is fitted.
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
        # the tails beyond the largest and smallest values (their scale there and shape), the median and the
        # range: none before the first fit
        self._upper_scale = np.ones(n_series)
        self._lower_scale = np.ones(n_series)
        self._upper_shape = np.zeros(n_series)
        self._lower_shape = np.zeros(n_series)
        self._median = np.full(n_series, np.nan)
        self._largest = np.full(n_series, np.inf)
        self._smallest = np.full(n_series, -np.inf)

    def score(self, values: Any) -> np.ndarray:
        x = self._vector(values)
        n = self._count
        with np.errstate(invalid="ignore", divide="ignore"):
            log_up = np.log10((np.count_nonzero(self._values >= x[:, None], axis=1) + 1) / (n + 1))
            log_down = np.log10((np.count_nonzero(self._values <= x[:, None], axis=1) + 1) / (n + 1))
            log_up -= _beyond(x - self._largest, self._upper_scale, self._upper_shape)
            log_down -= _beyond(self._smallest - x, self._lower_scale, self._lower_shape)
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
        """Re-fit the tails of ``rows`` beyond their extremes from their sorted histories."""
        ordered = np.sort(self._values[rows], axis=1)  # NaN (unfilled) sorts last
        n = self._count[rows]
        k = np.maximum(np.floor(self.tail * n).astype(np.int64), 1)
        index = np.arange(self.history)[None, :]
        largest = np.take_along_axis(ordered, (n - 1)[:, None], axis=1)[:, 0]
        smallest = ordered[:, 0]
        gaps = np.diff(ordered, axis=1)
        with np.errstate(invalid="ignore"):
            resolution = np.where(gaps > 0, gaps, np.inf).min(axis=1)
        floor = np.maximum(np.where(np.isfinite(resolution), resolution, 0.0), self.min_scale)
        # the top k values' excesses over the value below them, and their ranks from the smallest excess up
        upper = np.take_along_axis(ordered, np.maximum(n - 1 - k, 0)[:, None], axis=1)[:, 0]
        top = (index >= (n - k)[:, None]) & (index < n[:, None])
        up_excess = np.where(top, ordered - upper[:, None], 0.0)
        self._upper_scale[rows], self._upper_shape[rows] = _pareto_tail(
            up_excess, index - (n - k)[:, None], k, largest - upper, floor
        )
        lower = np.take_along_axis(ordered, np.minimum(k, n - 1)[:, None], axis=1)[:, 0]
        bottom = index < k[:, None]
        down_excess = np.where(bottom, lower[:, None] - ordered, 0.0)
        self._lower_scale[rows], self._lower_shape[rows] = _pareto_tail(
            down_excess, k[:, None] - 1 - index, k, lower - smallest, floor
        )
        self._median[rows] = np.take_along_axis(ordered, ((n - 1) // 2)[:, None], axis=1)[:, 0]
        self._largest[rows], self._smallest[rows] = largest, smallest
        self._since_fit[rows] = 0

    def expected(self) -> np.ndarray:
        return np.where(self._count > 0, self._median, np.nan)


def _pareto_tail(
    excess: np.ndarray, rank: np.ndarray, k: np.ndarray, reach: np.ndarray, floor: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(scale, shape) of a generalised Pareto tail beyond the extreme, fitted to ``k`` excesses per row.

    ``excess`` holds each row's excesses over the tail's threshold (0 elsewhere), ``rank`` their ranks
    from the smallest (0) to the largest (k - 1), and ``reach`` how far the extreme lies beyond the
    threshold. Probability-weighted moments (Hosking & Wallis, 1987): with ``a0`` the mean excess and
    ``a1`` the mean of each excess times the share of the others above it, the shape is
    ``2 - a0 / (a0 - 2 a1)``, held within ``[0, _MAX_SHAPE]``, and the scale at the threshold
    ``a0 (1 - shape)``; past the extreme the tail is the same one, its scale grown by ``shape x reach``.
    """
    a0 = excess.sum(axis=1) / k
    weight = np.clip((k[:, None] - 1 - rank) / np.maximum(k[:, None] - 1, 1), 0.0, 1.0)
    a1 = (excess * weight).sum(axis=1) / k
    with np.errstate(invalid="ignore", divide="ignore"):
        shape = np.where((k > 1) & (a0 - 2 * a1 > 0), 2.0 - a0 / (a0 - 2 * a1), 0.0)
    shape = np.clip(np.nan_to_num(shape), 0.0, _MAX_SHAPE)
    return np.maximum(a0 * (1.0 - shape) + shape * reach, floor), shape


def _beyond(excess: np.ndarray, scale: np.ndarray, shape: np.ndarray) -> np.ndarray:
    """``-log10`` of a generalised Pareto tail's probability of going ``excess`` past its start (0 below it)."""
    z = np.maximum(excess, 0.0) / scale
    safe_shape = np.where(shape > 0, shape, 1.0)
    return np.where(shape > 0, np.log1p(safe_shape * z) / safe_shape, z) * _LOG10_E
