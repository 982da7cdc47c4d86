"""A flush's records column by column: one pass over the record tuples, the numbers as arrays.

The flush thread reads each record's op, group, seq, start, duration, bytes and
``is_async`` (the record layout is in :mod:`~trainhealth._internal.exporters.collectives.recorder`).
Reading each field once, for the hang watcher, the step accounting and the
aggregation together, keeps the flush's cost per record small: on one core it adds
to every collective's cost.

>>> records = [(0, "all_reduce", "pg:0", 1, 10.0, 0.5, 64, None, False),
...            (0, "step", None, None, 9.0, 2.0, None, None, False)]
>>> columns = RecordColumns.of(records)
>>> columns.ops, columns.ends.tolist(), columns.sizes.tolist()
(('all_reduce', 'step'), [10.5, 11.0], [64, 0])
>>> columns.select(columns.seqs == 1).groups
('pg:0',)
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress
from typing import NamedTuple

import numpy as np

__all__ = ["RecordColumns"]


class RecordColumns(NamedTuple):
    """Records as columns; ``seqs`` is NaN and ``sizes`` 0 where a record has none (a step marker)."""

    ops: tuple[str, ...]
    groups: tuple[str | None, ...]
    seqs: np.ndarray
    starts: np.ndarray
    durations: np.ndarray
    sizes: np.ndarray
    is_async: np.ndarray

    @classmethod
    def of(cls, records: Sequence[tuple]) -> RecordColumns:
        """The columns of ``records`` (at least one)."""
        _, ops, groups, seqs, starts, durations, sizes, _, is_async = zip(*records)
        return cls(
            ops,
            groups,
            np.array(seqs, np.float64),
            np.array(starts, np.float64),
            np.array(durations, np.float64),
            np.nan_to_num(np.array(sizes, np.float64), nan=0.0).astype(np.int64),
            np.array(is_async, bool),
        )

    @property
    def ends(self) -> np.ndarray:
        return self.starts + self.durations

    def select(self, keep: np.ndarray) -> RecordColumns:
        """The rows where ``keep`` (a boolean array) is true."""
        return RecordColumns(
            tuple(compress(self.ops, keep)),
            tuple(compress(self.groups, keep)),
            self.seqs[keep],
            self.starts[keep],
            self.durations[keep],
            self.sizes[keep],
            self.is_async[keep],
        )
