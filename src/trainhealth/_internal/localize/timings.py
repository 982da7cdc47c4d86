"""Timings for localization: per-rank and per-transfer matrices from trace records, in numpy.

What the recorded path measures, following Holmes's reading of collective timings
(the sentences about it are written in :mod:`.wording`):

* **Compute**: each forward/backward/compute operation's duration relative to
  the same operation of the rank's peers (the ranks doing the same work in the
  other data-parallel replicas) and to the rank's own other steps, averaged per
  rank and step with outliers such as GC pauses left out. A slow GPU is slow
  against its peers and its own past. Traces of collectives alone have no
  compute records: then a rank's compute in a step is the time from the end of
  its previous step's records to the end of this step's, minus the time it spent
  inside collectives (waiting included).
* **Who arrived last**: a collective ends for all members at once, so the
  member that arrived last waited least (Holmes's straggler rule): per rank, the
  share of its collectives it was last to.
* **Transfer excess** (Holmes's communication rule): the last member to arrive
  did not wait, so its duration is the transfer time; when even that is long,
  every member looks abnormal and the path is at fault. Kept per inter-host
  instance as log(transfer time / the median of its class), with its members
  and its message (operation and size), so a NIC, a host or a switch can be
  scored by the transfers that cross it.

Replicas (the ranks of one data-parallel replica, joined by tensor, context and
pipeline groups) are found too: work that is uneven between replicas, such as
longer sequences in one of them, moves a whole replica and is not one GPU's fault.
The integer codes and grouped medians all this is computed with are :mod:`.grouping`'s.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from trainhealth._internal._memory import release_freed_memory
from trainhealth._internal.localize.compute_grid import grid_slots, median_along, versus_peers_and_own
from trainhealth._internal.localize.grouping import (
    combined,
    covered,
    extent,
    group_median,
    index_type,
    key_codes,
    median_by,
    positions,
    small_codes,
    sorted_codes,
    text_codes,
)
from trainhealth._internal.traces.format import COMMUNICATION_OPS, COMPUTATION_OPS

__all__ = [
    "P2P",
    "Message",
    "Timings",
    "Transfers",
    "gather_timings",
    "group_kind",
    "last_steps",
    "rank_hosts",
    "without_steps",
]

_KIND = re.compile(r"^(tp|dp|pp|ep|cp|emb|sp)(?=[-:_.]|\d|$)")
_PASSES = ("forward", "backward")
#: peer groups come from the first kind present: data-parallel replicas do the same work
_PEER_KINDS = ("dp", "tp", "cp", "other")
#: a :class:`Message`'s operation for sends and receives, taken together (one point-to-point transfer)
P2P = "p2p"


def group_kind(name: str) -> str:
    """``tp``, ``dp``, ``pp``, ``ep``, ``cp``, ``emb``, ``sp``, ``p2p`` (a directed send/recv group) or ``other``.

    >>> [group_kind(g) for g in ("dp-s0-t0", "tp:3", "default_pg:0:1->2", "pp-d0-t0-s1-2", "0")]
    ['dp', 'tp', 'p2p', 'pp', 'other']
    """
    if "->" in name:
        return "p2p"
    match = _KIND.match(name)
    return match.group(1) if match else "other"


@dataclass(frozen=True)
class Message:
    """What one collective moved: its operation (:data:`P2P` for sends and receives) and size in bytes (None where
    the trace does not record it)."""

    op: str
    nbytes: int | None


@dataclass(frozen=True)
class Transfers:
    """Inter-host collective instances: their transfer excess, their message and who took part."""

    excess: np.ndarray  # per instance: log(transfer time / the median of its class)
    step: np.ndarray  # per instance: index into Timings.steps
    message: np.ndarray  # per instance: index into messages
    messages: tuple[Message, ...]
    member_instance: np.ndarray  # per membership: the instance
    member_rank: np.ndarray  # per membership: index into Timings.ranks
    # (indices are 32-bit where they fit: millions of memberships)


@dataclass(frozen=True)
class Timings:
    """Per-rank matrices are (rank, step), indexed like ``ranks`` and ``steps``."""

    ranks: np.ndarray
    steps: np.ndarray
    step_time: np.ndarray  # per step: median over ranks of the time the rank's records span
    peer_of: np.ndarray  # per rank: its peer group (ranks doing the same work)
    peer_kind: str  # the group kind the peers come from
    replica_of: np.ndarray  # per rank: its replica (ranks joined by non-peer groups)
    lockstep_of: np.ndarray  # per rank: the ranks computing one layer's shards with it (tensor/context parallel)
    compute: np.ndarray  # log compute time relative to peers; NaN where none was recorded
    compute_change: np.ndarray  # log compute time relative to the rank's own usual, common changes removed
    compute_seconds: np.ndarray  # compute seconds
    compute_derived: bool  # no compute records: compute is the time outside collectives
    last_share: np.ndarray  # per rank: share of its collectives it arrived last to
    transfers: Transfers
    hosts: dict[int, str]
    switches: dict[int, str]


def gather_timings(
    records: pd.DataFrame,
    hosts: Mapping[int, str] | None = None,
    switches: Mapping[int, str] | None = None,
    usual_before: int | None = None,
) -> Timings:
    """Timings from ``records`` (trace format v1 with canonical dtypes); steps numbered below ``usual_before``
    are the run's usual (a live analyzer's reference, :mod:`.history`): a transfer is compared with its class's
    usual time there, where the class was seen there, so that a path slow for longer than the history shows."""
    rank_code, ranks = small_codes(records["rank"].to_numpy())
    step_code, steps = small_codes(records["step"].to_numpy())
    n_ranks, n_steps = len(ranks), len(steps)
    duration = records["duration"].to_numpy(dtype=np.float64)
    start = records["start"].to_numpy(dtype=np.float64)
    op = _Ops(records["op"])
    host_of = rank_hosts(records, hosts, ranks)
    switch_of = {int(r): str(s) for r, s in (switches or {}).items()}

    first, span = _spans(rank_code, step_code, start, duration, n_ranks, n_steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # steps no rank has records in
        step_time = np.nan_to_num(np.nanmedian(span, axis=0), nan=0.0)
    instances = _instances(records, op)
    release_freed_memory()  # each stage's temporaries: tens of millions of rows' worth
    kinds = np.array([group_kind(name) for name in instances.group_names], dtype=object)
    member_rank = rank_code[instances.rows]
    # each (group, rank) membership once: every step and sequence number repeats them
    membership = pd.unique(instances.group.astype(np.int64)[instances.instance] * n_ranks + member_rank)
    group, rank = membership // n_ranks, membership % n_ranks
    peer_of, peer_kind = _peer_groups(kinds, rank, group, n_ranks)
    # a replica: the ranks joined by the groups that are neither peer nor expert groups (those span replicas)
    replica_of = _joined(group, rank, ~np.isin(kinds, (peer_kind, "ep"))[group], n_ranks)
    # ranks in lockstep: joined by tensor- and context-parallel groups (one layer's shards)
    lockstep_of = _joined(group, rank, (np.isin(kinds, ("tp", "cp")) & (peer_kind != "tp"))[group], n_ranks)

    last_count = np.bincount(member_rank[instances.last_row], minlength=n_ranks)
    taken = np.bincount(member_rank, minlength=n_ranks)
    del member_rank  # one per membership row: gathered again for the transfers, not held through the compute

    chosen = op.among(_PASSES)
    if not chosen.any():
        chosen = op.among(COMPUTATION_OPS)
    derived = not chosen.any()
    if derived:  # collectives only: what a rank spends outside them is its compute
        # sends are left out: a sender computes on while its send waits for the receiver
        rows = instances.rows[~op.among(("send",))[instances.rows]]
        in_collectives = covered(
            rank_code[rows].astype(np.int64) * n_steps + step_code[rows], start[rows], duration[rows], n_ranks * n_steps
        )
        del rows
        # a step computes, then communicates: from the end of the rank's previous step to the end of this one,
        # so the compute before a step's first collective counts (the first step has no earlier end)
        iteration = np.full((n_ranks, n_steps), np.nan)
        iteration[:, 1:] = (first + span)[:, 1:] - (first + span)[:, :-1]
        busy = np.maximum(iteration.reshape(-1) - in_collectives, 0.0)
        cells = np.flatnonzero(np.isfinite(busy))
        compute, compute_change, compute_seconds = _compute(
            cells // n_steps,
            cells % n_steps,
            np.zeros(len(cells), dtype=np.int64),  # one operation: compute
            first.reshape(-1)[cells],
            busy[cells],
            peer_of,
            replica_of,
            n_ranks,
            n_steps,
        )
    else:
        operations = np.flatnonzero(chosen).astype(index_type(len(chosen)))
        del chosen
        compute, compute_change, compute_seconds = _compute(
            rank_code,
            step_code,
            op.codes,
            start,
            duration,
            peer_of,
            replica_of,
            n_ranks,
            n_steps,
            rows=operations,
        )

    release_freed_memory()
    host_names = np.array([host_of.get(int(r), "") for r in ranks])
    transfers = _transfers(
        records,
        op,
        instances,
        kinds,
        rank_code[instances.rows],
        host_names,
        step_code,
        peer_of,
        int(np.searchsorted(steps, usual_before)) if usual_before is not None else 0,
    )
    release_freed_memory()
    return Timings(
        ranks=ranks.astype(np.int64),
        steps=steps.astype(np.int64),
        step_time=step_time,
        peer_of=peer_of,
        peer_kind=peer_kind,
        replica_of=replica_of,
        lockstep_of=lockstep_of,
        compute=compute,
        compute_change=compute_change,
        compute_seconds=compute_seconds,
        compute_derived=derived,
        last_share=np.where(taken > 0, last_count / np.maximum(taken, 1), 0.0),
        transfers=transfers,
        hosts={int(r): str(h) for r, h in zip(ranks, host_names) if h},
        switches=switch_of,
    )


def last_steps(timings: Timings, count: int) -> Timings:
    """The timings of the last ``count`` steps only (the window a live analyzer judges), cut from timings
    gathered over a longer history, so that each rank's usual comes from the history."""
    first = max(len(timings.steps) - count, 0)
    columns = slice(first, None)
    transfers = timings.transfers
    kept = transfers.step >= first
    renumber = np.full(len(kept), -1)
    renumber[kept] = np.arange(int(kept.sum()))
    members = kept[transfers.member_instance]
    return replace(
        timings,
        steps=timings.steps[columns],
        step_time=timings.step_time[columns],
        compute=timings.compute[:, columns],
        compute_change=timings.compute_change[:, columns],
        compute_seconds=timings.compute_seconds[:, columns],
        transfers=Transfers(
            excess=transfers.excess[kept],
            step=transfers.step[kept] - first,
            message=transfers.message[kept],
            messages=transfers.messages,
            member_instance=renumber[transfers.member_instance[members]],
            member_rank=transfers.member_rank[members],
        ),
    )


def without_steps(timings: Timings, first: int, last: int) -> Timings:
    """The timings with their compute in steps ``first``-``last`` left out (NaN): steps every rank was slow in
    (:mod:`.jobwide`) say nothing of one device."""
    columns = (timings.steps >= first) & (timings.steps <= last)
    if not columns.any():
        return timings
    return replace(
        timings,
        compute=np.where(columns, np.nan, timings.compute),
        compute_change=np.where(columns, np.nan, timings.compute_change),
    )


def rank_hosts(
    records: pd.DataFrame, hosts: Mapping[int, str] | None, ranks: np.ndarray | None = None
) -> dict[int, str]:
    """rank -> host: the given mapping, completed from the records' ``host`` column. ``ranks``: the records'
    distinct ranks, when known; the column is then read only when the mapping lacks one of them."""
    found: dict[int, str] = {int(r): str(h) for r, h in (hosts or {}).items()}
    if "host" in records.columns and (ranks is None or any(int(r) not in found for r in ranks.tolist())):
        pairs = records[["rank", "host"]].dropna().drop_duplicates("rank")
        for rank, host in zip(pairs["rank"].to_numpy(), pairs["host"].astype(str).to_numpy()):
            found.setdefault(int(rank), host)
    return found


def _spans(
    rank_code: np.ndarray, step_code: np.ndarray, start: np.ndarray, duration: np.ndarray, n_ranks: int, n_steps: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per rank and step: when its first record starts, and how long its records span (NaN if none)."""
    cell = rank_code.astype(index_type(n_ranks * n_steps), copy=False) * n_steps + step_code
    first = np.full(n_ranks * n_steps, np.inf)
    last = np.full(n_ranks * n_steps, -np.inf)
    end = start + duration
    if len(cell) and np.all(cell[1:] >= cell[:-1]):  # written rank by rank and step by step: runs of a cell
        begins = np.flatnonzero(np.r_[True, cell[1:] != cell[:-1]])
        first[cell[begins]] = np.minimum.reduceat(start, begins)
        last[cell[begins]] = np.maximum.reduceat(end, begins)
    else:
        np.minimum.at(first, cell, start)
        np.maximum.at(last, cell, end)
    del cell, end
    span = (last - first).reshape(n_ranks, n_steps)
    span[~np.isfinite(span)] = np.nan
    return first.reshape(n_ranks, n_steps), span


@dataclass(frozen=True)
class _Instances:
    rows: np.ndarray  # record rows of members of multi-member instances
    instance: np.ndarray  # per member row: instance index
    group: np.ndarray  # per instance: group code
    seq: np.ndarray  # per instance: sequence number
    group_names: np.ndarray
    size: np.ndarray  # per instance: members
    shortest: np.ndarray  # per instance: the last arrival's duration (the transfer time)
    last_row: np.ndarray  # per instance: index into rows of the (first) member with the shortest duration


def _instances(records: pd.DataFrame, op: _Ops) -> _Instances:
    """Collective instances (a group's operation with one sequence number) of two or more members. Only two
    arrays are per member row (its record row and instance), both 32-bit where they fit."""
    group_code, names = text_codes(records["group"])
    seq_column = records["seq"]
    is_comm = op.among(COMMUNICATION_OPS) & (group_code >= 0) & seq_column.notna().to_numpy()
    rows = np.flatnonzero(is_comm).astype(index_type(len(records)))
    del is_comm
    member_group, group_names = sorted_codes(group_code[rows], names)
    member_seq = seq_column.array.take(rows).to_numpy(dtype=np.int64)  # none missing in these rows
    seqs = int(member_seq.max()) + 1 if len(member_seq) else 1
    if seqs <= np.iinfo(np.int32).max:
        member_seq = member_seq.astype(np.int32)
    kind = index_type(len(group_names) * seqs)  # 32-bit keys hash over twice as fast
    key = member_group.astype(kind) * seqs + member_seq.astype(kind, copy=False)
    instance = key_codes(key, len(group_names) * seqs).astype(index_type(len(key)), copy=False)
    del key
    counts = np.bincount(instance)
    group = np.empty(len(counts), dtype=member_group.dtype)  # every member of an instance has its group and seq
    group[instance] = member_group
    seq = np.empty(len(counts), dtype=member_seq.dtype)
    seq[instance] = member_seq
    del member_group, member_seq
    multi = counts >= 2
    if not multi.all():
        kept = multi[instance]
        rows, instance = rows[kept], instance[kept]
        group, seq = group[multi], seq[multi]
        # renumbering the kept instances keeps their order
        instance = (np.cumsum(multi, dtype=instance.dtype) - 1)[instance]
    del counts, multi
    size = np.bincount(instance).astype(index_type(len(rows)))
    duration = records["duration"].to_numpy(dtype=np.float64)[rows]
    shortest = np.full(len(size), np.inf)
    np.minimum.at(shortest, instance, duration)
    last_row = np.full(len(size), len(rows), dtype=index_type(len(rows) + 1))
    at_shortest = np.flatnonzero(duration == shortest[instance]).astype(last_row.dtype)  # ufunc.at converts slowly
    np.minimum.at(last_row, instance[at_shortest], at_shortest)
    return _Instances(rows, instance, group, seq, group_names, size, shortest, last_row)


class _Ops:
    """The ``op`` column as codes into its few distinct names: masks without comparing millions of strings."""

    def __init__(self, column: pd.Series) -> None:
        self.codes, self._names = text_codes(column)

    def among(self, wanted: tuple[str, ...]) -> np.ndarray:
        return np.append(np.isin(self._names, wanted), False)[self.codes]  # code -1 (missing): the appended False

    def name(self, code: int) -> str:
        """The operation of a code; code -1 stands for sends and receives taken together (:data:`P2P`)."""
        return P2P if code < 0 else str(self._names[code])


def _peer_groups(
    kinds: np.ndarray, member_rank: np.ndarray, member_group: np.ndarray, n_ranks: int
) -> tuple[np.ndarray, str]:
    """Per rank the index of its peer group: the members of its data-parallel group (else tp, cp, any).
    ``kinds``: per group code, its kind."""
    for kind in _PEER_KINDS:
        chosen = (kinds == kind)[member_group]
        if not chosen.any():
            continue
        key = np.sort(pd.unique(member_group[chosen] * n_ranks + member_rank[chosen]))
        pairs = np.stack([key // n_ranks, key % n_ranks], axis=1)
        peer_of = np.full(n_ranks, -1)
        sizes = np.bincount(pairs[:, 0])
        for group in np.argsort(-sizes, kind="stable"):  # largest groups first; a rank joins one
            members = pairs[pairs[:, 0] == group, 1]
            fresh = members[peer_of[members] < 0]
            if len(fresh) >= 2:
                peer_of[fresh] = group
        if (peer_of >= 0).any():
            alone = peer_of < 0
            peer_of[alone] = peer_of.max() + 1 + np.arange(alone.sum())
            return np.unique(peer_of, return_inverse=True)[1], kind
    return np.zeros(n_ranks, dtype=np.int64), "all"


def _joined(member_group: np.ndarray, member_rank: np.ndarray, chosen: np.ndarray, n_ranks: int) -> np.ndarray:
    """Per rank, its connected component over the ``chosen`` memberships' groups (numbered from 0)."""
    groups, members = member_group[chosen], member_rank[chosen]
    label = np.arange(n_ranks)
    if len(groups) == 0:
        return label
    group_code, _ = small_codes(groups)
    while True:
        lowest = np.full(group_code.max() + 1, n_ranks)
        np.minimum.at(lowest, group_code, label[members])
        updated = label.copy()
        np.minimum.at(updated, members, lowest[group_code])
        updated = updated[updated]  # jump to the label's own label
        if np.array_equal(updated, label):
            return np.unique(label, return_inverse=True)[1]
        label = updated


def _compute(
    rank: np.ndarray,
    step: np.ndarray,
    op: np.ndarray,
    start: np.ndarray,
    duration: np.ndarray,
    peer_of: np.ndarray,
    replica_of: np.ndarray,
    n_ranks: int,
    n_steps: int,
    rows: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per rank and step: log compute time relative to peers, relative to the rank's own usual, and seconds.

    ``rows``: the rows of the five arrays that are operations (None: all of them), gathered here already in
    time order, so that no unordered copy of them is held.

    The k-th forward of a rank in a step is compared with the k-th forward of its
    peers in the same step, and with its own k-th forward in the other steps (the
    change). From the change, what the rank's whole replica shares in that
    operation (the micro-batch's sequence length; drift) is removed. Each is
    averaged per rank and step leaving out single operations far from the cell's
    median (a GC pause, a page fault).
    """
    if rows is None:
        rows = np.arange(len(rank), dtype=index_type(len(rank)))
    op_code = pd.factorize(op[rows])[0].astype(np.int32)
    rank_step = rank[rows].astype(index_type(n_ranks * n_steps), copy=False) * n_steps + step[rows]
    cell = rank_step.astype(np.int64) * (int(op_code.max(initial=0)) + 1) + op_code
    order = _time_order(cell, rank_step, start[rows])  # by rank, step and operation, then time
    if order is not None:
        rows, cell, op_code, rank_step = rows[order], cell[order], op_code[order], rank_step[order]
    del order, start
    rank, step, duration = rank[rows], step[rows], duration[rows]
    del rows
    boundary = np.r_[True, cell[1:] != cell[:-1]]
    index = np.arange(len(cell), dtype=index_type(len(cell)))
    position = index - np.maximum.accumulate(np.where(boundary, index, 0))
    del cell, boundary, index
    # each array per operation is dropped once the last step that reads it is done: millions of operations
    seconds = np.bincount(rank_step, weights=duration, minlength=n_ranks * n_steps).reshape(n_ranks, n_steps)
    log_duration = np.log(np.maximum(duration, 1e-9))
    del duration
    slots = grid_slots(rank_step, op_code, position, n_ranks * n_steps)
    if slots is not None and not np.isnan(log_duration).any():  # every rank ran the same operations each step
        del rank, step, op_code, position
        grid = log_duration.reshape(n_ranks, n_steps, slots)
        del log_duration
        versus_peers, versus_own = (v.reshape(-1) for v in versus_peers_and_own(grid, peer_of, replica_of))
        del grid
        relative = _robust_cell_mean(versus_peers, rank_step, n_ranks, n_steps, slots)
        del versus_peers
        return relative, _robust_cell_mean(versus_own, rank_step, n_ranks, n_steps, slots), seconds
    peers = peer_of.astype(index_type(len(peer_of)))[rank]
    versus_peers = log_duration - group_median(log_duration, peers, step, op_code, position)
    del peers
    own = log_duration - group_median(log_duration, rank, op_code, position)
    del log_duration
    # the replica's shared change, for replicas of three or more ranks (a median of two would split a fault)
    large = np.bincount(replica_of)[replica_of[rank]] >= 3
    common = group_median(own, np.where(large, replica_of[rank] + 1, 0), step, op_code, position)
    if not large.all():  # ranks of small replicas: what every rank shares in the step (drift)
        common = np.where(large, common, group_median(own, step, op_code, position))
    del rank, large, step, op_code, position
    versus_own = own
    versus_own -= common
    del own, common
    relative = _robust_cell_mean(versus_peers, rank_step, n_ranks, n_steps)
    del versus_peers
    change = _robust_cell_mean(versus_own, rank_step, n_ranks, n_steps)
    return relative, change, seconds


def _time_order(cell: np.ndarray, rank_step: np.ndarray, start: np.ndarray) -> np.ndarray | None:
    """The order of the rows by ``cell``, then ``start`` (ties as they come), as ``np.lexsort((start, cell))``
    gives it; None when they are in that order already.

    Traces are mostly written rank by rank and step by step in time order: then each cell's rows (a subset of
    its rank and step's) are in time order already, and a stable sort of the cells alone gives the same
    order several times faster.
    """
    if np.all(cell[1:] >= cell[:-1]) and np.all((cell[1:] != cell[:-1]) | (start[1:] >= start[:-1])):
        return None
    step_changes = rank_step[1:] != rank_step[:-1]
    if np.all(rank_step[1:] >= rank_step[:-1]) and np.all(step_changes | (start[1:] >= start[:-1])):
        return np.argsort(cell, kind="stable")
    return np.lexsort((start, cell))


def _robust_cell_mean(
    values: np.ndarray, cell: np.ndarray, n_ranks: int, n_steps: int, slots: int | None = None
) -> np.ndarray:
    """Mean of ``values`` per (rank, step) cell without the values > 4 robust sigmas from the cell median.
    ``slots``: each cell's count when the values are cell after cell, as many in each (:func:`.grid_slots`)."""
    if slots is None:
        median = pd.Series(values).groupby(cell).transform("median").to_numpy()
    else:
        median = np.repeat(median_along(values.reshape(-1, slots), axis=1), slots)
    spread = 1.4826 * float(np.median(np.abs(values - median))) or 1e-6
    kept = np.abs(values - median) <= 4.0 * spread
    total = np.bincount(cell[kept], weights=values[kept], minlength=n_ranks * n_steps)
    count = np.bincount(cell[kept], minlength=n_ranks * n_steps)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (total / count).reshape(n_ranks, n_steps)


def _transfers(
    records: pd.DataFrame,
    op_column: _Ops,
    instances: _Instances,
    kinds: np.ndarray,
    member_rank: np.ndarray,
    rank_hosts: np.ndarray,
    step_code: np.ndarray,
    peer_of: np.ndarray,
    usual_steps: int = 0,
) -> Transfers:
    """Inter-host instances with log(transfer time / median of the instances of their class), the median of
    those in the first ``usual_steps`` steps where the class has any there.

    A class is the same operation (sends and receives alike), group kind, size
    and member count between the same peer groups, at the same position among
    the group's instances in a step: say the third transfer between stages 2 and
    3 of every replica and step. Instances of one class do the same work on
    different hardware, so a slow path stands out against them.
    """
    n = len(instances.size)
    if (rank_hosts == "").all():  # hosts unknown: everything but tensor parallelism crosses hosts
        inter = kinds[instances.group] != "tp"
    else:
        host_code = pd.factorize(rank_hosts)[0].astype(index_type(len(rank_hosts)))
        low, high = extent(instances.instance, host_code[member_rank], n)
        inter = high > low
    # only inter-host instances are kept: their classes are keyed and their medians taken, the others dropped
    kept = np.flatnonzero(inter).astype(index_type(n))
    rows = instances.rows[instances.last_row[kept]]
    # the class key, one part after another (each an array per kept instance, dropped once added; the largest
    # temporaries first, while the fewest parts are held)
    if "bytes" in records:
        size_code, sizes = pd.factorize(records["bytes"].array.take(rows), use_na_sentinel=False)
    else:
        size_code, sizes = np.zeros(len(rows), dtype=np.int64), pd.array([pd.NA], dtype="Int64")
    # sends and receives are one operation here: a point-to-point transfer
    op_code, op_values = pd.factorize(np.where(op_column.among(("send", "recv"))[rows], -1, op_column.codes[rows]))
    step = step_code[rows]
    del rows
    # the message (size, then operation): the class's first parts, and what its sentence names (:mod:`.wording`)
    key = combined(combined(None, size_code), op_code)
    del size_code, op_code
    message, distinct = small_codes(key)
    messages = tuple(
        Message(op_column.name(int(op_values[code % len(op_values)])), _nbytes(sizes[code // len(op_values)]))
        for code in distinct.tolist()
    )
    key = combined(key, pd.factorize(kinds)[0][instances.group[kept]])
    key = combined(key, instances.size[kept])
    for bound in extent(instances.instance, peer_of.astype(index_type(len(peer_of)))[member_rank], n):
        key = combined(key, bound[kept])
    del bound
    key = combined(key, positions(instances.group, step_code[instances.rows[instances.last_row]], instances.seq)[kept])
    excess = np.log(np.maximum(instances.shortest[kept], 1e-9))
    del kept
    median = median_by(excess, key)
    usual = step < usual_steps
    if usual.any():
        in_usual = pd.Series(median_by(excess[usual], key[usual])).groupby(key[usual]).first()
        median = np.where(np.isin(key, in_usual.index), pd.Series(key).map(in_usual).to_numpy(), median)
    del key
    excess -= median
    del median
    renumber = np.cumsum(inter, dtype=index_type(n))  # the kept instances' new numbers, from 1
    renumber -= 1
    member_keep = inter[instances.instance]
    member_rank = member_rank[member_keep]
    member_instance = instances.instance[member_keep]
    del member_keep
    return Transfers(excess, step, message, messages, renumber[member_instance], member_rank)


def _nbytes(value: object) -> int | None:
    """A ``bytes`` value as an int, None where the trace leaves it out."""
    return None if pd.isna(value) else int(value)  # type: ignore[call-overload]
