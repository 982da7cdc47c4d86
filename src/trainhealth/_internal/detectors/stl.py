"""STL: season-trend decomposition refitted on a bounded window every ``refit_every`` points.

statsmodels' STL is fitted (one inner iteration, which changes residuals by
well under a percent of their scale and costs a fifth of the default) on each
series' last ``window`` values when it is due — never per point. Between
refits a new value is compared with the last fit's extrapolation (trend level
plus slope, plus the seasonal value at that phase) and scored as the residual
over 1.4826 * MAD of the fit's residuals. The period is given or found by
autocorrelation on the first full window; a series without one is scored
against its rolling median. Protected values enter the window as the
expected value, so a seasonal series keeps its phase.

>>> import numpy as np
>>> t = np.arange(400)
>>> values = 10 + np.sin(2 * np.pi * t / 24) + np.random.default_rng(0).normal(0, 0.05, 400)
>>> detector = STLDetector(window=192, refit_every=48)
>>> scores = [float(detector.update([v])[0]) for v in values]
>>> int(detector.periods[0]), bool(np.nanmax(scores[200:]) < 6), float(detector.score([values[-24] + 2.0])[0]) > 10
(24, True, True)
"""

from __future__ import annotations

import importlib.util
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainhealth._internal.detectors.base import Detector, Direction, directional
from trainhealth._internal.detectors.rolling import RollingMoments

__all__ = ["STLDetector", "estimate_periods"]


def estimate_periods(windows: np.ndarray, min_period: int = 2, min_correlation: float = 0.3) -> np.ndarray:
    """The lag of the highest autocorrelation peak of each row (0 when none reaches ``min_correlation``).

    >>> t = np.arange(120)
    >>> estimate_periods(np.vstack([np.sin(2 * np.pi * t / 12), np.random.default_rng(1).normal(size=120)])).tolist()
    [12, 0]
    """
    n, length = windows.shape
    centred = windows - windows.mean(axis=1, keepdims=True)
    size = 1 << int(np.ceil(np.log2(2 * length)))
    spectrum = np.fft.rfft(centred, size, axis=1)
    correlation = np.fft.irfft(spectrum * np.conj(spectrum), size, axis=1)[:, :length]
    with np.errstate(invalid="ignore", divide="ignore"):
        correlation = correlation / correlation[:, :1]
    periods = np.zeros(n, dtype=np.int64)
    highest = length // 2
    for row in range(n):
        acf = correlation[row, : highest + 1]
        if not np.isfinite(acf).all():
            continue
        lags = np.arange(min_period, highest)
        peaks = lags[(acf[lags] > acf[lags - 1]) & (acf[lags] >= acf[lags + 1]) & (acf[lags] >= min_correlation)]
        if len(peaks):
            periods[row] = int(peaks[np.argmax(acf[peaks])])
    return periods


@dataclass(eq=False, repr=False)
class STLDetector(Detector):
    """Values off a seasonal series' pattern: the residual from an STL fit's extrapolation.

    The score is the residual (the value less the last fit's trend and seasonal part,
    extrapolated) over 1.4826 * MAD of that fit's residuals (default threshold 5,
    critical 10); no verdict before the first fit, on a full ``window``.

    Parameters
    ----------
    period
        The season in values (>= 2, at most half the window); ``None``: found by autocorrelation per series
        (:attr:`periods`).
    window
        How many learnt values each fit covers (``None``: 8 periods, or 256 without a given period).
    refit_every
        How many values a series learns between fits.
    direction
        ``"both"``, or ``"up"`` / ``"down"`` to score residuals one way only (the other way scores 0).
    min_scale
        Floor on the residual scale, so a perfect fit does not divide by zero.

    >>> import numpy as np
    >>> t = np.arange(80)
    >>> series = 10 + np.sin(2 * np.pi * t / 8) + np.random.default_rng(0).normal(0, 0.05, 80)
    >>> series[70] += 1.0  # a spike
    >>> detector = STLDetector(period=8, window=64, refit_every=16)
    >>> [i for i, x in enumerate(series) if detector.update([x])[0] > detector.default_threshold]
    [70]
    """

    name = "stl"
    default_threshold = 5.0
    default_critical = 10.0

    period: int | None = None
    window: int | None = None
    refit_every: int = 64
    direction: Direction = "both"
    min_scale: float = 1e-12

    def __post_init__(self) -> None:
        if self.window is None:
            self.window = 8 * self.period if self.period else 256
        self.warmup = self._length = self.window  # _length: the window, never None from here
        super().__post_init__()
        if self.period is not None and (self.period < 2 or 2 * self.period > self._length):
            raise ValueError("period must be >= 2 and at most half the window")
        if self.refit_every < 1:
            raise ValueError("refit_every must be >= 1")
        if importlib.util.find_spec("statsmodels") is None:  # a training pod without the extra: say so now
            raise ValueError("stl needs the 'analysis' extra (statsmodels): pip install 'trainhealth[analysis]'")

    def _allocate(self, n_series: int) -> None:
        self._values = RollingMoments(n_series, self._length)
        self.periods = np.full(n_series, self.period or -1, dtype=np.int64)  # per series; -1: not yet estimated
        self._level = np.full(n_series, np.nan)
        self._slope = np.zeros(n_series)
        self._scale = np.full(n_series, np.nan)
        self._seasonal = np.zeros((n_series, max(1, self._length // 2)))
        self._since_fit = np.zeros(n_series, dtype=np.int64)
        self._fitted = np.zeros(n_series, dtype=bool)
        self.fits = 0

    def expected(self) -> np.ndarray:
        ahead = self._since_fit + 1
        period = np.maximum(self.periods, 1)
        phase = np.where(self.periods > 0, (ahead - 1) % period, 0)
        seasonal = np.where(self.periods > 0, self._seasonal[np.arange(len(phase)), phase], 0.0)
        return np.where(self._fitted, self._level + self._slope * ahead + seasonal, np.nan)

    def score(self, values: Any) -> np.ndarray:
        x = self._vector(values)
        with np.errstate(invalid="ignore"):
            residual = (x - self.expected()) / np.maximum(self._scale, self.min_scale)
        return directional(np.where(self._fitted, residual, np.nan), self.direction)

    def learn(self, values: Any, mask: np.ndarray | None = None) -> None:
        x = self._vector(values).copy()
        if mask is not None:  # protected points enter as the expectation: the phase must go on
            x = np.where(mask | ~self._fitted, x, self.expected())
        self._values.update(x)
        self._since_fit += np.isfinite(x)
        due = (self._values.count >= self._length) & (~self._fitted | (self._since_fit >= self.refit_every))
        if due.any():
            self._refit(np.flatnonzero(due))

    def _refit(self, rows: np.ndarray) -> None:
        windows = self._values.values()[rows]
        unknown = self.periods[rows] < 0
        if unknown.any():
            self.periods[rows[unknown]] = estimate_periods(windows[unknown])
        for position, row in enumerate(rows):
            series = windows[position]
            period = int(self.periods[row])
            if period >= 2:
                from statsmodels.tsa.seasonal import STL  # imported when first needed: it is slow to import

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    fit = STL(series, period=period).fit(inner_iter=1)
                trend, seasonal, residual = fit.trend, fit.seasonal, fit.resid
                self._seasonal[row, :period] = seasonal[-period:]
                self._slope[row] = (trend[-1] - trend[-period]) / (period - 1)
                self._level[row] = trend[-1]
            else:
                median = float(np.median(series[-32:]))
                residual = series - np.median(series)
                self._slope[row] = 0.0
                self._level[row] = median
            scale = 1.4826 * float(np.median(np.abs(residual - np.median(residual))))
            self._scale[row] = scale if scale > 0 else float(np.std(residual))  # a mostly constant residual
        self._since_fit[rows] = 0
        self._fitted[rows] = True
        self.fits += len(rows)
