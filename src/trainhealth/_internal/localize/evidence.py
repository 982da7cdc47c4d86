"""Evidence for localization: per-rank and per-transfer matrices from trace records, in numpy.

Three kinds of evidence, following Holmes's reading of collective timings:

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
  share of its collectives it was last to, for the evidence text.
* **Transfer excess** (Holmes's communication rule): the last member to arrive
  did not wait, so its duration is the transfer time; when even that is long,
  every member looks abnormal and the path is at fault. Kept per inter-host
  instance as log(transfer time / the median of its class), with its members,
  so a NIC, a host or a switch can be scored by the transfers that cross it.

Replicas (the ranks of one data-parallel replica, joined by tensor, context and
pipeline groups) are found too: work that is uneven between replicas, such as
longer sequences in one of them, moves a whole replica and is not one GPU's fault.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from trainhealth._internal.traces.format import COMMUNICATION_OPS

__all__ = [
    "COMPUTE_OPS",
    "Evidence",
    "Transfers",
    "covered",
    "gather_evidence",
    "group_kind",
    "last_steps",
    "rank_hosts",
]

_KIND = re.compile(r"^(tp|dp|pp|ep|cp|emb|sp)(?=[-:_.]|\d|$)")
COMPUTE_OPS = ("forward", "backward", "optimizer", "compute")
_PASSES = ("forward", "backward")
#: peer groups come from the first kind present: data-parallel replicas do the same work
_PEER_KINDS = ("dp", "tp", "cp", "other")


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
class Transfers:
    """Inter-host collective instances: their transfer excess and who took part."""

    excess: np.ndarray  # per instance: log(transfer time / the median of its class)
    step: np.ndarray  # per instance: index into Evidence.steps
    member_instance: np.ndarray  # per membership: the instance
    member_rank: np.ndarray  # per membership: index into Evidence.ranks


@dataclass(frozen=True)
class Evidence:
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


def gather_evidence(
    records: pd.DataFrame, hosts: Mapping[int, str] | None = None, switches: Mapping[int, str] | None = None
) -> Evidence:
    """Evidence from ``records`` (trace format v1 with canonical dtypes)."""
    rank_code, ranks = _small_codes(records["rank"].to_numpy(dtype=np.int64))
    step_code, steps = _small_codes(records["step"].to_numpy(dtype=np.int64))
    n_ranks, n_steps = len(ranks), len(steps)
    duration = records["duration"].to_numpy(dtype=np.float64)
    start = records["start"].to_numpy(dtype=np.float64)
    op = _Ops(records["op"])
    host_of = rank_hosts(records, hosts)
    switch_of = {int(r): str(s) for r, s in (switches or {}).items()}

    first, span = _spans(rank_code, step_code, start, duration, n_ranks, n_steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # steps no rank has records in
        step_time = np.nan_to_num(np.nanmedian(span, axis=0), nan=0.0)
    instances = _instances(records, op)
    kinds = np.array([group_kind(name) for name in instances.group_names])
    member_rank = rank_code[instances.rows]
    peer_of, peer_kind = _peer_groups(kinds[instances.group], member_rank, instances.group, n_ranks)
    member_kind = kinds[instances.group]
    # a replica: the ranks joined by the groups that are neither peer nor expert groups (those span replicas)
    replica_of = _joined(instances.group, member_rank, ~np.isin(member_kind, (peer_kind, "ep")), n_ranks)
    # ranks in lockstep: joined by tensor- and context-parallel groups (one layer's shards)
    lockstep_of = _joined(
        instances.group, member_rank, np.isin(member_kind, ("tp", "cp")) & (peer_kind != "tp"), n_ranks
    )

    last_count = np.bincount(member_rank[instances.last_row], minlength=n_ranks)
    taken = np.bincount(member_rank, minlength=n_ranks)

    chosen = op.among(_PASSES)
    if not chosen.any():
        chosen = op.among(COMPUTE_OPS)
    derived = not chosen.any()
    if derived:  # collectives only: what a rank spends outside them is its compute
        # sends are left out: a sender computes on while its send waits for the receiver
        rows = instances.rows[~op.among(("send",))[instances.rows]]
        in_collectives = covered(
            rank_code[rows] * n_steps + step_code[rows], start[rows], duration[rows], n_ranks * n_steps
        )
        # a step computes, then communicates: from the end of the rank's previous step to the end of this one,
        # so the compute before a step's first collective counts (the first step has no earlier end)
        iteration = np.full((n_ranks, n_steps), np.nan)
        iteration[:, 1:] = (first + span)[:, 1:] - (first + span)[:, :-1]
        busy = np.maximum(iteration.reshape(-1) - in_collectives, 0.0)
        cells = np.flatnonzero(np.isfinite(busy))
        compute, compute_change, compute_seconds = _compute(
            cells // n_steps,
            cells % n_steps,
            np.full(len(cells), "compute", dtype=object),
            first.reshape(-1)[cells],
            busy[cells],
            peer_of,
            replica_of,
            n_ranks,
            n_steps,
        )
    else:
        compute, compute_change, compute_seconds = _compute(
            rank_code[chosen],
            step_code[chosen],
            op.names(chosen),
            start[chosen],
            duration[chosen],
            peer_of,
            replica_of,
            n_ranks,
            n_steps,
        )

    host_names = np.array([host_of.get(int(r), "") for r in ranks])
    transfers = _transfers(records, op, instances, kinds, member_rank, host_names, step_code, peer_of)
    return Evidence(
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


def last_steps(evidence: Evidence, count: int) -> Evidence:
    """The evidence of the last ``count`` steps only (the window a live analyzer judges), cut from evidence
    gathered over a longer history, so that each rank's usual comes from the history."""
    first = max(len(evidence.steps) - count, 0)
    columns = slice(first, None)
    transfers = evidence.transfers
    kept = transfers.step >= first
    renumber = np.full(len(kept), -1)
    renumber[kept] = np.arange(int(kept.sum()))
    members = kept[transfers.member_instance]
    return replace(
        evidence,
        steps=evidence.steps[columns],
        step_time=evidence.step_time[columns],
        compute=evidence.compute[:, columns],
        compute_change=evidence.compute_change[:, columns],
        compute_seconds=evidence.compute_seconds[:, columns],
        transfers=Transfers(
            excess=transfers.excess[kept],
            step=transfers.step[kept] - first,
            member_instance=renumber[transfers.member_instance[members]],
            member_rank=transfers.member_rank[members],
        ),
    )


def _small_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes of non-negative integers (ranks, steps) in sorted order, by table lookup when their range is small."""
    distinct = np.sort(pd.unique(values))
    if len(distinct) and distinct[-1] < 50_000_000:
        table = np.zeros(int(distinct[-1]) + 1, dtype=np.int64)
        table[distinct] = np.arange(len(distinct))
        return table[values], distinct
    return np.searchsorted(distinct, values).astype(np.int64), distinct


def _codes(values: np.ndarray | pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes of ``values`` in sorted order of the distinct values (hashing, not sorting, the rows)."""
    codes, uniques = pd.factorize(values, sort=True)
    return codes.astype(np.int64), np.asarray(uniques)


def _strings(column: pd.Series) -> np.ndarray:
    """A string column as a numpy array of ``str`` (cheap for categoricals: only the categories are converted)."""
    categorical = pd.Categorical(column)
    names = np.append(np.asarray(categorical.categories.astype(str), dtype=object), "")  # "" for missing values
    return names[np.where(categorical.codes >= 0, categorical.codes, len(names) - 1)]


def rank_hosts(records: pd.DataFrame, hosts: Mapping[int, str] | None) -> dict[int, str]:
    """rank -> host: the given mapping, completed from the records' ``host`` column."""
    found: dict[int, str] = {int(r): str(h) for r, h in (hosts or {}).items()}
    if "host" in records.columns:
        pairs = records[["rank", "host"]].dropna().drop_duplicates("rank")
        for rank, host in zip(pairs["rank"].to_numpy(), pairs["host"].astype(str).to_numpy()):
            found.setdefault(int(rank), host)
    return found


def covered(cell: np.ndarray, start: np.ndarray, duration: np.ndarray, n_cells: int) -> np.ndarray:
    """Per cell, the time covered by at least one of its intervals (overlapping sends and receives once)."""
    order = np.lexsort((start, cell))
    cell, begin, end = cell[order], start[order], (start + duration)[order]
    reach = pd.Series(end).groupby(cell).cummax().to_numpy()  # the furthest end so far in the cell
    before = np.r_[-np.inf, reach[:-1]]
    before[np.r_[True, cell[1:] != cell[:-1]]] = -np.inf  # nothing before the first interval of a cell
    added = np.maximum(end - np.maximum(begin, before), 0.0)
    return np.bincount(cell, weights=added, minlength=n_cells)


def _spans(
    rank_code: np.ndarray, step_code: np.ndarray, start: np.ndarray, duration: np.ndarray, n_ranks: int, n_steps: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per rank and step: when its first record starts, and how long its records span (NaN if none)."""
    cell = rank_code * n_steps + step_code
    first = np.full(n_ranks * n_steps, np.inf)
    last = np.full(n_ranks * n_steps, -np.inf)
    np.minimum.at(first, cell, start)
    np.maximum.at(last, cell, start + duration)
    span = (last - first).reshape(n_ranks, n_steps)
    span[~np.isfinite(span)] = np.nan
    return first.reshape(n_ranks, n_steps), span


@dataclass(frozen=True)
class _Instances:
    rows: np.ndarray  # record rows of members of multi-member instances
    instance: np.ndarray  # per member row: instance index
    group: np.ndarray  # per member row: group code
    group_names: np.ndarray
    size: np.ndarray  # per instance: members
    median: np.ndarray  # per instance: median member duration
    shortest: np.ndarray  # per instance: the last arrival's duration (the transfer time)
    last_row: np.ndarray  # per instance: index into rows of the member with the shortest duration


def _instances(records: pd.DataFrame, op: _Ops) -> _Instances:
    is_comm = op.among(COMMUNICATION_OPS) & records["group"].notna().to_numpy() & records["seq"].notna().to_numpy()
    rows = np.flatnonzero(is_comm)
    group, group_names = _codes(_strings(records["group"])[rows])
    seq = records["seq"].to_numpy()[rows].astype(np.int64)
    instance = pd.factorize(group * (int(seq.max()) + 1 if len(seq) else 1) + seq)[0]
    multi = np.bincount(instance)[instance] >= 2
    rows, group, instance = rows[multi], group[multi], instance[multi]
    instance = pd.factorize(instance)[0]
    size = np.bincount(instance)
    by_instance = pd.Series(records["duration"].to_numpy(dtype=np.float64)[rows]).groupby(instance)
    return _Instances(
        rows,
        instance,
        group,
        group_names,
        size,
        by_instance.median().to_numpy(),
        by_instance.min().to_numpy(),
        by_instance.idxmin().to_numpy(),
    )


class _Ops:
    """The ``op`` column as codes into its few distinct names: masks without comparing millions of strings."""

    def __init__(self, column: pd.Series) -> None:
        categorical = pd.Categorical(column)
        self._codes = categorical.codes
        self._names = np.asarray(categorical.categories.astype(str), dtype=object)

    def among(self, wanted: tuple[str, ...]) -> np.ndarray:
        return (self._codes >= 0) & np.isin(self._names, wanted)[np.maximum(self._codes, 0)]

    def names(self, rows: np.ndarray | None = None) -> np.ndarray:
        codes = self._codes if rows is None else self._codes[rows]
        return np.where(codes >= 0, self._names[np.maximum(codes, 0)], "")


def _peer_groups(
    member_kind: np.ndarray, member_rank: np.ndarray, member_group: np.ndarray, n_ranks: int
) -> tuple[np.ndarray, str]:
    """Per rank the index of its peer group: the members of its data-parallel group (else tp, cp, any)."""
    for kind in _PEER_KINDS:
        chosen = member_kind == kind
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
    group_code, _ = _codes(groups)
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
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per rank and step: log compute time relative to peers, relative to the rank's own usual, and seconds.

    The k-th forward of a rank in a step is compared with the k-th forward of its
    peers in the same step, and with its own k-th forward in the other steps (the
    change). From the change, what the rank's whole replica shares in that
    operation (the micro-batch's sequence length; drift) is removed. Each is
    averaged per rank and step leaving out single operations far from the cell's
    median (a GC pause, a page fault).
    """
    op_code = pd.factorize(op)[0]
    order = np.lexsort((start, op_code, step, rank))
    rank, step, op_code, duration = rank[order], step[order], op_code[order], duration[order]
    cell = (rank * n_steps + step) * (op_code.max() + 1) + op_code
    boundary = np.r_[True, cell[1:] != cell[:-1]]
    position = np.arange(len(cell)) - np.maximum.accumulate(np.where(boundary, np.arange(len(cell)), 0))
    log_duration = np.log(np.maximum(duration, 1e-9))
    frame = pd.DataFrame(
        {"peer": peer_of[rank], "rank": rank, "step": step, "op": op_code, "k": position, "log": log_duration}
    )
    rank_step = rank * n_steps + step
    versus_peers = (
        log_duration - frame.groupby(["peer", "step", "op", "k"], sort=False)["log"].transform("median").to_numpy()
    )
    frame["own"] = log_duration - frame.groupby(["rank", "op", "k"], sort=False)["log"].transform("median").to_numpy()
    # the replica's shared change, for replicas of three or more ranks (a median of two would split a fault)
    large = np.bincount(replica_of)[replica_of[rank]] >= 3
    frame["replica"] = np.where(large, replica_of[rank], -1)
    common = frame.groupby(["replica", "step", "op", "k"], sort=False)["own"].transform("median").to_numpy()
    if not large.all():  # ranks of small replicas: what every rank shares in the step (drift)
        everyone = frame.groupby(["step", "op", "k"], sort=False)["own"].transform("median").to_numpy()
        common = np.where(large, common, everyone)
    versus_own = frame["own"].to_numpy() - common
    relative = _robust_cell_mean(versus_peers, rank_step, n_ranks, n_steps)
    change = _robust_cell_mean(versus_own, rank_step, n_ranks, n_steps)
    seconds = np.bincount(rank_step, weights=duration, minlength=n_ranks * n_steps).reshape(n_ranks, n_steps)
    return relative, change, seconds


def _robust_cell_mean(values: np.ndarray, cell: np.ndarray, n_ranks: int, n_steps: int) -> np.ndarray:
    """Mean of ``values`` per (rank, step) cell without the values > 4 robust sigmas from the cell median."""
    median = pd.Series(values).groupby(cell).transform("median").to_numpy()
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
) -> Transfers:
    """Inter-host instances with log(transfer time / median of the instances of their class).

    A class is the same operation (sends and receives alike), group kind, size
    and member count between the same peer groups, at the same position among
    the group's instances in a step: say the third transfer between stages 2 and
    3 of every replica and step. Instances of one class do the same work on
    different hardware, so a slow path stands out against them.
    """
    first = instances.last_row
    n = len(instances.size)
    host_code = pd.factorize(rank_hosts)[0][member_rank]
    if (rank_hosts == "").all():  # hosts unknown: everything but tensor parallelism crosses hosts
        inter = kinds[instances.group[first]] != "tp"
    else:
        low = np.full(n, np.iinfo(np.int64).max)
        high = np.full(n, -1)
        np.minimum.at(low, instances.instance, host_code)
        np.maximum.at(high, instances.instance, host_code)
        inter = high > low
    rows = instances.rows[first]
    nbytes = records["bytes"].to_numpy()[rows] if "bytes" in records.columns else np.zeros(n)
    op = op_column.names(rows)
    member_peer = peer_of[member_rank]
    low_peer = np.full(n, np.iinfo(np.int64).max)
    high_peer = np.full(n, -1)
    np.minimum.at(low_peer, instances.instance, member_peer)
    np.maximum.at(high_peer, instances.instance, member_peer)
    # the instance's position among its group's instances in the step (the first transfer of a step differs)
    group, step = instances.group[first], step_code[rows]
    seq = records["seq"].to_numpy()[rows].astype(np.int64)
    order = np.lexsort((seq, step, group))
    boundary = np.r_[True, (group[order][1:] != group[order][:-1]) | (step[order][1:] != step[order][:-1])]
    starts = np.maximum.accumulate(np.where(boundary, np.arange(n), 0))
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n) - starts
    classes = pd.DataFrame(
        {
            "op": np.where(np.isin(op, ("send", "recv")), "p2p", op),
            "kind": kinds[group],
            "bytes": pd.to_numeric(pd.Series(nbytes), errors="coerce").fillna(-1).to_numpy(),
            "size": instances.size,
            "inter": inter,
            "low": low_peer,
            "high": high_peer,
            "position": position,
        }
    )
    class_code = classes.groupby(list(classes.columns), sort=False).ngroup().to_numpy()
    shortest = np.maximum(instances.shortest, 1e-9)
    typical = pd.Series(np.log(shortest)).groupby(class_code).transform("median").to_numpy()
    excess = np.log(shortest) - typical
    keep = np.flatnonzero(inter)
    renumber = np.full(n, -1)
    renumber[keep] = np.arange(len(keep))
    member_keep = inter[instances.instance]
    return Transfers(
        excess=excess[keep],
        step=step_code[rows][keep],
        member_instance=renumber[instances.instance[member_keep]],
        member_rank=member_rank[member_keep],
    )
