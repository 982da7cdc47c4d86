"""Judging one member's slow stretch against the whole run: its shape, its rarity here, its recurrence.

A threshold that is right for one comparison blames somebody in nearly every
long healthy run: a 1,024-rank job of 5,000 steps makes millions of rank x
stretch comparisons, and production noise is not Gaussian (GC pauses,
checkpoints, a slow data shard, congestion on a random NIC). So a slow stretch
found by the scans of :mod:`.stretches` and :mod:`.stretches_scan` blames its
device only when

* it is **persistent**: it lasts from its onset to the end of the window and
  most of its steps are slow (or the member is slow all window, against its
  peers); a stretch that came and went is an *event* with its steps, reported
  but never paged on; and
* it is **rare in this run**: no other member shows an excursion as long that
  reaches ``rarity`` times as far (:func:`largest_elsewhere`). Healthy members
  are the run's own negative controls: when one of them went as far for as long,
  the run's noise makes excursions like it, and nobody is blamed for it;

or it is **recurrent**: the same member is slow in episode after episode, far
more often than episodes falling on random members would make it
(:func:`recurrent_members`).

>>> import numpy as np
>>> values = np.zeros((4, 30)); values[1, 5:8] = 0.3; values[3, 12:15] = 0.2; values[2, 20:] = 0.3
>>> round(largest_elsewhere(values, row=2, length=10), 3)  # the second largest 3-step pause, over 10 steps
0.06
>>> shape_of(values[2], 20, 30), shape_of(values[1], 5, 8)
('persistent', 'transient')
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np

__all__ = ["RunCensus", "episodes", "largest_elsewhere", "recurrent_members", "shape_of"]

#: share of a persistent stretch's steps that must be slow (above half its effect)
_SLOW_SHARE = 0.6
#: other members that must have gone as far for as long to make a stretch ordinary in this run
_SEEN = 2


def shape_of(row: np.ndarray, start: int, stop: int) -> str:
    """``persistent`` (from ``start`` to the row's last measured step, mostly slow), ``throughout`` (the whole
    row) or ``transient`` (it ended, or too few of its steps are slow)."""
    finite = np.flatnonzero(np.isfinite(row))
    if not len(finite) or stop <= start:
        return "transient"
    if start <= finite[0] and stop > finite[-1]:
        return "throughout"
    if stop <= finite[-1]:
        return "transient"
    inside = row[start:stop]
    inside = inside[np.isfinite(inside)]
    outside = np.r_[row[:start], row[stop:]]
    outside = outside[np.isfinite(outside)]
    base = float(np.median(outside)) if len(outside) else 0.0
    effect = float(np.mean(inside)) - base if len(inside) else 0.0
    slow = np.mean(inside - base >= 0.5 * effect) if len(inside) and effect > 0 else 0.0
    return "persistent" if slow >= _SLOW_SHARE else "transient"


def _rolling_peaks(values: np.ndarray, length: int) -> np.ndarray:
    """Per row, the largest mean over ``length`` consecutive steps (NaN steps skipped; windows with fewer than
    half their steps measured are not counted); -inf for rows without such a window."""
    rows, steps = values.shape
    length = max(1, min(length, steps))
    finite = np.isfinite(values)
    sums = np.zeros((rows, steps + 1))
    counts = np.zeros((rows, steps + 1))
    sums[:, 1:] = np.cumsum(np.where(finite, values, 0.0), axis=1)
    counts[:, 1:] = np.cumsum(finite, axis=1)
    inside_sum = sums[:, length:] - sums[:, :-length]
    inside_n = counts[:, length:] - counts[:, :-length]
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(inside_n >= max(1, length // 2), inside_sum / np.maximum(inside_n, 1), -np.inf)
    return means.max(axis=1) if means.shape[1] else np.full(rows, -np.inf)


def largest_elsewhere(values: np.ndarray, row: int | np.ndarray, length: int, seen: int = _SEEN) -> float:
    """How far members of this run go for ``length`` consecutive steps: the ``seen``-th largest peak mean of the
    other rows (rows in ``row`` left out; 0 when fewer rows have such a window). The second, not the largest:
    one other member's own event (a genuine fault elsewhere) must not hide this one."""
    peaks = _rolling_peaks(values, length)
    others = np.delete(peaks, np.atleast_1d(row))
    others = np.sort(others[np.isfinite(others)])
    return max(float(others[-seen]), 0.0) if len(others) >= seen else 0.0


class RunCensus:
    """How far the members of a run go over stretches of each length (:func:`largest_elsewhere`), each length's
    peaks computed once: the localizer asks it for every candidate, and the power for every injected copy.

    >>> values = np.zeros((4, 30)); values[1, 5:8] = 0.3; values[3, 12:15] = 0.2; values[2, 20:] = 0.3
    >>> census = RunCensus(values)
    >>> census.elsewhere(2, 10) == largest_elsewhere(values, 2, 10), round(census.elsewhere(2, 10), 3)
    (True, 0.06)
    """

    def __init__(self, values: np.ndarray, seen: int = _SEEN) -> None:
        self.values = values
        self.seen = seen
        self._ranked: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def elsewhere(self, row: int, length: int) -> float:
        """The ``seen``-th largest peak mean over ``length`` steps of the rows other than ``row``, at least 0."""
        if length not in self._ranked:
            peaks = _rolling_peaks(self.values, length)
            order = np.argsort(-peaks, kind="stable")
            order = order[np.isfinite(peaks[order])][: self.seen + 1]
            self._ranked[length] = (order, peaks[order])
        rows, peaks = self._ranked[length]
        others = peaks[rows != row][: self.seen]
        return max(float(others[-1]), 0.0) if len(others) >= self.seen else 0.0


def episodes(values: np.ndarray, level: float | np.ndarray, min_length: int = 2) -> list[list[tuple[int, int]]]:
    """Per row, its episodes as (start, stop) step indices: maximal runs of at least ``min_length`` consecutive
    steps above half of ``level`` (one for all rows, or one per row) that reach ``level`` (hysteresis: noise
    inside an episode does not cut it in two).

    >>> episodes(np.array([[0.0, 0.6, 1.2, 0.6, 0.9, 0.0, 0.7, 0.0]]), level=1.0)
    [[(1, 5)]]
    """
    high = np.reshape(level, (-1, 1))
    filled = np.nan_to_num(values, nan=-np.inf)
    above = filled > 0.5 * high
    padded = np.zeros((above.shape[0], above.shape[1] + 2), dtype=np.int8)
    padded[:, 1:-1] = above
    edges = np.diff(padded, axis=1)
    out: list[list[tuple[int, int]]] = [[] for _ in range(above.shape[0])]
    for row, start in zip(*np.nonzero(edges == 1)):
        stop = int(np.flatnonzero(edges[row, start:] == -1)[0]) + int(start)
        if stop - start >= min_length and filled[row, start:stop].max() >= high[min(row, len(high) - 1), 0]:
            out[int(row)].append((int(start), stop))
    return out


def recurrent_members(
    values: np.ndarray,
    level: float | np.ndarray,
    min_episodes: int = 3,
    false_blame: float = 0.01,
    min_length: int = 2,
    partners: Callable[[], dict[int, set[int]]] | None = None,
    rarity: float = 1.5,
) -> dict[int, list[tuple[int, int]]]:
    """Rows slow in ``min_episodes`` or more separate episodes, more than chance allows: with K episodes in
    the run falling on N rows at random, a row gets k or more with probability P(Binomial(K, 1/N) >= k); a
    row is recurrent when that is at most ``false_blame / N`` (so a healthy run names one with probability at
    most ``false_blame``), K counting only the run's episodes at least 1/``rarity`` as long, or as strong, as
    the row's k (:func:`_more_than_chance`). An episode of a row that overlaps a stronger one of its ``partners`` (a
    function giving, per row, the rows at the other end of its transfers) is that one's echo, and counts for
    neither K nor the row.

    >>> values = np.zeros((16, 60)); values[3, [5, 6, 20, 21, 40, 41, 50, 51]] = 1.0; values[5, 30:32] = 1.0
    >>> sorted(recurrent_members(values, level=0.5))
    [3]
    >>> values[4] = 0.6 * values[3]  # rank 4 shares rank 3's slow transfers: its episodes are echoes
    >>> sorted(recurrent_members(values, level=0.5, partners=lambda: {3: {4}, 4: {3}}))
    [3]
    """
    found = [_merged(own, min_length + 1) for own in episodes(values, level, min_length)]
    if not any(len(own) >= min_episodes for own in found):
        return {}
    if partners is not None:  # asked only when some row may be recurrent: it costs a pass over the transfers
        found = _without_echoes(values, found, partners())
    rows = len(found)
    sizes = [_sizes(values, row, own) for row, own in enumerate(found)]
    run = (
        np.sort(np.concatenate([length for length, _ in sizes])),
        np.sort(np.concatenate([mean for _, mean in sizes])),
    )
    out = {}
    for row, own in enumerate(found):
        if len(own) >= min_episodes and _more_than_chance(
            sizes[row], run, rows, min_episodes, false_blame / rows, rarity
        ):
            out[row] = own
    return out


def _sizes(values: np.ndarray, row: int, own: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """A row's episodes' lengths and mean values."""
    lengths = np.array([stop - start for start, stop in own], dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an episode's steps are measured: only defensive
        means = np.array([np.nanmean(values[row, start:stop]) for start, stop in own], dtype=np.float64)
    return lengths, means


def _more_than_chance(
    own: tuple[np.ndarray, np.ndarray],
    run: tuple[np.ndarray, np.ndarray],
    rows: int,
    min_episodes: int,
    alpha: float,
    rarity: float,
) -> bool:
    """Whether a row's episodes are more than chance allows. Episodes are ranked by length and, apart, by mean
    value; for each ``j`` from ``min_episodes`` up, the row's ``j`` largest are set against the run's episodes
    that reach 1/``rarity`` of them (K of them): P(Binomial(K, 1/rows) >= j) at most ``alpha``, shared among
    the orders and ``j`` tried. Long or strong episodes are rarer than short, shallow ones (a GC pause lasts a
    step or two, congestion slows a NIC by a few percent), so three far longer or stronger ones on one member
    stand out of many small ones elsewhere. The margin is there because members measure the same hiccup a
    little differently (a NIC with fewer transfers averages fewer of them): three ordinary congestion
    episodes that happen to read longest and strongest on one NIC must not stand out."""
    tried = 2 * (len(own[0]) - min_episodes + 1)
    for mine, everyone in zip(own, run):
        largest = np.sort(mine)[::-1]
        for j in range(min_episodes, len(largest) + 1):
            at_least = len(everyone) - int(np.searchsorted(everyone, largest[j - 1] / rarity))
            if binomial_tail(j, at_least, 1.0 / max(rows, 2)) <= alpha / tried:
                return True
    return False


def _merged(found: list[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    """Episodes less than ``gap`` steps apart joined: one slow stretch with a dip is one episode, not several."""
    out: list[tuple[int, int]] = []
    for start, stop in found:
        if out and start - out[-1][1] < gap:
            out[-1] = (out[-1][0], stop)
        else:
            out.append((start, stop))
    return out


def _without_echoes(
    values: np.ndarray, found: list[list[tuple[int, int]]], partners: dict[int, set[int]]
) -> list[list[tuple[int, int]]]:
    """Episodes kept strongest first; one that overlaps a kept episode of a partner row is dropped."""
    ranked = sorted(
        ((float(np.nanmean(values[row, a:b])), row, a, b) for row, own in enumerate(found) for a, b in own),
        reverse=True,
    )
    kept: list[list[tuple[int, int]]] = [[] for _ in found]
    for _, row, a, b in ranked:
        if any(a < stop and start < b for other in partners.get(row, ()) for start, stop in kept[other]):
            continue
        kept[row].append((a, b))
    return [sorted(own) for own in kept]


def binomial_tail(successes: int, trials: int, p: float) -> float:
    """P(X >= successes) for X ~ Binomial(trials, p).

    >>> round(binomial_tail(3, 3, 0.5), 3)
    0.125
    >>> round(binomial_tail(760, 1500, 0.5), 3)  # C(1500, 750) is past a float: each term is taken in logs
    0.312
    """
    if successes <= 0:
        return 1.0
    if successes > trials or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    if trials > 2000:  # a normal approximation with continuity correction; exact sums get slow
        mean, sd = trials * p, math.sqrt(trials * p * (1 - p))
        return 0.5 * math.erfc((successes - 0.5 - mean) / (sd * math.sqrt(2))) if sd > 0 else float(successes <= mean)
    log_p, log_q, log_n = math.log(p), math.log1p(-p), math.lgamma(trials + 1)
    return min(
        1.0,
        sum(
            math.exp(log_n - math.lgamma(k + 1) - math.lgamma(trials - k + 1) + k * log_p + (trials - k) * log_q)
            for k in range(successes, trials + 1)
        ),
    )
