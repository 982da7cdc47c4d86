"""Bayesian online change-point detection (Adams & MacKay 2007), vectorised over series.

Each series is a sequence of segments of constant mean and variance, with a
change before any value with probability ``1 / expected_run`` (the hazard). The
detector keeps the posterior over the run length ``r`` (how many values since
the last change), truncated to ``max_run`` values so the state is bounded (a run
longer than that is judged on its last ``max_run - 1`` values), and predicts the
next value under each run length with the Normal-Gamma conjugate model: a
Student-t whose parameters come from the last ``r`` values. The prior of a new
segment is centred on the last value, with a spread from the series' own noise
(the mean absolute step-to-step difference), so no scale is fitted to one data set.

The score is the posterior probability that the series changed within the last
``recent`` values, ``P(r <= recent)``, counted only when the mean of the last
``recent`` values lies above (``direction="up"``) or below (``"down"``) the mean of
the ``recent`` values before them: a loss watched with ``direction="up"`` raises it on a jump up (a bad
data shard) and not on its descent, however fast.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> descent = 3.0 * np.exp(-np.arange(300) / 100) + 1.0
>>> shifted = descent + 0.3 * (np.arange(300) >= 200)  # a bad shard from step 200
>>> detector = BOCPD(direction="up")
>>> scores = np.array([detector.update(x) for x in rng.normal(0, 0.03, (300, 2)) + np.c_[descent, shifted]])
>>> bool(np.nanmax(scores[:, 0]) < 0.5), int(np.argmax(scores[:, 1] >= BOCPD.default_threshold))
(True, 200)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainhealth._internal.detectors.base import Detector, Direction

__all__ = ["BOCPD"]

_ALPHA0 = 1.0  # the Normal-Gamma prior: shape of the precision (a heavy-tailed predictive for a new segment)
_KAPPA0 = 0.1  # pseudo-count of the prior mean (the last value): a new segment's mean is the data's
_SIGMA_PER_MEAN_DIFFERENCE = math.sqrt(math.pi) / 2  # a normal series' sigma over its mean absolute difference


@dataclass(eq=False, repr=False)
class BOCPD(Detector):
    """Changes of level: the posterior probability of a change point within the last ``recent`` values.

    The score is a probability from 0 to 1 (default threshold 0.95, critical 0.99).

    Parameters
    ----------
    expected_run
        The expected number of values between changes (the hazard is its inverse); above 1.
    max_run
        Run lengths kept per series (the state is ``n_series x max_run``); longer runs are judged on their
        last ``max_run - 1`` values.
    recent
        A change counts when it happened within this many values; below ``max_run``.
    warmup
        How many values a series learns before its first verdict (NaN until then); at least ``2 * recent``.
    direction
        ``"both"``, or ``"up"`` / ``"down"`` to score changes one way only.
    log
        Judge ``log(value)`` (losses and norms, which change by factors); values <= 0 then get no verdict.
    min_scale
        Floor on the noise scale of a new segment's prior, so a constant series does not divide by zero.

    >>> detector = BOCPD(warmup=10, direction="up")
    >>> series = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95] * 5 + [0.5] * 5 + [2.0] * 5  # a drop, then a jump
    >>> [i for i, x in enumerate(series) if detector.update([x])[0] >= detector.default_threshold][:1]
    [36]
    """

    name = "bocpd"
    default_threshold = 0.95
    default_critical = 0.99

    expected_run: float = 250.0
    max_run: int = 200
    recent: int = 5
    warmup: int = 30
    direction: Direction = "both"
    log: bool = False
    min_scale: float = 1e-12

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 < self.expected_run < math.inf:
            raise ValueError("expected_run must be above 1")
        if not 1 <= self.recent < self.max_run:
            raise ValueError("need 1 <= recent < max_run")
        if self.warmup < 2 * self.recent:
            raise ValueError("warmup must be >= 2 * recent")
        if not self.min_scale > 0:
            raise ValueError("min_scale must be > 0")
        runs = np.arange(self.max_run, dtype=np.float64)
        alpha = _ALPHA0 + runs / 2
        self._kappa = _KAPPA0 + runs
        self._alpha = alpha
        self._log_normaliser = np.array([math.lgamma(a + 0.5) - math.lgamma(a) for a in alpha]) - 0.5 * np.log(
            2 * alpha * math.pi
        )
        self._hazard = 1.0 / self.expected_run

    def _allocate(self, n_series: int) -> None:
        self._values = np.zeros((n_series, self.max_run - 1))  # the last values, newest first
        self._count = np.zeros(n_series, dtype=np.int64)
        self._posterior = np.zeros((n_series, self.max_run))
        self._posterior[:, 0] = 1.0
        self._mean_difference = np.full(n_series, np.nan)
        self._scored: tuple[np.ndarray, np.ndarray] | None = None

    def _transform(self, values: Any) -> np.ndarray:
        x = self._vector(values)
        if not self.log:
            return np.where(np.isfinite(x), x, np.nan)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(np.isfinite(x) & (x > 0), np.log(np.where(x > 0, x, 1.0)), np.nan)

    def _updated(self, y: np.ndarray) -> np.ndarray:
        """The run-length posterior after ``y`` (rows of series without a finite value are garbage)."""
        centred = self._values - self._values[:, :1]  # sums around the newest value, for precision
        sums = np.zeros_like(self._posterior)
        squares = np.zeros_like(self._posterior)
        np.cumsum(centred, axis=1, out=sums[:, 1:])
        np.cumsum(centred * centred, axis=1, out=squares[:, 1:])
        scale = np.fmax(_SIGMA_PER_MEAN_DIFFERENCE * self._mean_difference, self.min_scale)  # NaN: no difference yet
        beta = (_ALPHA0 * scale * scale)[:, None] + 0.5 * (squares - sums * sums / self._kappa)
        mean = sums / self._kappa
        spread = beta * (self._kappa + 1) / (self._alpha * self._kappa)
        with np.errstate(invalid="ignore"):
            residual = (y - self._values[:, 0])[:, None] - mean
            log_predictive = (
                self._log_normaliser
                - 0.5 * np.log(spread)
                - (self._alpha + 0.5) * np.log1p(residual * residual / (2 * self._alpha * spread))
            )
        log_predictive = np.where(self._posterior > 0, log_predictive, -np.inf)
        best = np.max(log_predictive, axis=1, keepdims=True)
        joint = self._posterior * np.exp(log_predictive - np.where(np.isfinite(best), best, 0.0))
        updated = np.empty_like(joint)
        updated[:, 0] = self._hazard * joint.sum(axis=1)
        updated[:, 1:] = (1 - self._hazard) * joint[:, :-1]
        updated[:, -1] += (1 - self._hazard) * joint[:, -1]
        with np.errstate(invalid="ignore", divide="ignore"):
            return updated / updated.sum(axis=1, keepdims=True)

    def score(self, values: Any) -> np.ndarray:
        y = self._transform(values)
        updated = self._updated(y)
        self._scored = (y, updated)  # learn() of the same values, next, reuses it
        changed = updated[:, : self.recent + 1].sum(axis=1)
        if self.direction != "both":
            newest = np.concatenate([y[:, None], self._values[:, : self.recent - 1]], axis=1).mean(axis=1)
            before = self._values[:, self.recent - 1 : 2 * self.recent - 1].mean(axis=1)
            rising = newest > before
            changed = np.where(rising if self.direction == "up" else ~rising, changed, 0.0)
        ready = (self._count >= self.warmup) & np.isfinite(y)
        return np.where(ready, changed, np.nan)

    def learn(self, values: Any, mask: np.ndarray | None = None) -> None:
        y = self._transform(values)
        learning = np.isfinite(y) if mask is None else np.isfinite(y) & mask
        seen = learning & (self._count >= 1)
        scored, self._scored = self._scored, None
        reusable = scored is not None and np.array_equal(scored[0], y, equal_nan=True)
        updated = scored[1] if scored is not None and reusable else self._updated(y)
        if seen.all():
            self._posterior = updated
        elif seen.any():
            self._posterior[seen] = updated[seen]
        difference = np.abs(y - self._values[:, 0])
        rate = 2.0 / (self.max_run + 1)
        with np.errstate(invalid="ignore"):
            mean_difference = np.where(
                np.isnan(self._mean_difference),
                difference,
                self._mean_difference
                + rate * (np.minimum(difference, 5 * self._mean_difference) - self._mean_difference),
            )
        self._mean_difference = np.where(seen, mean_difference, self._mean_difference)
        if learning.all():
            self._values[:, 1:] = self._values[:, :-1].copy()
            self._values[:, 0] = y
        elif learning.any():
            self._values[learning, 1:] = self._values[learning, :-1]
            self._values[learning, 0] = y[learning]
        self._count += learning

    def expected(self) -> np.ndarray:
        """The mean of the most probable run (the current segment's level)."""
        runs = np.argmax(self._posterior, axis=1)
        length = np.maximum(runs, 1)
        mean = np.cumsum(self._values, axis=1)[np.arange(len(runs)), length - 1] / length
        mean = np.where(self._count > 0, mean, np.nan)
        return np.exp(mean) if self.log else mean
