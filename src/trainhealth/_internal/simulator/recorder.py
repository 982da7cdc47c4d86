"""The simulator's record keeping: records collected as numpy chunks, group names interned, one trace frame.

A collective group's members are laid out as a (dp, cp, tp) array per pipeline stage;
:func:`group_view` puts one group's members on the last axis.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from trainhealth._internal.simulator.cluster import ClusterLayout

__all__ = ["GroupNames", "Recorder", "group_view"]

_OPS = ("forward", "backward", "optimizer", "all_reduce", "all_gather", "all_to_all", "send", "recv")
_OP = {name: code for code, name in enumerate(_OPS)}


class Recorder:
    """Collects records as numpy chunks; groups are interned to integer codes."""

    def __init__(self) -> None:
        self.chunks: list[tuple[np.ndarray, ...]] = []
        self.groups: list[str] = []
        self._group_codes: dict[str, int] = {}
        self._seq = np.empty(0, dtype=np.int64)  # per group code: its last instance

    def group(self, name: str) -> int:
        code = self._group_codes.get(name)
        if code is None:
            code = self._group_codes[name] = len(self.groups)
            self.groups.append(name)
        return code

    def next_seq(self, codes: np.ndarray) -> np.ndarray:
        """One new instance for each group code (numbered per group; each code at most once per call)."""
        if len(self._seq) < len(self.groups):
            self._seq = np.concatenate([self._seq, np.full(len(self.groups) - len(self._seq), -1, dtype=np.int64)])
        self._seq[codes] += 1
        return self._seq[codes].copy()

    def add(
        self,
        ranks: np.ndarray,
        step: int,
        op: str,
        start: np.ndarray,
        duration: np.ndarray,
        group: np.ndarray | None = None,
        seq: np.ndarray | None = None,
        nbytes: int = 0,
        peer: np.ndarray | None = None,
    ) -> None:
        n = ranks.size
        self.chunks.append(
            (
                ranks.reshape(-1).astype(np.int32),
                np.full(n, step, dtype=np.int32),
                np.full(n, _OP[op], dtype=np.int8),
                (group.reshape(-1) if group is not None else np.full(n, -1)).astype(np.int32),
                (seq.reshape(-1) if seq is not None else np.full(n, -1)).astype(np.int64),
                np.broadcast_to(start, ranks.shape).reshape(-1).astype(np.float64),
                np.broadcast_to(duration, ranks.shape).reshape(-1).astype(np.float64),
                np.full(n, nbytes, dtype=np.int64),
                (peer.reshape(-1) if peer is not None else np.full(n, -1)).astype(np.int32),
            )
        )

    def frame(self, layout: ClusterLayout) -> pd.DataFrame:
        """Every record as one trace frame, sorted by rank and start (stably); the chunks are released."""
        columns = []
        for position in range(len(self.chunks[0])):  # one column at a time: at most one column is held twice
            columns.append(np.concatenate([chunk[position] for chunk in self.chunks]))
        self.chunks = []
        order = np.lexsort((columns[5], columns[0]))
        rank, step, op, group, seq, start, duration, nbytes, peer = (column[order] for column in columns)
        del columns, order
        hosts = [layout.host_name(h) for h in range(int(layout.host_of(layout.world - 1)) + 1)]
        frame = pd.DataFrame(
            {
                "rank": rank.astype(np.int64),
                "step": step.astype(np.int64),
                "op": pd.Categorical.from_codes(op, categories=list(_OPS)),
                "group": pd.Categorical.from_codes(group, categories=self.groups),
                "seq": pd.arrays.IntegerArray(np.where(seq >= 0, seq, 0), seq < 0),
                "start": start,
                "duration": duration,
                "bytes": pd.arrays.IntegerArray(nbytes, np.zeros(len(nbytes), dtype=bool)),
                "host": pd.Categorical.from_codes((rank // layout.gpus_per_host).astype(np.int64), categories=hosts),
                "gpu": (rank % layout.gpus_per_host).astype(np.int64),
                "peer": pd.arrays.IntegerArray(np.where(peer >= 0, peer, 0).astype(np.int64), peer < 0),
            }
        )
        frame["simulated"] = True
        return frame


class GroupNames:
    """Group ids per axis and stage as a (dp, cp, tp) array of interned codes."""

    def __init__(self, layout: ClusterLayout, recorder: Recorder) -> None:
        self._layout, self._recorder = layout, recorder
        self._cache: dict[tuple[str, int], np.ndarray] = {}

    def codes(self, axis: str, stage: int, other: int | None = None) -> np.ndarray:
        key = (axis, stage if other is None else stage * 100_000 + other)
        found = self._cache.get(key)
        if found is not None:
            return found
        layout = self._layout
        d, c, t = np.meshgrid(np.arange(layout.dp), np.arange(layout.cp), np.arange(layout.tp), indexing="ij")
        if axis == "tp":
            names = [f"tp-d{a}-c{b}-s{stage}" for a, b, _ in zip(d.ravel(), c.ravel(), t.ravel())]
        elif axis == "cp":
            names = [f"cp-d{a}-t{x}-s{stage}" for a, _, x in zip(d.ravel(), c.ravel(), t.ravel())]
        elif axis == "ep":
            names = [f"ep-b{a // layout.ep}-c{b}-t{x}-s{stage}" for a, b, x in zip(d.ravel(), c.ravel(), t.ravel())]
        elif axis == "dp":
            names = [f"dp-c{b}-t{x}-s{stage}" for _, b, x in zip(d.ravel(), c.ravel(), t.ravel())]
        else:  # pipeline link between stage and other
            low, high = min(stage, other), max(stage, other)  # type: ignore[type-var]
            names = [f"pp-d{a}-c{b}-t{x}-s{low}-{high}" for a, b, x in zip(d.ravel(), c.ravel(), t.ravel())]
        found = np.array([self._recorder.group(name) for name in names]).reshape(d.shape)
        self._cache[key] = found
        return found


def group_view(
    values: np.ndarray, axis: str, layout: ClusterLayout
) -> tuple[np.ndarray, Callable[[np.ndarray], np.ndarray]]:
    """``values`` (dp, cp, tp) rearranged with the group's members on the last axis, and the inverse."""
    dp, cp, tp = values.shape
    if axis == "tp":
        return values, lambda grouped: grouped
    if axis == "cp":
        moved = values.transpose(0, 2, 1)
        return moved, lambda grouped: grouped.transpose(0, 2, 1)
    if axis == "dp":
        moved = values.transpose(1, 2, 0)
        return moved, lambda grouped: grouped.transpose(2, 0, 1)
    blocks = values.reshape(dp // layout.ep, layout.ep, cp, tp).transpose(0, 2, 3, 1)  # ep
    return blocks, lambda grouped: grouped.transpose(0, 3, 1, 2).reshape(dp, cp, tp)
