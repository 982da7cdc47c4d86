"""Integer codes and grouped reductions over millions of rows, in numpy: what :mod:`.timings` is computed with.

Ranks, steps, groups and transfer classes become small integer codes (32-bit
where they fit); medians, extents and positions are taken per code. Each
function has a shortcut for the shapes large jobs have (values filling their
range, rows already in order, few keys) that gives what the general computation
gives (tests/localize/test_timing_shortcuts.py holds each to it).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = [
    "combined",
    "covered",
    "extent",
    "group_median",
    "index_type",
    "key_codes",
    "median_by",
    "positions",
    "small_codes",
    "sorted_codes",
    "text_codes",
]


def small_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes of non-negative integers (ranks, steps, codes) in sorted order of the distinct values (32-bit where
    they fit: half the memory of millions of rows): counted and looked up in a table when their range is small,
    else hashed. Values that are their own codes (0, 1, 2, ... all present) are returned as they are when of
    the codes' type: not to be changed in place."""
    if len(values) and 0 <= values.min() and values.max() < 50_000_000:
        distinct = np.flatnonzero(np.bincount(values))
    else:
        distinct = np.sort(pd.unique(values))
    kind = index_type(len(distinct))
    if len(distinct) and distinct[-1] == len(distinct) - 1:  # 0 to n - 1, every one present
        return values.astype(kind, copy=False), distinct
    if len(distinct) and distinct[-1] < 50_000_000:
        table = np.zeros(int(distinct[-1]) + 1, dtype=kind)
        table[distinct] = np.arange(len(distinct))
        return table[values], distinct
    return np.searchsorted(distinct, values).astype(kind), distinct


def index_type(count: int) -> type[np.signedinteger]:
    """The integer type of indices below ``count``: 32 bits where they fit. Arithmetic that can go past
    ``count`` (a rank's code times the steps) widens to 64 bits first."""
    return np.int32 if count <= np.iinfo(np.int32).max else np.int64


def text_codes(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """A text column as codes into its distinct values, as ``str`` (-1 where missing): a categorical's own
    codes (only its categories are converted), else the values hashed once."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        codes, names = column.cat.codes.to_numpy(), column.cat.categories
    else:
        codes, names = pd.factorize(column)
    return codes, np.asarray(pd.Index(names).astype(str), dtype=object)


def sorted_codes(codes: np.ndarray, names: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``codes`` (non-negative) renumbered by the sorted order of the names they use, and those names: what
    ``pd.factorize(names[codes], sort=True)`` gives, without hashing the rows."""
    used = np.flatnonzero(np.bincount(codes, minlength=len(names)))
    distinct, inverse = np.unique(names[used], return_inverse=True)
    table = np.zeros(len(names), dtype=index_type(len(names)))
    table[used] = inverse
    return table[codes], distinct


def covered(cell: np.ndarray, start: np.ndarray, duration: np.ndarray, n_cells: int) -> np.ndarray:
    """Per cell, the time covered by at least one of its intervals (overlapping sends and receives once)."""
    order = np.lexsort((start, cell))
    cell, begin, end = cell[order], start[order], (start + duration)[order]
    reach = pd.Series(end).groupby(cell).cummax().to_numpy()  # the furthest end so far in the cell
    before = np.r_[-np.inf, reach[:-1]]
    before[np.r_[True, cell[1:] != cell[:-1]]] = -np.inf  # nothing before the first interval of a cell
    added = np.maximum(end - np.maximum(begin, before), 0.0)
    return np.bincount(cell, weights=added, minlength=n_cells)


def key_codes(key: np.ndarray, limit: int) -> np.ndarray:
    """Per key (non-negative, below ``limit``): its number among the distinct keys in sorted order. Keys that
    fill much of their range (a group's sequence numbers one after another) are looked up in a table of the
    range, several times faster than hashing them; sparse ones are hashed and sorted.

    >>> key_codes(np.array([40, 7, 40, 12]), 50)
    array([2, 0, 2, 1])
    """
    if limit <= 4 * len(key):
        present = np.zeros(limit, dtype=bool)
        present[key] = True
        number = np.cumsum(present, dtype=index_type(limit))
        number -= 1
        return number[key]
    return pd.factorize(key, sort=True)[0]


def group_median(values: np.ndarray, first: np.ndarray, *more: np.ndarray) -> np.ndarray:
    """Per value, the median of the values with the same keys (non-negative integers), combined into one."""
    key = combined(None, first)
    for column in more:
        key = combined(key, column)
    return median_by(values, key)


def combined(key: np.ndarray | None, column: np.ndarray) -> np.ndarray:
    """One number per distinct (``key``, ``column``) pair of non-negative integers (``column`` alone without a
    key): a new array, or ``key`` changed in place. The key is renumbered first when the product would
    overflow."""
    if key is None:
        return column.astype(np.int64)
    size = int(column.max(initial=0)) + 1
    if int(key.max(initial=0)) >= np.iinfo(np.int64).max // size:
        key = pd.factorize(key)[0].astype(np.int64, copy=False)
    key *= size
    key += column
    return key


def median_by(values: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Per value, the median of the values with the same ``key``.

    Few keys (the transfer classes: a thousand over millions of instances) are sorted by and each group's
    median taken from its slice, holding a third of what grouping by the keys holds; many keys, or values
    with NaN (the median skips them), are grouped.

    >>> median_by(np.array([1.0, 5.0, 2.0, 4.0, 9.0]), np.array([7, 3, 7, 3, 7]))
    array([2. , 4.5, 2. , 4.5, 2. ])
    """
    codes, uniques = pd.factorize(key)
    if len(uniques) > len(values) // 64 or np.isnan(values).any():
        return pd.Series(values).groupby(codes, sort=False).transform("median").to_numpy()
    # 16-bit codes where they fit: numpy sorts them by radix, several times faster
    codes = codes.astype(np.int16 if len(uniques) <= np.iinfo(np.int16).max else index_type(len(uniques)))
    order = np.argsort(codes, kind="stable")
    ordered = values[order]
    del order
    ends = np.cumsum(np.bincount(codes, minlength=len(uniques)))
    medians = np.array([np.median(part, overwrite_input=True) for part in np.split(ordered, ends[:-1])])
    return medians[codes]


def positions(group: np.ndarray, step: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """Per instance: its position among its group's instances in its step, by sequence number.

    A group numbers its collectives one after another, so a step's instances of a group mostly have consecutive
    sequence numbers: then the position is the sequence number less the step's first, without sorting.

    >>> positions(np.array([0, 0, 1, 0, 1]), np.array([0, 0, 0, 1, 0]), np.array([5, 4, 9, 6, 7]))
    array([1, 0, 1, 0, 0])
    """
    n = len(group)
    cell = combined(combined(None, group), step)
    cells = int(cell.max(initial=0)) + 1
    if cells <= 4 * n:  # a table per cell, no larger than the instances' own arrays
        cell = cell.astype(index_type(cells))
        lowest = np.full(cells, np.iinfo(seq.dtype).max, dtype=seq.dtype)
        highest = np.full(cells, np.iinfo(seq.dtype).min, dtype=seq.dtype)
        np.minimum.at(lowest, cell, seq)
        np.maximum.at(highest, cell, seq)
        counts = np.bincount(cell, minlength=cells)
        used = counts > 0
        if np.array_equal(highest[used].astype(np.int64) - lowest[used] + 1, counts[used]):  # no gaps
            return (seq - lowest[cell]).astype(np.int64)
    del cell
    order = np.lexsort((seq, step, group))
    group, step = group[order], step[order]
    boundary = np.r_[True, (group[1:] != group[:-1]) | (step[1:] != step[:-1])]
    del group, step
    starts = np.maximum.accumulate(np.where(boundary, np.arange(n), 0))
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n) - starts
    return position


def extent(index: np.ndarray, values: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per index below ``n``: the smallest and the largest of its ``values`` (integers), in arrays of the values'
    own type: ``ufunc.at`` is many times slower when it has to convert them."""
    low = np.full(n, np.iinfo(values.dtype).max, dtype=values.dtype)
    high = np.full(n, -1, dtype=values.dtype)
    np.minimum.at(low, index, values)
    np.maximum.at(high, index, values)
    return low, high
