"""The compute timings' medians when every rank ran the same operations in every step: one dense array.

A job's ranks mostly run the same forwards and backwards each step, so the
operations sorted by rank, step, operation and time form an array of shape
(ranks, steps, slots), a slot being the k-th run of an operation in a step.
Each median the compute timings take (over a rank's peers, over its own
steps, over its replica) is then a median along one axis of that array: the
same values as grouping the rows by their keys, found by partitioning
contiguous blocks instead of hashing millions of keys.

>>> import numpy as np
>>> rank_step = np.repeat(np.arange(4), 2)  # 2 ranks x 2 steps, 2 operations each
>>> grid_slots(rank_step, np.tile([0, 1], 4), np.zeros(8, dtype=int), 4)
2
>>> grid_slots(rank_step[:-1], np.tile([0, 1], 4)[:-1], np.zeros(7, dtype=int), 4) is None  # one missing
True
"""

from __future__ import annotations

import numpy as np

__all__ = ["grid_slots", "median_along", "median_over_rank_groups", "versus_peers_and_own"]

#: up to this many values per median, sorting every lane at once beats partitioning each (np.median)
_SORTED_MEDIAN_MAX = 1024


def grid_slots(rank_step: np.ndarray, op_code: np.ndarray, position: np.ndarray, n_cells: int) -> int | None:
    """The operations per (rank, step) cell when every cell has the same ones in the same order, the rows
    sorted by cell, operation and position (the rows are then a (cells, slots) array); None otherwise."""
    n = len(rank_step)
    if n_cells == 0 or n == 0 or n % n_cells:
        return None
    slots = n // n_cells
    if not (rank_step.reshape(n_cells, slots) == np.arange(n_cells)[:, None]).all():
        return None
    for column in (op_code, position):
        if not (column.reshape(n_cells, slots) == column[:slots]).all():
            return None
    return slots


def median_along(values: np.ndarray, axis: int) -> np.ndarray:
    """``np.median(values, axis=axis)``, the same numbers: for the short axes of these arrays (a step's 16
    operations, a group's 128 ranks, 20 steps) every lane is sorted at once, several times faster than
    np.median's partition of each lane.

    >>> median_along(np.array([[3.0, 1.0, 2.0, 8.0], [5.0, 4.0, 6.0, 7.0]]), axis=1)
    array([2.5, 5.5])
    """
    n = values.shape[axis]
    if n == 0 or n > _SORTED_MEDIAN_MAX:
        return np.median(values, axis=axis)
    if n <= 2:  # nothing to sort: the mean of the one or two values, as np.median takes it
        low, high = np.take(values, 0, axis=axis), np.take(values, n - 1, axis=axis)
    else:
        ordered = np.sort(values, axis=axis)
        low, high = np.take(ordered, (n - 1) // 2, axis=axis), np.take(ordered, n // 2, axis=axis)
    return (low + high) / 2


def median_over_rank_groups(values: np.ndarray, group_of: np.ndarray) -> np.ndarray:
    """Per rank (the first axis of ``values``), the median over the ranks of its group, element by element.

    >>> values = np.array([[1.0, 10.0], [3.0, 30.0], [2.0, 20.0], [7.0, 70.0]])
    >>> median_over_rank_groups(values, np.array([0, 0, 1, 0]))
    array([[ 3., 30.],
           [ 3., 30.],
           [ 2., 20.],
           [ 3., 30.]])
    """
    out = np.empty_like(values)
    size_of = np.bincount(group_of)[group_of]
    for size in np.unique(size_of):
        ranks = np.flatnonzero(size_of == size)
        members = ranks[np.argsort(group_of[ranks], kind="stable")].reshape(-1, size)  # a group per row
        out[members] = median_along(values[members], axis=1)[:, None]
    return out


def versus_peers_and_own(
    log_duration: np.ndarray, peer_of: np.ndarray, replica_of: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each operation's log duration (ranks, steps, slots) minus its peers' median in the step, and minus the
    rank's own median over the steps less what its replica shares (the median of that change over a replica of
    three or more ranks, else over every rank): the compute timings' two comparisons."""
    versus_peers = log_duration - median_over_rank_groups(log_duration, peer_of)
    own = log_duration - median_along(log_duration, axis=1)[:, None, :]
    large = np.bincount(replica_of)[replica_of] >= 3  # a median of two would split a fault
    if large.all():
        common = median_over_rank_groups(own, replica_of)
    else:
        common = np.broadcast_to(np.median(own, axis=0), own.shape).copy()
        if large.any():
            common[large] = median_over_rank_groups(own[large], replica_of[large])
    own -= common
    return versus_peers, own
