"""Compute and wait per rank and step, measured from step markers and collective arrivals.

A synchronous collective ends on every member at about the same moment, at
max(member arrivals) + transfer time. So a member's duration minus the shortest
member's is how long it waited for the last to arrive (its *excess*), whatever
the clocks of the hosts, and the member with the shortest duration arrived last.

Per rank and step:

* **step time**: the ``step`` marker's duration (the Monitor writes one per step);
  without markers, the time from the end of the rank's last collective of the
  previous step to the end of its last of this one (an iteration computes, then
  communicates; iterations inferred, see :mod:`.iterations`);
* **blocked**: time the rank could not compute because it was in communication —
  all of a send or receive, all of a collective that blocks the training thread;
  of asynchronous collectives (DDP's bucket all-reduces run beside backward; the
  trace's optional ``async`` column says so, else overlapping collectives are
  taken for asynchronous) only what is left of them once the step's last one
  began: backward is over then, and the rank can only wait for its buckets (the
  waiting for a late peer lands there too);
* **busy** = step time − blocked: what the rank itself spent computing, loading
  data or stalling. A straggler is busy longer than the ranks doing the same work;
  the others wait for it and are blocked longer;
* **relative**: log(busy / busy of its peers) per step, the peers being the other
  members of the symmetric collectives it takes part in (data- and tensor-parallel
  groups; pipeline sends are not symmetric and make no peers).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from trainhealth._internal.localize.grouping import covered
from trainhealth._internal.localize.timings import P2P, Message, rank_hosts
from trainhealth._internal.traces.format import COMMUNICATION_OPS

__all__ = ["Measured", "P2P_OPS", "measure", "without"]

P2P_OPS = ("send", "recv")
#: busy time is kept above this share of the rank's median step time: a step whose every moment was spent in
#: collectives still computed something, and log(0) would compare nothing
_BUSY_FLOOR = 0.05


@dataclass(frozen=True)
class Measured:
    """Matrices are (rank, step), indexed like ``ranks`` and ``steps``; NaN where nothing was measured."""

    ranks: np.ndarray
    steps: np.ndarray
    step_time: np.ndarray
    busy: np.ndarray
    waited: np.ndarray  # seconds spent waiting for later arrivals (excess intervals, overlaps counted once)
    relative: np.ndarray  # log(busy / the peers' busy)
    slowest: np.ndarray  # bool: the rank was the slowest of its peers in that step (largest relative)
    transfer: pd.DataFrame  # per (group, step): seconds of transfer (the last arrival's durations), members
    groups: dict[str, tuple[int, ...]]  # symmetric groups (two or more members), each member set once
    members: dict[str, tuple[int, ...]]  # every communicator with two or more members and its ranks
    messages: dict[str, Message]  # per communicator of ``members``: the message its collectives most often carry
    hosts: dict[int, str]
    markers: bool  # step times come from step markers (else from the inferred iterations)


def measure(records: pd.DataFrame, hosts: Mapping[int, str] | None = None) -> Measured:
    """Measure compute and wait from ``records`` (trace format v1, canonical dtypes, real or inferred steps)."""
    rank_code, ranks = _codes(records["rank"].to_numpy(dtype=np.int64))
    step_code, steps = _codes(records["step"].to_numpy(dtype=np.int64))
    n_ranks, n_steps = len(ranks), len(steps)
    op = records["op"].astype(str).to_numpy()
    start = records["start"].to_numpy(dtype=np.float64)
    duration = records["duration"].to_numpy(dtype=np.float64)
    cell = rank_code * n_steps + step_code

    markers = op == "step"
    if markers.any():
        step_time = _per_cell(cell[markers], duration[markers], n_ranks * n_steps, np.maximum)
    else:  # an iteration computes, then communicates: it ends when its last collective does
        last: np.ndarray = np.full(n_ranks * n_steps, -np.inf)
        np.maximum.at(last, cell, start + duration)
        last = last.reshape(n_ranks, n_steps)
        step_time = np.full((n_ranks, n_steps), np.nan)
        step_time[:, 1:] = last[:, 1:] - last[:, :-1]  # the first step has no earlier end to begin from
        step_time = step_time.reshape(-1)
    step_time[~np.isfinite(step_time) | (step_time <= 0)] = np.nan

    comm = np.flatnonzero(
        np.isin(op, COMMUNICATION_OPS) & records["group"].notna().to_numpy() & records["seq"].notna().to_numpy()
    )
    group_name = records["group"].astype(str).to_numpy()[comm]
    instance = pd.factorize(pd.Series(group_name) + "#" + records["seq"].to_numpy()[comm].astype(np.int64).astype(str))[
        0
    ]
    members = np.bincount(instance)[instance]
    shortest = pd.Series(duration[comm]).groupby(instance).transform("min").to_numpy()
    excess = np.where(members >= 2, duration[comm] - shortest, 0.0)
    p2p = np.isin(op[comm], P2P_OPS)
    overlapping = _asynchronous(records, comm, rank_code, start, duration)
    # blocked: the whole interval, except for collectives running beside others (DDP's buckets beside backward):
    # what is left of them once the step's last such collective began (backward is over then)
    beside = overlapping & ~p2p
    begin, end = start[comm], start[comm] + duration[comm]
    last_began = np.full(n_ranks * n_steps, -np.inf)
    np.maximum.at(last_began, cell[comm][beside], begin[beside])
    tail_begin = np.maximum(begin, last_began[cell[comm]])
    blocked_begin = np.where(beside, tail_begin, begin)
    blocked = covered(cell[comm], blocked_begin, np.maximum(end - blocked_begin, 0.0), n_ranks * n_steps)
    waited = covered(cell[comm], start[comm], np.where(p2p, 0.0, excess), n_ranks * n_steps)

    step_time = step_time.reshape(n_ranks, n_steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a rank without a measured step
        typical = np.nan_to_num(np.nanmedian(step_time, axis=1, keepdims=True), nan=0.0)
    busy = np.maximum(step_time - blocked.reshape(n_ranks, n_steps), _BUSY_FLOOR * typical)

    symmetric = members >= 2
    groups = _symmetric_groups(group_name[symmetric & ~p2p], ranks[rank_code[comm]][symmetric & ~p2p])
    members = _members(group_name[symmetric], ranks[rank_code[comm]][symmetric])
    sizes = records["bytes"].array.take(comm) if "bytes" in records else pd.array([pd.NA] * len(comm), dtype="Int64")
    messages = _messages(group_name[symmetric], op[comm][symmetric], sizes[symmetric])
    relative, slowest = _compare(busy, groups, ranks, frozenset())
    transfer = pd.DataFrame(
        {
            "group": group_name[symmetric],
            "step": steps[step_code[comm]][symmetric],
            "instance": instance[symmetric],
            "seconds": shortest[symmetric],
        }
    )
    transfer = transfer.drop_duplicates("instance").groupby(["group", "step"], sort=True)["seconds"].sum().reset_index()
    return Measured(
        ranks=ranks,
        steps=steps,
        step_time=step_time,
        busy=busy,
        waited=waited.reshape(n_ranks, n_steps),
        relative=relative,
        slowest=slowest,
        transfer=transfer,
        groups=groups,
        members=members,
        messages=messages,
        hosts=rank_hosts(records, hosts),
        markers=bool(markers.any()),
    )


def without(measured: Measured, ranks: frozenset[int]) -> Measured:
    """The comparison with peers redone with ``ranks`` left out of every reference (a straggler already found
    is no standard for its peers: when it slows, the median of a small group moves with it)."""
    relative, slowest = _compare(measured.busy, measured.groups, measured.ranks, ranks)
    return replace(measured, relative=relative, slowest=slowest)


def _compare(
    busy: np.ndarray, groups: dict[str, tuple[int, ...]], ranks: np.ndarray, excluded: frozenset[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Per rank and step: log busy relative to its peers, and whether it was the slowest of them."""
    log_busy = np.log(busy)
    reference = log_busy.copy()
    reference[np.isin(ranks, sorted(excluded))] = np.nan
    relative = _relative(log_busy, reference, groups, ranks)
    compared = np.where(np.isin(ranks, sorted(excluded))[:, None], np.nan, relative)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        slowest = relative >= _peer_max(compared, groups, ranks) - 1e-12
    return relative, slowest & np.isfinite(relative)


def _codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    distinct, code = np.unique(values, return_inverse=True)
    return code.astype(np.int64), distinct


def _per_cell(cell: np.ndarray, values: np.ndarray, n_cells: int, combine: np.ufunc) -> np.ndarray:
    out = np.full(n_cells, np.nan)
    seen = np.zeros(n_cells, dtype=bool)
    seen[cell] = True
    out[seen] = -np.inf
    combine.at(out, cell, values)
    return out


def _asynchronous(
    records: pd.DataFrame, rows: np.ndarray, rank_code: np.ndarray, start: np.ndarray, duration: np.ndarray
) -> np.ndarray:
    """Per communication row: whether it ran beside the training thread — the trace's ``async`` column where
    it has one (``trainhealth.comm`` writes it), else whether it overlaps another collective of its rank."""
    if "async" in records.columns:
        flag = records["async"].to_numpy()[rows]
        known = pd.notna(flag)
        if known.all():
            return (
                np.array([str(v).lower() in ("true", "1") for v in flag], dtype=bool)
                if flag.dtype == object
                else flag.astype(bool)
            )
    return _overlaps(rank_code[rows], start[rows], duration[rows])


def _overlaps(rank: np.ndarray, start: np.ndarray, duration: np.ndarray) -> np.ndarray:
    """Per record: whether it overlaps another record of the same rank in time."""
    order = np.lexsort((start, rank))
    r, begin, end = rank[order], start[order], (start + duration)[order]
    reach = pd.Series(end).groupby(r).cummax().to_numpy()
    same_before = np.r_[False, r[1:] == r[:-1]]
    same_after = np.r_[r[1:] == r[:-1], False]
    previous_reach = np.r_[-np.inf, reach[:-1]]
    next_begin = np.r_[begin[1:], np.inf]
    hit = (same_before & (begin < previous_reach)) | (same_after & (next_begin < end))
    out = np.empty(len(order), dtype=bool)
    out[order] = hit
    return out


def _members(names: np.ndarray, member_ranks: np.ndarray) -> dict[str, tuple[int, ...]]:
    pairs = pd.DataFrame({"group": names, "rank": member_ranks}).drop_duplicates()
    return {str(name): tuple(sorted(int(r) for r in block)) for name, block in pairs.groupby("group")["rank"]}


def _messages(names: np.ndarray, ops: np.ndarray, sizes: pd.api.extensions.ExtensionArray) -> dict[str, Message]:
    """Per communicator, the message (operation and size) most of its rows carry; sends and receives are one
    point-to-point operation (:data:`.timings.P2P`), ties go to the first in sorted order."""
    table = pd.DataFrame({"group": names, "op": np.where(np.isin(ops, P2P_OPS), P2P, ops), "bytes": sizes})
    counts = table.groupby(["group", "op", "bytes"], dropna=False, sort=True).size().reset_index(name="rows")
    top = counts.sort_values(["group", "rows"], ascending=[True, False], kind="stable").drop_duplicates("group")
    return {
        str(group): Message(str(op), None if pd.isna(size) else int(size))
        for group, op, size in zip(top["group"], top["op"], top["bytes"])
    }


def _symmetric_groups(names: np.ndarray, member_ranks: np.ndarray) -> dict[str, tuple[int, ...]]:
    """Each symmetric group's member ranks; groups with the same members are kept once."""
    pairs = pd.DataFrame({"group": names, "rank": member_ranks}).drop_duplicates()
    found: dict[str, tuple[int, ...]] = {}
    seen: set[tuple[int, ...]] = set()
    for name, block in pairs.groupby("group", sort=True)["rank"]:
        members = tuple(sorted(int(r) for r in block))
        if len(members) >= 2 and members not in seen:
            seen.add(members)
            found[str(name)] = members
    return found


def _relative(
    log_busy: np.ndarray, reference: np.ndarray, groups: dict[str, tuple[int, ...]], ranks: np.ndarray
) -> np.ndarray:
    """log busy minus the median, over the rank's groups, of the other members' median (leave one out) of
    ``reference`` (log busy with the ranks left out of comparisons as NaN)."""
    index = {int(r): i for i, r in enumerate(ranks)}
    rows: list[int] = []
    references: list[np.ndarray] = []
    for members in groups.values():
        positions = np.array([index[m] for m in members])
        rows.extend(positions.tolist())
        references.append(_leave_one_out_median(reference[positions]))
    if not rows:
        return np.full(log_busy.shape, np.nan)
    stacked = pd.DataFrame(np.vstack(references))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        median = stacked.groupby(np.array(rows)).median()
    out = np.full(log_busy.shape, np.nan)
    out[median.index.to_numpy()] = log_busy[median.index.to_numpy()] - median.to_numpy()
    return out


def _leave_one_out_median(block: np.ndarray) -> np.ndarray:
    """Per member and step, the median of the other members' values in that step (NaN-aware).

    >>> _leave_one_out_median(np.array([[1.0], [2.0], [3.0], [10.0]]))[:, 0].tolist()
    [3.0, 3.0, 2.0, 2.0]
    """
    m = block.shape[0]
    if m < 2:
        return np.full_like(block, np.nan)
    missing = np.isnan(block)
    gaps = missing.any(axis=0) & ~missing.all(axis=0)
    if missing.any():  # steps some member did not measure: those columns one member at a time
        out = np.full_like(block, np.nan)
        full = ~missing.any(axis=0)
        if full.any():
            out[:, full] = _leave_one_out_median(block[:, full])
        if not gaps.any():
            return out
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # steps no other member measured
            for i in range(m):
                out[i, gaps] = np.nanmedian(np.delete(block[:, gaps], i, axis=0), axis=0)
        return out
    order = np.argsort(block, axis=0, kind="stable")
    ordered = np.take_along_axis(block, order, axis=0)
    position = np.empty_like(order)
    np.put_along_axis(position, order, np.arange(m)[:, None], axis=0)  # each member's place in its step

    def remaining(j: int) -> np.ndarray:  # the j-th smallest value once the member itself is removed
        return np.where(j < position, ordered[min(j, m - 1)], ordered[min(j + 1, m - 1)])

    if (m - 1) % 2:
        return remaining((m - 2) // 2)
    return (remaining((m - 1) // 2 - 1) + remaining((m - 1) // 2)) / 2.0


def _peer_max(relative: np.ndarray, groups: dict[str, tuple[int, ...]], ranks: np.ndarray) -> np.ndarray:
    """Per rank and step, the largest relative value among the rank and its peers."""
    index = {int(r): i for i, r in enumerate(ranks)}
    out = np.where(np.isfinite(relative), relative, -np.inf)
    result = out.copy()
    for members in groups.values():
        positions = np.array([index[m] for m in members])
        top = out[positions].max(axis=0)
        result[positions] = np.maximum(result[positions], top)
    return result
