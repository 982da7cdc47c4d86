"""Divergence: a loss (or gradient norm) that stops descending and rises for good, caught long before it blows up.

Each value is taken as a logarithm (a loss falls and rises by factors) and
compared with the expected level, a Huber-clipped exponentially weighted mean of
the recent past: a healthy loss that descends, however fast (after an LR decay),
stays at or below that lagging level, so only a rise gives a positive residual.
Residuals are standardised by the series' own noise, a Huber-clipped
exponentially weighted mean absolute residual (it follows the noise as it
shrinks after an LR decay and grows in warm-up), clipped to +-``clip`` so one
spike cannot raise an alarm alone, and summed in a one-sided CUSUM
``S = max(0, S + z - k)``: evidence of a lasting rise of more than ``k`` noise
sigmas. The score is ``S``.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> steps = np.arange(400)
>>> healthy = 2.0 + 3.0 * np.exp(-steps / 80) + rng.normal(0, 0.02, 400)
>>> diverging = healthy * np.exp(np.maximum(steps - 250, 0) * 0.006)  # +0.6% per step from step 250
>>> detector = Divergence()
>>> scores = np.array([detector.update([h, d]) for h, d in zip(healthy, diverging)])
>>> first = int(np.argmax(scores[:, 1] >= Divergence.default_threshold))
>>> bool(np.nanmax(scores[:, 0]) < Divergence.default_threshold), 250 < first < 330, bool(diverging[first] < 3 * diverging[249])
(True, True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainhealth._internal.detectors.base import Detector

__all__ = ["Divergence"]

_SIGMA_PER_MEAN_ABSOLUTE = math.sqrt(math.pi / 2)  # a normal residual's sigma over its mean absolute value


@dataclass(eq=False, repr=False)
class Divergence(Detector):
    """A sustained rise of the (log) value above its expected level: a one-sided CUSUM of standardised residuals.

    The score is the accumulated evidence in noise sigmas beyond ``k`` per value; one
    value adds at most ``clip - k``, so a single spike does not alarm and a rise that
    lasts does (default threshold 12, critical 40).

    Parameters
    ----------
    window
        Span, in values, of the exponentially weighted expected level (the noise scale uses twice the span).
    warmup
        How many values a series learns before its first verdict (NaN until then).
    k
        Allowance in noise sigmas: a rise smaller than ``k`` sigmas per value adds no evidence.
    clip
        Residuals are clipped to +-``clip`` sigmas, in the score and when learnt (Huber), so one
        value moves neither the level nor the score by much; above ``k``.
    log
        Judge ``log(value)`` (losses and norms, which change by factors); values <= 0 then get no verdict.
    min_scale
        Floor on the noise scale (in log units with ``log``: 0.001 is a 0.1% change).

    >>> detector = Divergence(window=10, warmup=10)
    >>> flat = [1.0, 1.02, 0.98, 1.01, 0.99] * 4
    >>> rising = [1.05 * 1.02 ** i for i in range(20)]
    >>> [i for i, x in enumerate(flat + rising) if detector.update([x])[0] >= detector.default_threshold][:1]
    [26]
    """

    name = "divergence"
    default_threshold = 12.0
    default_critical = 40.0

    window: int = 50
    warmup: int = 50
    k: float = 0.5
    clip: float = 4.0
    log: bool = True
    min_scale: float = 1e-3

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.window < 2 or self.warmup < 2:
            raise ValueError("window and warmup must be >= 2")
        if not 0 <= self.k < self.clip:
            raise ValueError("need 0 <= k < clip")
        if not self.min_scale > 0:
            raise ValueError("min_scale must be > 0")
        self._rate = 2.0 / (self.window + 1)

    def _allocate(self, n_series: int) -> None:
        self._level = np.full(n_series, np.nan)
        self._mean_absolute = np.full(n_series, np.nan)
        self._cusum = np.zeros(n_series)
        self._count = np.zeros(n_series, dtype=np.int64)

    def _transform(self, values: Any) -> np.ndarray:
        x = self._vector(values)
        if not self.log:
            return np.where(np.isfinite(x), x, np.nan)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(np.isfinite(x) & (x > 0), np.log(np.where(x > 0, x, 1.0)), np.nan)

    def _scale(self) -> np.ndarray:
        scale = _SIGMA_PER_MEAN_ABSOLUTE * self._mean_absolute
        return np.where(np.isnan(scale), np.nan, np.maximum(scale, self.min_scale))

    def _evidence(self, y: np.ndarray) -> np.ndarray:
        """The CUSUM after ``y`` (NaN where there is no verdict)."""
        with np.errstate(invalid="ignore"):
            z = np.clip((y - self._level) / self._scale(), -self.clip, self.clip)
        ready = (self._count >= self.warmup) & np.isfinite(z)
        return np.where(ready, np.maximum(0.0, self._cusum + z - self.k), np.nan)

    def score(self, values: Any) -> np.ndarray:
        return self._evidence(self._transform(values))

    def learn(self, values: Any, mask: np.ndarray | None = None) -> None:
        y = self._transform(values)
        cusum = self._evidence(y)
        learning = np.isfinite(y) if mask is None else np.isfinite(y) & mask
        starting = learning & np.isnan(self._level)  # a series' first value: the level, no residual yet
        residual = np.where(starting, 0.0, y - self._level)
        limit = np.where(np.isnan(self._mean_absolute), np.inf, self.clip * self._scale())
        clipped = np.clip(residual, -limit, limit)  # Huber: one value moves level and noise by little
        first_residual = learning & ~starting & np.isnan(self._mean_absolute)
        mean_absolute = np.where(
            first_residual,
            np.abs(clipped),
            self._mean_absolute + 0.5 * self._rate * (np.abs(clipped) - self._mean_absolute),
        )
        self._mean_absolute = np.where(learning & ~starting, mean_absolute, self._mean_absolute)
        self._level = np.where(starting, y, np.where(learning, self._level + self._rate * clipped, self._level))
        self._cusum = np.where(learning & ~np.isnan(cusum), cusum, self._cusum)
        self._count += learning

    def expected(self) -> np.ndarray:
        return np.exp(self._level) if self.log else self._level.copy()
