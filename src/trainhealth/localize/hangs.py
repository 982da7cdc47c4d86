"""Hung collectives: which rank the others are waiting for.

Each rank exports, per process group, the sequence number of the last
collective it entered (``trainhealth_comm_started_seq``) and completed
(``trainhealth_comm_completed_seq``), and how long it has been waiting in the
current one (``trainhealth_comm_inflight_duration_seconds``). In a hang, the
group's ranks sit in collective S while a lagging rank has not entered it: its
started sequence number is below S, or it reports nothing at all. When every
member has entered S, the ranks wait on each other inside it and the
communication path is the suspect.

>>> states = [RankCommState(0, "dp", 7, 6, "all_reduce", 42.0), RankCommState(1, "dp", 7, 6, "all_reduce", 41.5),
...           RankCommState(2, "dp", 6, 6, "", 0.0)]
>>> [(h.group, h.seq, h.lagging_ranks, h.waiting_ranks) for h in find_hangs(states, min_wait_s=30)]
[('dp', 7, (2,), (0, 1))]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["HangSuspect", "RankCommState", "find_hangs", "states_from_samples"]


@dataclass(frozen=True)
class RankCommState:
    """One rank's position in one group, as its exporter reports it."""

    rank: int
    group: str
    started_seq: int
    completed_seq: int
    inflight_op: str
    inflight_s: float


@dataclass(frozen=True)
class HangSuspect:
    """A group whose ranks wait in collective ``seq`` for ``waited_s``; ``lagging_ranks`` never entered it.

    ``lagging_at`` maps each lagging rank to the last sequence number it entered
    (-1: none; missing ranks, which report nothing, are absent from it).
    """

    group: str
    seq: int
    op: str
    waiting_ranks: tuple[int, ...]
    lagging_ranks: tuple[int, ...]
    lagging_at: Mapping[int, int]
    waited_s: float

    @property
    def verdict(self) -> str:
        if self.lagging_ranks:
            return f"ranks {', '.join(map(str, self.lagging_ranks))} never entered {self.op} #{self.seq}"
        return f"every member entered {self.op} #{self.seq}: the communication path is stuck"


def find_hangs(states: Iterable[RankCommState], *, min_wait_s: float = 60.0,
               members: Mapping[str, Sequence[int]] | None = None) -> list[HangSuspect]:
    """Groups in which some rank has waited at least ``min_wait_s`` in a collective, and who is behind.

    ``members`` (from a topology) lets ranks that report nothing at all count as lagging.
    """
    by_group: dict[str, list[RankCommState]] = {}
    for state in states:
        by_group.setdefault(state.group, []).append(state)
    hangs = []
    for group, group_states in sorted(by_group.items()):
        waiting = [s for s in group_states if s.started_seq > s.completed_seq and s.inflight_s >= min_wait_s]
        if not waiting:
            continue
        seq = max(s.started_seq for s in waiting)
        op = next(s.inflight_op for s in waiting if s.started_seq == seq)
        behind = {s.rank: s.started_seq for s in group_states if s.started_seq < seq}
        reporting = {s.rank for s in group_states}
        missing = [rank for rank in (members or {}).get(group, ()) if rank not in reporting]
        hangs.append(HangSuspect(
            group=group, seq=seq, op=op,
            waiting_ranks=tuple(sorted(s.rank for s in waiting if s.started_seq == seq)),
            lagging_ranks=tuple(sorted([*behind, *missing])),
            lagging_at=dict(sorted(behind.items())),
            waited_s=max(s.inflight_s for s in waiting),
        ))
    return hangs


def states_from_samples(samples: Iterable[tuple[str, Mapping[str, str], float]]) -> list[RankCommState]:
    """Rebuild per-rank states from scraped samples ``(metric name, labels, value)`` of any number of ranks."""
    started: dict[tuple[int, str], int] = {}
    completed: dict[tuple[int, str], int] = {}
    inflight: dict[tuple[int, str], tuple[str, float]] = {}
    for name, labels, value in samples:
        if "rank" not in labels or "group" not in labels or labels["rank"] == "":
            continue
        key = (int(labels["rank"]), labels["group"])
        if name == "trainhealth_comm_started_seq":
            started[key] = int(value)
        elif name == "trainhealth_comm_completed_seq":
            completed[key] = int(value)
        elif name == "trainhealth_comm_inflight_duration_seconds" and value > inflight.get(key, ("", -1.0))[1]:
            inflight[key] = (labels.get("op", ""), float(value))
    return [
        RankCommState(rank, group, seq, completed.get((rank, group), -1), *inflight.get((rank, group), ("", 0.0)))
        for (rank, group), seq in sorted(started.items())
    ]
