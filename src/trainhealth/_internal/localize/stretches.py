"""Slowness accumulated across iterations: the strongest slow stretch of each series.

A fault starts, lasts and may end inside the analysed window; before it, the
same rank (NIC, host, switch) shows its normal level, which folds away the fixed
speed differences between healthy GPUs. For each series (one row per candidate,
one column per step, as sums of observations and their counts) the score is the
largest standardized difference between the mean inside a run of at least
``min_length`` consecutive steps and the mean outside it; steps are weighted by
``decay`` to the power of their age, so recent steps count more. A fault
that covers the whole window has no outside: it is scored by its level, what
exceeds ``allowance`` above the peer reference of zero.

>>> import numpy as np
>>> values = np.zeros((2, 12)); values[1, 6:] = 0.2
>>> best = strongest_stretch(values, np.ones_like(values), sigma=0.05)
>>> best.start.tolist(), best.stop.tolist(), [round(float(e), 2) for e in best.effect]
([0, 6], [3, 12], [0.0, 0.2])
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass

import numpy as np

__all__ = ["Stretch", "level", "ongoing_stretch", "strongest_robust_stretch", "strongest_stretch"]

MAX_BLOCKS = 64  # longer windows are summed into this many blocks of consecutive steps


@dataclass(frozen=True)
class Stretch:
    """Per row: the stretch of steps ``[start, stop)``, its mean excess over the rest and its z-score."""

    start: np.ndarray
    stop: np.ndarray
    effect: np.ndarray
    z: np.ndarray


def _weights(n_steps: int, decay: float) -> np.ndarray:
    return decay ** np.arange(n_steps - 1, -1, -1, dtype=np.float64)


def strongest_stretch(
    sums: np.ndarray, counts: np.ndarray, sigma: float, min_length: int = 3, decay: float = 1.0
) -> Stretch:
    """The slow stretch with the largest z per row; ``sigma`` is one observation's standard deviation."""
    sums, counts, edges = _blocks(np.nan_to_num(sums), counts)
    rows, n_blocks = sums.shape
    weights = _weights(n_blocks, decay)
    weighted_sum = np.concatenate([np.zeros((rows, 1)), np.cumsum(sums * weights, axis=1)], axis=1)
    weighted_count = np.concatenate([np.zeros((rows, 1)), np.cumsum(counts * weights, axis=1)], axis=1)
    squared = np.concatenate([np.zeros((rows, 1)), np.cumsum(counts * weights**2, axis=1)], axis=1)
    total_sum, total_count, total_squared = weighted_sum[:, -1:], weighted_count[:, -1:], squared[:, -1:]
    length = max(1, min(min_length, n_blocks))
    start, stop = _bounds(n_blocks, length)
    best = Stretch(
        np.zeros(rows, dtype=np.int64), np.zeros(rows, dtype=np.int64), np.zeros(rows), np.full(rows, -np.inf)
    )
    chunk = max(1, _CELLS // max(len(start), 1))
    with np.errstate(invalid="ignore", divide="ignore"):
        for first in range(0, rows if len(start) else 0, chunk):  # a few rows at a time: small temporaries
            part = slice(first, first + chunk)
            inside_count = weighted_count[part][:, stop] - weighted_count[part][:, start]
            outside_count = total_count[part] - inside_count
            inside_sum = weighted_sum[part][:, stop] - weighted_sum[part][:, start]
            inside_squared = squared[part][:, stop] - squared[part][:, start]
            effect = inside_sum / inside_count - (total_sum[part] - inside_sum) / outside_count
            spread = sigma * np.sqrt(
                inside_squared / inside_count**2 + (total_squared[part] - inside_squared) / outside_count**2
            )
            z = np.nan_to_num(effect / spread, nan=-np.inf)
            _keep_first_best(best, part, start, stop, effect, z)
    return Stretch(edges[best.start], edges[best.stop], best.effect, np.where(np.isfinite(best.z), best.z, 0.0))


#: stretches x rows computed at once by :func:`strongest_stretch` (a few MB per array)
_CELLS = 1 << 18


def _bounds(n_blocks: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Start and stop of every stretch of at least ``length`` blocks but the whole window, in the order a scan
    by start, then stop, meets them."""
    bounds = [(a, b) for a in range(n_blocks) for b in range(a + length, n_blocks + 1) if b - a != n_blocks]
    pairs = np.array(bounds, dtype=np.int64).reshape(-1, 2)
    return pairs[:, 0], pairs[:, 1]


def _keep_first_best(
    best: Stretch, part: slice, start: np.ndarray, stop: np.ndarray, effect: np.ndarray, z: np.ndarray
) -> None:
    """Per row of ``part``: the first stretch with the largest ``z`` (columns of ``effect`` and ``z``), where
    it beats the row's -inf (a row without any finite z keeps none)."""
    rows = np.arange(z.shape[0])
    chosen = np.argmax(z, axis=1)
    top = z[rows, chosen]
    better = top > -np.inf
    index = np.arange(part.start, part.start + z.shape[0])[better]
    best.start[index], best.stop[index] = start[chosen[better]], stop[chosen[better]]
    best.effect[index], best.z[index] = effect[rows, chosen][better], top[better]


def strongest_robust_stretch(
    values: np.ndarray, sigma: float | np.ndarray, min_length: int = 5, min_outside: int = 3
) -> Stretch:
    """Like :func:`strongest_stretch` with medians for means, no decay, and longer stretches: a run of
    ``min_length`` steps counts only when most of its steps are slow, so two unlucky steps in a row
    (GC pauses) do not make one. For series with no per-operation robustness of their own; ``sigma``
    may be one per row."""
    sigma = np.broadcast_to(np.asarray(sigma, dtype=np.float64), (values.shape[0],))
    rows, steps = values.shape
    if steps > MAX_BLOCKS:
        edges = np.linspace(0, steps, MAX_BLOCKS + 1).round().astype(np.int64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            values = np.stack([np.nanmedian(values[:, a:b], axis=1) for a, b in itertools.pairwise(edges)], axis=1)
        steps = MAX_BLOCKS
    else:
        edges = np.arange(steps + 1)
    best = Stretch(np.zeros(rows, dtype=np.int64), np.zeros(rows, dtype=np.int64), np.zeros(rows), np.zeros(rows))
    base = np.zeros(rows)  # the outside median of each row's best stretch
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for start in range(steps):
            for stop in range(start + min_length, steps - max(0, min_outside - start) + 1):
                inside = np.nanmedian(values[:, start:stop], axis=1)
                outside = np.nanmedian(np.concatenate([values[:, :start], values[:, stop:]], axis=1), axis=1)
                length, rest = stop - start, steps - (stop - start)
                z = np.nan_to_num((inside - outside) / (1.25 * sigma * np.sqrt(1 / length + 1 / rest)), nan=0.0)
                better = z > best.z
                best.start[better], best.stop[better] = start, stop
                best.effect[better], best.z[better] = (inside - outside)[better], z[better]
                base[better] = outside[better]
    _extend(values, best, base + best.effect / 2)
    return Stretch(edges[best.start], edges[best.stop], best.effect, best.z)


def _extend(values: np.ndarray, best: Stretch, middle: np.ndarray) -> None:
    """Grow each row's stretch over the neighbouring steps at or above ``middle`` (halfway between its inside
    and outside): the medians settle for a balanced split, the report should say where the slow steps are."""
    rows, steps = values.shape
    with np.errstate(invalid="ignore"):
        for _ in range(steps):
            after = np.clip(best.stop, 0, steps - 1)
            grow = (best.stop < steps) & (best.effect > 0) & (values[np.arange(rows), after] >= middle)
            before = np.clip(best.start - 1, 0, steps - 1)
            shrink = (best.start > 0) & (best.effect > 0) & (values[np.arange(rows), before] >= middle)
            if not (grow.any() or shrink.any()):
                return
            best.stop[grow] += 1
            best.start[shrink] -= 1


def level(sums: np.ndarray, counts: np.ndarray, sigma: float, allowance: float, min_steps: int = 3) -> Stretch:
    """Slow throughout: the lower quartile of the per-step means above ``allowance``, as a stretch over
    every step (z = 0 with fewer than ``min_steps`` steps: too little to judge a level by).

    The lower quartile, not the mean: a fault over most of the window raises the
    mean, but only one present all along raises the quartile.
    """
    rows, steps = sums.shape
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # rows without any value
        means = np.where(counts > 0, sums / np.where(counts > 0, counts, 1.0), np.nan)
        quartile = _lower_quartile(means)
        present = (counts > 0).sum(axis=1)
        per_step = sigma / np.sqrt(np.nanmedian(np.where(counts > 0, counts, np.nan), axis=1))
        z = (quartile - allowance) / (1.36 * per_step / np.sqrt(present))  # 1.36: a normal quartile's error
    z = np.where(present >= min_steps, np.nan_to_num(z, nan=0.0), 0.0)
    return Stretch(np.zeros(rows, dtype=np.int64), np.full(rows, steps), np.nan_to_num(quartile), z)


def _lower_quartile(values: np.ndarray) -> np.ndarray:
    """Per row, the 25th percentile of the finite values (linear interpolation, as numpy's), NaN for none;
    vectorised: numpy's nanquantile goes row by row."""
    ordered = np.sort(values, axis=1)  # NaN sorts last
    count = np.isfinite(values).sum(axis=1)
    position = 0.25 * np.maximum(count - 1, 0)
    low = np.floor(position).astype(np.int64)
    high = np.minimum(low + 1, np.maximum(count - 1, 0))
    rows = np.arange(len(values))
    quartile = ordered[rows, low] + (ordered[rows, high] - ordered[rows, low]) * (position - low)
    return np.where(count > 0, quartile, np.nan)


def _blocks(sums: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sum consecutive steps into at most MAX_BLOCKS blocks; ``edges`` maps block bounds to steps."""
    steps = sums.shape[1]
    if steps <= MAX_BLOCKS:
        return sums, counts, np.arange(steps + 1)
    edges = np.linspace(0, steps, MAX_BLOCKS + 1).round().astype(np.int64)
    return (np.add.reduceat(sums, edges[:-1], axis=1), np.add.reduceat(counts, edges[:-1], axis=1), edges)


def ongoing_stretch(values: np.ndarray, sigma: float, inside: int, outside: int) -> Stretch:
    """Per row, the strongest stretch that runs to the row's end and is at least ``inside`` steps long, against at
    least ``outside`` steps before it: a fault whose onset lies in the history and that lasts through the window
    judged (its z-value, with per-step noise ``sigma``; 0 where none fits).

    >>> row = np.r_[np.zeros(30), np.full(25, 0.2)] + np.tile([0.01, -0.01], 28)[:55]
    >>> found = ongoing_stretch(row[None, :], sigma=0.02, inside=10, outside=10)
    >>> int(found.start[0]), int(found.stop[0]), round(float(found.effect[0]), 2)
    (30, 55, 0.2)
    """
    rows, steps = values.shape
    found = Stretch(np.zeros(rows, dtype=np.int64), np.full(rows, steps), np.zeros(rows), np.zeros(rows))
    starts = np.arange(max(outside, 1), steps - inside + 1)
    if not len(starts) or not rows:
        return found
    finite = np.isfinite(values)
    sums = np.concatenate([np.zeros((rows, 1)), np.cumsum(np.where(finite, values, 0.0), axis=1)], axis=1)
    counts = np.concatenate([np.zeros((rows, 1)), np.cumsum(finite, axis=1)], axis=1)
    before_sum, before_n = sums[:, starts], counts[:, starts]
    after_sum, after_n = sums[:, -1:] - before_sum, counts[:, -1:] - before_n
    with np.errstate(invalid="ignore", divide="ignore"):
        effect = after_sum / after_n - before_sum / before_n
        z = effect / (sigma * np.sqrt(1.0 / after_n + 1.0 / before_n))
    z = np.where((after_n >= max(1, inside // 2)) & (before_n >= max(1, outside // 2)), z, -np.inf)
    z = np.nan_to_num(z, nan=-np.inf)
    chosen = np.argmax(z, axis=1)
    every = np.arange(rows)
    top = z[every, chosen]
    kept = np.isfinite(top)
    found.start[kept] = starts[chosen[kept]]
    found.effect[kept] = effect[every, chosen][kept]
    found.z[kept] = np.maximum(top[kept], 0.0)
    return found
