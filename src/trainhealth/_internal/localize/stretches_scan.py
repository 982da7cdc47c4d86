"""The strongest shifted stretch of every row: a change point scan with a noise measured from the data.

For every row of ``values`` (one series per rank or group, NaN where nothing was
measured) and every stretch of steps [start, stop) of at least ``min_length``
steps, the shift of the stretch's mean against the rest of the row is scored as
a z-value with the per-step noise ``sigma``. A stretch that reaches the end is a
fault that began at ``start`` (its onset); one inside the row came and went; one
that is the whole row is compared with zero (the series is already relative to
its peers) less an ``allowance`` for healthy, persistent differences.

>>> import numpy as np
>>> row = np.r_[np.zeros(10), np.full(6, 0.5)] + np.tile([0.01, -0.01], 8)
>>> found = strongest_shift(row[None, :], sigma=0.02, min_length=3, allowance=0.1)
>>> int(found.start[0]), int(found.stop[0]), round(float(found.effect[0]), 2)
(10, 16, 0.5)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

__all__ = ["Shift", "burst_factor", "step_noise", "strongest_shift", "whole_level"]

#: cells (rows x stretches) scored at once, to bound memory at thousands of ranks and long windows
_CHUNK_CELLS = 4_000_000


@dataclass(frozen=True)
class Shift:
    """Per row: the strongest stretch [start, stop), its mean shift (``effect``) and z-value."""

    start: np.ndarray
    stop: np.ndarray
    effect: np.ndarray
    z: np.ndarray


def step_noise(values: np.ndarray, floor: float) -> float:
    """One step's standard deviation, from the step-to-step changes of every row (robust: 1.4826 * MAD / sqrt 2).

    Differences cancel what a row keeps all along (a healthy rank that is always
    a little slower), and a fault that starts or ends moves one difference, not
    the spread. ``floor`` keeps a noiseless input from making trifles significant.
    """
    changes = np.diff(values, axis=1)
    changes = np.abs(changes[np.isfinite(changes)])
    if not len(changes):
        return floor
    return max(1.4826 * float(np.median(changes)) / np.sqrt(2.0), floor)


def burst_factor(values: np.ndarray, sigma: float, block: int = 3) -> float:
    """How much more ``block``-step means move than independent steps would let them (at least 1).

    Noise from a busy neighbour comes in bursts: several slow steps in a row, which the per-step
    noise (from step-to-step changes) does not see. The changes between consecutive, non-overlapping
    ``block``-step means of every row, robustly, against the sigma * sqrt(2 / block) that independent
    steps would give, say how much a stretch's z-value must be discounted.
    """
    n_rows, n_steps = values.shape
    blocks = n_steps // block
    if blocks < 3 or sigma <= 0:
        return 1.0
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # blocks without a measured step
        means = np.nanmean(values[:, : blocks * block].reshape(n_rows, blocks, block), axis=2)
    changes = np.abs(np.diff(means, axis=1))
    changes = changes[np.isfinite(changes)]
    if not len(changes):
        return 1.0
    observed = 1.4826 * float(np.median(changes)) / np.sqrt(2.0)
    return max(1.0, observed / (sigma / np.sqrt(block)))


def strongest_shift(values: np.ndarray, sigma: float, min_length: int, allowance: float, whole: bool = True) -> Shift:
    """The stretch of each row whose mean differs most from the rest of the row, in units of its standard error;
    without ``whole``, only stretches that leave ``min_length`` steps or more outside (a change, with its onset)."""
    n_rows, n_steps = values.shape
    finite = np.isfinite(values)
    sums = np.zeros((n_rows, n_steps + 1))
    counts = np.zeros((n_rows, n_steps + 1))
    sums[:, 1:] = np.cumsum(np.where(finite, values, 0.0), axis=1)
    counts[:, 1:] = np.cumsum(finite, axis=1)
    starts, stops = np.triu_indices(n_steps + 1, k=min_length)
    out = Shift(
        np.zeros(n_rows, dtype=np.int64), np.full(n_rows, n_steps, dtype=np.int64), np.zeros(n_rows), np.zeros(n_rows)
    )
    if not len(starts):
        return out
    rows_per_chunk = max(1, _CHUNK_CELLS // len(starts))
    for first in range(0, n_rows, rows_per_chunk):
        block = slice(first, first + rows_per_chunk)
        inside_sum = sums[block][:, stops] - sums[block][:, starts]
        inside_n = counts[block][:, stops] - counts[block][:, starts]
        total_sum, total_n = sums[block][:, -1:], counts[block][:, -1:]
        outside_n = total_n - inside_n
        with np.errstate(invalid="ignore", divide="ignore"):
            inside_mean = inside_sum / inside_n
            outside_mean = (total_sum - inside_sum) / outside_n
            everything = outside_n < 1
            effect = np.where(everything, inside_mean, inside_mean - outside_mean)
            error = sigma * np.sqrt(1.0 / inside_n + np.where(everything, 0.0, 1.0 / np.maximum(outside_n, 1)))
            z = np.where(everything, inside_mean - allowance, effect) / error
        z[~np.isfinite(z) | (inside_n < min_length)] = -np.inf
        if not whole:  # a change needs a baseline as long as itself at least: steps outside the stretch
            z[outside_n < min_length] = -np.inf
        best = np.argmax(z, axis=1)
        rows = np.arange(z.shape[0])
        out.start[block] = starts[best]
        out.stop[block] = stops[best]
        out.effect[block] = np.nan_to_num(effect[rows, best])
        out.z[block] = np.maximum(np.nan_to_num(z[rows, best], neginf=0.0), 0.0)
    return out


def whole_level(values: np.ndarray, sigma: float, allowance: float) -> Shift:
    """Each row's mean over the whole window, and its z-value above ``allowance``."""
    finite = np.isfinite(values)
    count = finite.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(finite, values, 0.0).sum(axis=1) / count
        z = (mean - allowance) / (sigma / np.sqrt(count))
    n_rows, n_steps = values.shape
    return Shift(
        np.zeros(n_rows, dtype=np.int64),
        np.full(n_rows, n_steps, dtype=np.int64),
        np.nan_to_num(mean),
        np.maximum(np.nan_to_num(z, nan=0.0, neginf=0.0), 0.0),
    )
