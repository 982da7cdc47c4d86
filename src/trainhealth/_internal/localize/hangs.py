"""Hung collectives: which rank the others are waiting for, where it is, and a rank that is gone.

Each rank exports, per process group, the sequence number of the last
collective it entered (``trainhealth_comm_started_seq``) and completed
(``trainhealth_comm_completed_seq``), how long it has been waiting in the
current one (``trainhealth_comm_inflight_duration_seconds``), its place in the
group (``trainhealth_comm_group_member_info``: its group rank and the group's
size, a few bytes whatever the group's size), its own hang threshold, whether
the loop announced a pause, and where its training thread is when it is stuck
(:mod:`trainhealth._internal.exporters.collectives.watch`). In a hang, the group's ranks
sit in collective S while a lagging rank has not entered it: its started
sequence number is below S, or it reports nothing at all (gone: its last
numbers are what Prometheus last scraped); members at S inside different
collectives are a mismatch. A collective that every member has entered (none
behind, none missing, none elsewhere) and that is still running is a **slow
collective**, not a hang (a large all-gather at start-up, a slow link): it is
reported (:attr:`HangReport.slow`), never a ``hang`` verdict, and names no suspect.

A group's members are the ranks whose membership series exist now or did in the
last minutes; a position of the group that none holds is a member that never
reported (or stopped long ago). Its global rank follows from the others' where
they lie one stride apart (:func:`group_members`: DeviceMesh and ``new_group``
make the world, tensor-, data- and pipeline-parallel groups so); elsewhere only
its group rank is known (:attr:`HangSuspect.missing_group_ranks`).

A group hangs when a member has waited longer than the job's hang threshold (the
largest its ranks export: a few times their own step, at least 10 s); never
while a rank is in an announced pause. Positions are judged per job: one
Prometheus holds many jobs, and ranks of two jobs share ranks and group names
(:func:`positions_by_job`).

>>> states = [RankCommState(0, "dp", 7, 6, "all_reduce", 42.0), RankCommState(1, "dp", 7, 6, "all_reduce", 41.5),
...           RankCommState(2, "dp", 6, 6, "", 0.0)]
>>> [(h.group, h.seq, h.lagging_ranks, h.waiting_ranks) for h in find_hangs(states, min_wait_s=30)]
[('dp', 7, (2,), (0, 1))]
>>> report = judge_hangs(Positions(tuple(states[:2]), members={"dp": (0, 1, 2)}, watch={0: RankWatch(15.0)},
...                                gone={2: GoneRank(2, 1_700_000_000.0, {"dp": 6})}))
>>> print(report.hangs[0].verdict)
rank 2 missing since 22:13:20 UTC (last at #6 of dp); ranks 0, 1 waiting 42 s in all_reduce #7
>>> entered = judge_hangs(Positions(tuple(states[:2]), members={"dp": (0, 1)}, watch={0: RankWatch(15.0)}))
>>> entered.hangs, [h.verdict for h in entered.slow]
((), ['every member entered all_reduce #7 and it is still running: a slow collective, not a hang; ranks 0, 1 waiting 42 s in all_reduce #7'])
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from trainhealth._internal.knowledge.advice import advice_for
from trainhealth._internal.knowledge.limits import HUNG_COLLECTIVE_S
from trainhealth._internal.localize.result import LocalizationResult, Suspect

__all__ = [
    "DEFAULT_THRESHOLD_S",
    "GoneRank",
    "HangReport",
    "HangSuspect",
    "Positions",
    "RankCommState",
    "RankWatch",
    "find_hangs",
    "group_members",
    "hang_result",
    "judge_hangs",
    "positions_by_job",
    "positions_from_records",
    "positions_from_samples",
    "states_from_samples",
]

#: the hang threshold for ranks that export none (older versions): the rules' and the watcher's start-up value
DEFAULT_THRESHOLD_S = float(HUNG_COLLECTIVE_S)


@dataclass(frozen=True)
class RankCommState:
    """One rank's position in one group, as its exporter reports it."""

    rank: int
    group: str
    started_seq: int
    completed_seq: int
    inflight_op: str
    inflight_s: float
    inflight_bytes: int | None = None  # the size of the collective in flight, where known (Flight Recorder)


@dataclass(frozen=True)
class RankWatch:
    """What a rank's hang watcher exports: its threshold, the pauses it is in, where it is stuck."""

    threshold_s: float | None = None
    paused: tuple[str, ...] = ()
    stuck: str | None = None  # e.g. "outside collectives for 41 s at worker.py:load_batch:52 < worker.py:run:90"


@dataclass(frozen=True)
class GoneRank:
    """A rank that stopped reporting: when it was last seen (unix time) and its last sequence number per group."""

    rank: int
    last_seen: float | None
    last_seq: Mapping[str, int] = field(default_factory=dict)

    def text(self, group: str) -> str:
        since = (
            f" since {time.strftime('%H:%M:%S', time.gmtime(self.last_seen))} UTC" if self.last_seen is not None else ""
        )
        seq = self.last_seq.get(group)
        return f"rank {self.rank} missing{since}" + (f" (last at #{seq} of {group})" if seq is not None else "")


@dataclass(frozen=True)
class Positions:
    """Every rank's position: the live ranks' states, who should be in each group (``members``, global ranks;
    ``unplaced``, the group ranks of members whose global rank is unknown), the watchers, the gone."""

    states: tuple[RankCommState, ...]
    members: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    watch: Mapping[int, RankWatch] = field(default_factory=dict)
    gone: Mapping[int, GoneRank] = field(default_factory=dict)
    unplaced: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class HangSuspect:
    """A group whose ranks wait in collective ``seq`` for ``waited_s``; ``lagging_ranks`` never entered it.

    ``lagging_at`` maps each live lagging rank to the last sequence number it entered
    (-1: none); ``missing`` are members that report nothing (gone, where known);
    ``missing_group_ranks`` the group ranks of members that report nothing and whose global rank is unknown;
    ``mismatch`` maps members at ``seq`` inside another collective to it;
    ``doing`` says where each lagging rank is.
    """

    group: str
    seq: int
    op: str
    waiting_ranks: tuple[int, ...]
    lagging_ranks: tuple[int, ...]
    lagging_at: Mapping[int, int]
    waited_s: float
    missing: tuple[GoneRank, ...] = ()
    mismatch: Mapping[int, str] = field(default_factory=dict)
    doing: Mapping[int, str] = field(default_factory=dict)
    missing_group_ranks: tuple[int, ...] = ()

    @property
    def waiting(self) -> str:
        """``ranks 0, 1 waiting 42 s in all_reduce #7``."""
        who = f"rank {self.waiting_ranks[0]}" if len(self.waiting_ranks) == 1 else f"ranks {_ranks(self.waiting_ranks)}"
        return f"{who} waiting {self.waited_s:.0f} s in {self.op} #{self.seq}"

    @property
    def verdict(self) -> str:
        waiting = self.waiting
        parts = [gone.text(self.group) for gone in self.missing]
        if self.missing_group_ranks:
            which = "rank" if len(self.missing_group_ranks) == 1 else "ranks"
            parts.append(
                f"group {which} {_ranks(self.missing_group_ranks)} of {self.group} missing (never reported; the "
                f"global {which} unknown)"
            )
        live = [r for r in self.lagging_ranks if r not in {g.rank for g in self.missing}]
        parts += [
            f"rank {r} never entered it ({self.doing.get(r) or f'last entered #{self.lagging_at.get(r, -1)}'})"
            for r in live
        ]
        if self.mismatch:
            parts.append(
                "mismatch: " + ", ".join(f"rank {r} is in {op} #{self.seq}" for r, op in self.mismatch.items())
            )
        if not parts:
            return f"every member entered {self.op} #{self.seq} and it is still running: a slow collective, not a hang; {waiting}"
        return "; ".join(parts + [waiting])

    @property
    def is_hang(self) -> bool:
        """Whether a member holds the others: behind, missing or inside another collective. A collective every
        member entered is slow, not hung."""
        return bool(self.lagging_ranks or self.mismatch or self.missing_group_ranks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "seq": self.seq,
            "op": self.op,
            "waiting_ranks": list(self.waiting_ranks),
            "lagging_ranks": list(self.lagging_ranks),
            "waited_s": round(self.waited_s, 1),
            "missing": [
                {"rank": g.rank, "last_seen": g.last_seen, "last_seq": g.last_seq.get(self.group)} for g in self.missing
            ],
            "missing_group_ranks": list(self.missing_group_ranks),
            "mismatch": {str(r): op for r, op in self.mismatch.items()},
            "doing": {str(r): text for r, text in self.doing.items()},
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class HangReport:
    """The hangs of a job, the threshold that judged them, the announced pauses that held a verdict back, and
    the slow collectives: waits past the threshold in a collective every member entered, which are no hang."""

    hangs: tuple[HangSuspect, ...]
    threshold_s: float
    paused: tuple[str, ...] = ()  # "rank 0: checkpoint"
    slow: tuple[HangSuspect, ...] = ()

    @property
    def culprits(self) -> tuple[int, ...]:
        """The ranks to look at first: in the largest hung group, a member inside another collective (or the same
        one with another size: a bug in the program, and with gloo the peer that received it aborts, so it
        explains a rank gone too), then the gone ranks, then those behind."""
        if not self.hangs:
            return ()
        main = self.hangs[0]
        gone = [g.rank for g in main.missing]
        return tuple(list(main.mismatch) + gone + [r for r in main.lagging_ranks if r not in gone])


def find_hangs(
    states: Iterable[RankCommState],
    *,
    min_wait_s: float = DEFAULT_THRESHOLD_S,
    members: Mapping[str, Sequence[int]] | None = None,
    gone: Mapping[int, GoneRank] | None = None,
    watch: Mapping[int, RankWatch] | None = None,
    unplaced: Mapping[str, Sequence[int]] | None = None,
) -> list[HangSuspect]:
    """Groups in which some rank has waited at least ``min_wait_s`` in a collective, and who is behind,
    largest group first; those no member holds (:attr:`HangSuspect.is_hang` false) are slow collectives.

    ``members`` (from the ranks' ``trainhealth_comm_group_member_info``, or a topology) lets ranks that report
    nothing count as lagging; ``gone`` says when they were last seen; ``watch`` where the live ones are;
    ``unplaced`` the group ranks of members that report nothing and whose global rank is unknown.
    """
    states = list(states)
    by_group: dict[str, list[RankCommState]] = {}
    for state in states:
        by_group.setdefault(state.group, []).append(state)
    hangs = []
    for group, group_states in by_group.items():
        waiting = [s for s in group_states if s.started_seq > s.completed_seq and s.inflight_s >= min_wait_s]
        if not waiting:
            continue
        seq = max(s.started_seq for s in waiting)
        # every member inside the hung collective waits in it, however recently its clock read past the threshold
        at_seq = [s for s in group_states if s.started_seq == seq and s.started_seq > s.completed_seq]
        op = max({s.inflight_op for s in at_seq}, key=lambda o: sum(s.inflight_op == o for s in at_seq))
        behind = {s.rank: s.started_seq for s in group_states if s.started_seq < seq}
        reporting = {s.rank for s in group_states}
        missing = [rank for rank in (members or {}).get(group, ()) if rank not in reporting]
        hangs.append(
            HangSuspect(
                group=group,
                seq=seq,
                op=op,
                waiting_ranks=tuple(sorted(s.rank for s in at_seq)),
                lagging_ranks=tuple(sorted([*behind, *missing])),
                lagging_at=dict(sorted(behind.items())),
                waited_s=max(s.inflight_s for s in waiting),
                missing=tuple((gone or {}).get(rank, GoneRank(rank, None)) for rank in sorted(missing)),
                mismatch=_mismatch(at_seq, op),
                doing={rank: _doing(rank, group, states, (watch or {}).get(rank)) for rank in sorted(behind)},
                missing_group_ranks=tuple(sorted((unplaced or {}).get(group, ()))),
            )
        )
    return _root_first(hangs, states, members)


def _root_first(
    hangs: list[HangSuspect], states: Sequence[RankCommState], members: Mapping[str, Sequence[int]] | None
) -> list[HangSuspect]:
    """The hang that holds the others first: one that names someone (a lagging or mismatched rank) before one
    where every member entered; then one whose lagging ranks are not themselves waiting in a collective (stuck
    in host code, gone); among those, or in a cycle of groups waiting on each other, the largest group."""
    waiting = {s.rank for s in states if s.started_seq > s.completed_seq}

    def downstream(hang: HangSuspect) -> bool:  # a gone rank reports no state: never waiting
        return bool(hang.lagging_ranks) and all(r in waiting for r in hang.lagging_ranks)

    def size(hang: HangSuspect) -> int:
        known = len((members or {}).get(hang.group, ())) + len(hang.missing_group_ranks)
        return max(known, len(hang.waiting_ranks) + len(hang.lagging_ranks) + len(hang.missing_group_ranks))

    def names_none(hang: HangSuspect) -> bool:
        return not (hang.lagging_ranks or hang.mismatch or hang.missing_group_ranks)

    return sorted(hangs, key=lambda h: (names_none(h), downstream(h), -size(h), h.group))


def _mismatch(at_seq: Sequence[RankCommState], op: str) -> dict[int, str]:
    """Members at the hung sequence number inside another collective, or the same one with another size."""
    sizes = [s.inflight_bytes for s in at_seq if s.inflight_op == op and s.inflight_bytes is not None]
    usual = max(set(sizes), key=sizes.count) if sizes else None
    out = {}
    for state in at_seq:
        if state.inflight_op != op:
            out[state.rank] = state.inflight_op
        elif usual is not None and state.inflight_bytes is not None and state.inflight_bytes != usual:
            out[state.rank] = f"{op} of {state.inflight_bytes} bytes (the others {usual})"
    return out


def judge_hangs(positions: Positions, min_wait_s: float | None = None) -> HangReport:
    """The job's hangs under its own threshold (the largest its ranks export; ``min_wait_s`` instead, where
    given: 0 for dumps taken because the job hung), none while a rank is paused."""
    thresholds = [w.threshold_s for w in positions.watch.values() if w.threshold_s is not None]
    threshold = max(thresholds) if thresholds else DEFAULT_THRESHOLD_S
    if min_wait_s is not None:
        threshold = min_wait_s
    paused = tuple(f"rank {rank}: {', '.join(w.paused)}" for rank, w in sorted(positions.watch.items()) if w.paused)
    if paused:
        return HangReport((), threshold, paused)
    waits = find_hangs(
        positions.states,
        min_wait_s=threshold,
        members=positions.members,
        gone=positions.gone,
        watch=positions.watch,
        unplaced=positions.unplaced,
    )
    hangs = [h for h in waits if h.is_hang]
    slow = tuple(h for h in waits if not h.is_hang)
    # a lagging rank inside another group's collective makes that group part of the hang, however long its
    # members have waited yet (two groups waiting on each other): the largest group's view comes first
    hung = {h.group for h in hangs}
    involved = {
        s.group
        for h in hangs
        for s in positions.states
        if s.rank in h.lagging_ranks and s.group not in hung and s.started_seq > s.completed_seq
    }
    if involved:
        hangs += find_hangs(
            [s for s in positions.states if s.group in involved],
            min_wait_s=0.0,
            members=positions.members,
            gone=positions.gone,
            watch=positions.watch,
            unplaced=positions.unplaced,
        )
    hangs = [h for h in hangs if h.is_hang]
    return HangReport(tuple(_root_first(hangs, positions.states, positions.members)), threshold, slow=slow)


def hang_result(report: HangReport) -> LocalizationResult:
    """The ``hang`` verdict: the ranks the largest hung group waits for as suspects (kind ``rank``; a member whose
    global rank is unknown by its group rank, without ranks), every hung group in ``details["hangs"]``. Only for a
    report with hangs (a slow collective is none).

    >>> states = (RankCommState(0, "dp", 7, 6, "all_reduce", 42.0), RankCommState(1, "dp", 6, 6, "", 0.0))
    >>> result = hang_result(judge_hangs(Positions(states, watch={1: RankWatch(12.0, (), "outside collectives "
    ...                                                              "for 41 s at train.py:load_batch:52")})))
    >>> result.verdict, result.suspects[0].component, result.suspects[0].evidence
    ('hang', 'rank:1', 'rank 1 never entered it (outside collectives for 41 s at train.py:load_batch:52); rank 0 waiting 42 s in all_reduce #7')
    """
    main = report.hangs[0]
    gone = {g.rank: g for g in main.missing}
    suspects = []
    for rank in report.culprits:
        if rank in gone:
            evidence = f"{gone[rank].text(main.group)}; its peers wait in {main.op} #{main.seq}"
        elif rank in main.mismatch:
            evidence = (
                f"mismatch: rank {rank} is in {main.mismatch[rank]} #{main.seq} of {main.group}, its peers in {main.op}"
            )
        else:
            doing = main.doing.get(rank) or f"last entered #{main.lagging_at.get(rank, -1)}"
            evidence = f"rank {rank} never entered it ({doing}); {main.waiting}"
        suspects.append(Suspect("rank", (rank,), None, main.group, 1.0, evidence, f"rank:{rank}"))
    for position in main.missing_group_ranks:  # a member no rank reports, whose global rank is unknown
        evidence = (
            f"group rank {position} of {main.group} missing: no rank reports that place, and the members' global "
            f"ranks lie no single stride apart to say whose it is; its peers wait in {main.op} #{main.seq}"
        )
        suspects.append(Suspect("rank", (), None, main.group, 1.0, evidence, f"group_rank:{main.group}/{position}"))
    details = {
        "hangs": [h.to_dict() for h in report.hangs],
        "hang_threshold_s": round(report.threshold_s, 1),
        "reasons": [h.verdict for h in report.hangs],
    }
    return LocalizationResult("hang", tuple(suspects[:5]), (), advice_for("hang"), details)


def _doing(rank: int, group: str, states: Sequence[RankCommState], watch: RankWatch | None) -> str:
    """Where a lagging rank is: inside a collective of another group, or where its watcher found it."""
    elsewhere = [
        s
        for s in states
        if s.rank == rank and s.group != group and s.started_seq > s.completed_seq and s.inflight_s > 0
    ]
    if elsewhere:
        other = max(elsewhere, key=lambda s: s.inflight_s)
        return f"in {other.inflight_op} #{other.started_seq} of {other.group} for {other.inflight_s:.0f} s"
    if watch is not None and watch.stuck:
        return watch.stuck
    return ""


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks[:8])) + (f", ... ({len(ranks)} ranks)" if len(ranks) > 8 else "")


def states_from_samples(samples: Iterable[tuple[str, Mapping[str, str], float]]) -> list[RankCommState]:
    """Rebuild per-rank states from scraped samples ``(metric name, labels, value)`` of any number of ranks."""
    started: dict[tuple[int, str], int] = {}
    completed: dict[tuple[int, str], int] = {}
    inflight: dict[tuple[int, str], tuple[str, float]] = {}
    for name, labels, value in samples:
        rank = _rank(labels)
        if rank is None or "group" not in labels or not _plausible(value):
            continue
        key = (rank, labels["group"])
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


def positions_by_job(
    samples: Iterable[tuple[str, Mapping[str, str], float]],
    gone_samples: Iterable[tuple[str, Mapping[str, str], float]] = (),
) -> dict[str, Positions]:
    """Every job's positions (:func:`positions_from_samples`), keyed by the samples' ``job`` label: the states
    of one job are keyed by (rank, group), and no rank, group or threshold of one job is read into another's."""
    live: dict[str, list[tuple[str, Mapping[str, str], float]]] = {}
    gone: dict[str, list[tuple[str, Mapping[str, str], float]]] = {}
    for sample in samples:
        live.setdefault(sample[1].get("job", ""), []).append(sample)
    for sample in gone_samples:
        gone.setdefault(sample[1].get("job", ""), []).append(sample)
    return {
        job: positions_from_samples(live.get(job, ()), gone.get(job, ())) for job in sorted(live.keys() | gone.keys())
    }


def positions_from_samples(
    samples: Iterable[tuple[str, Mapping[str, str], float]],
    gone_samples: Iterable[tuple[str, Mapping[str, str], float]] = (),
) -> Positions:
    """Every rank's position from scraped samples of the live ranks of one job, and from the last samples of
    ranks that stopped reporting (``gone_samples``: ``trainhealth_comm_started_seq``, ``..._watch_timestamp_seconds``
    and ``..._group_member_info`` as Prometheus last saw them). A group's members are the ranks of its membership
    series, live or gone; the positions none of them holds, by :func:`group_members`. Samples of several jobs are a
    mistake (``ValueError``): split them with :func:`positions_by_job`."""
    samples = [(name, labels, value) for name, labels, value in samples if _plausible(value)]
    gone_samples = [(name, labels, value) for name, labels, value in gone_samples if _plausible(value)]
    jobs = {labels.get("job", "") for _, labels, _ in samples + gone_samples}
    if len(jobs) > 1:
        raise ValueError(f"samples of {len(jobs)} jobs: judge each on its own (positions_by_job)")
    members, unplaced = _membership(samples + gone_samples)
    watch: dict[int, dict[str, Any]] = {}
    for name, labels, value in samples:
        rank = _rank(labels)
        if rank is None:
            continue
        entry = watch.setdefault(rank, {"threshold_s": None, "paused": [], "stuck": None})
        if name == "trainhealth_comm_hang_threshold_seconds":
            entry["threshold_s"] = float(value)
        elif name == "trainhealth_comm_paused" and value > 0:
            entry["paused"].append(labels.get("reason", "pause"))
        elif name == "trainhealth_comm_stuck_duration_seconds":
            state = labels.get("state", "").replace("_", " ")
            what = (
                f"in {labels.get('op')} #{labels.get('seq')} of {labels.get('group')}"
                if labels.get("state") == "in_collective"
                else state
            )
            entry["stuck"] = f"{what} for {value:.0f} s at {labels.get('where', '?')}"
    states = tuple(states_from_samples(samples))
    live = {s.rank for s in states}
    gone: dict[int, GoneRank] = {}
    last_seen: dict[int, float] = {}
    last_seq: dict[int, dict[str, int]] = {}
    for name, labels, value in gone_samples:
        rank = _rank(labels)
        if rank is None or rank in live:
            continue
        if name == "trainhealth_comm_watch_timestamp_seconds":
            last_seen[rank] = max(last_seen.get(rank, 0.0), float(value))
        elif name == "trainhealth_comm_started_seq" and labels.get("group"):
            last_seq.setdefault(rank, {})[labels["group"]] = int(value)
    for rank in sorted(set(last_seen) | set(last_seq)):
        gone[rank] = GoneRank(rank, last_seen.get(rank), last_seq.get(rank, {}))
    return Positions(
        states,
        members,
        {rank: RankWatch(w["threshold_s"], tuple(w["paused"]), w["stuck"]) for rank, w in watch.items()},
        gone,
        unplaced,
    )


#: the largest group size read from a membership series: a bigger one is no job's (a label gone wrong)
MAX_GROUP_SIZE = 1 << 20


def _membership(
    samples: Iterable[tuple[str, Mapping[str, str], float]],
) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """Each group's members (global ranks) and the group ranks of those whose global rank is unknown, from the
    ranks' membership series (live ones first: where two ranks claim one position, the live one holds it)."""
    seen: dict[str, dict[int, int]] = {}
    sizes: dict[str, int] = {}
    for name, labels, _ in samples:
        if name != "trainhealth_comm_group_member_info":
            continue
        group = labels.get("group")
        rank, position, size = _rank(labels), _count(labels.get("group_rank", "")), _count(labels.get("size", ""))
        if not group or rank is None or position is None or size is None or not position < size <= MAX_GROUP_SIZE:
            continue
        seen.setdefault(group, {}).setdefault(position, rank)
        sizes[group] = max(sizes.get(group, 0), size)
    members: dict[str, tuple[int, ...]] = {}
    unplaced: dict[str, tuple[int, ...]] = {}
    for group, held in seen.items():
        members[group], missing = group_members(held, sizes[group])
        if missing:
            unplaced[group] = missing
    return members, unplaced


def group_members(seen: Mapping[int, int], size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The global ranks of a group of ``size`` members, in group-rank order, from those ``seen`` (group rank ->
    global rank); and the group ranks whose global rank is unknown.

    A position nobody reports takes the global rank ``first + group_rank * stride`` where every member seen lies
    on that line: DeviceMesh and ``new_group`` make the world, tensor-, data- and pipeline-parallel groups so. Two
    members seen fix the line; with fewer, or members off any one line, the missing stay unknown.

    >>> group_members({0: 1, 1: 5, 3: 13}, 4)  # data parallel with tensor parallel 4: rank 9 never reported
    ((1, 5, 9, 13), ())
    >>> group_members({0: 0, 1: 1, 3: 7}, 4)  # no single stride: group rank 2 is all that is known
    ((0, 1, 7), (2,))
    """
    missing = [position for position in range(size) if position not in seen]
    if not missing:
        return tuple(seen[position] for position in range(size)), ()
    placed = sorted(seen.items())
    if len(placed) >= 2:
        (g0, r0), (g1, r1) = placed[0], placed[1]
        stride, remainder = divmod(r1 - r0, g1 - g0)
        first = r0 - g0 * stride
        on_line = stride != 0 and not remainder and all(r == first + g * stride for g, r in placed)
        if on_line and min(first, first + (size - 1) * stride) >= 0:
            return tuple(first + position * stride for position in range(size)), ()
    return tuple(rank for _, rank in placed), tuple(missing)


def positions_from_records(records: Any, members: Mapping[str, Sequence[int]], dumped_at: float) -> Positions:
    """Every rank's position from Flight Recorder records (trace format v1 with its ``state`` column, from
    :func:`trainhealth._internal.traces.flight_recorder.import_flight_recorder`): per rank and group, the last collective
    entered and the last completed, the one in flight and how long before ``dumped_at`` (unix time) it began.
    Members that left no dump are missing. gloo marks no entry completed (and its ``pg_status`` counts
    disagree between members), so there each rank's last entry counts as in flight, as torch's ``fr_trace``
    reads it: the rank behind is the one whose last entry is older."""
    collectives = records[~records["op"].isin(("send", "recv")) & records["seq"].notna()]
    states = []
    for (rank, group), rows in collectives.groupby(["rank", "group"], sort=True):
        rows = rows.sort_values("seq")
        last = rows.iloc[-1]
        done = rows[rows["state"] == "completed"]
        started = int(last["seq"])
        finished = int(done["seq"].max()) if len(done) else -1
        inflight = started > finished
        size = last.get("bytes")
        states.append(
            RankCommState(
                int(rank),
                str(group),
                started,
                finished,
                str(last["op"]) if inflight else "",
                max(0.0, dumped_at - float(last["start"])) if inflight else 0.0,
                int(size) if inflight and size is not None and not pd.isna(size) else None,
            )
        )
    return Positions(tuple(states), {str(g): tuple(int(r) for r in m) for g, m in members.items()})


def _plausible(value: float) -> bool:
    """A sample that can be a sequence number, a duration or a time: finite, under 2**53 in size."""
    return math.isfinite(value) and abs(value) < 2.0**53


def _rank(labels: Mapping[str, str]) -> int | None:
    return _count(labels.get("rank", ""))


def _count(text: str) -> int | None:
    """A rank, a group rank or a size from its label: decimal digits, at most nine."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 9 else None
