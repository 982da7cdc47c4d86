"""Training iterations in a trace without step markers, from the repeating pattern of its collectives.

A training step issues the same collectives in the same order every time, so
each rank's sequence of (op, group, bytes) repeats with the period of one step;
where one kind of collective repeats within a step (DDP's equal-sized buckets),
the pause before each step's first collective (forward, the optimizer) tells
where the steps begin.
The shortest period that the sequence keeps (allowing the first step, where DDP
rebuilds its buckets, to differ) numbers the steps: step = position // period.
When no period holds, the steps cannot be told apart and the caller says so
("insufficient data"), never "healthy".

>>> import pandas as pd
>>> rows = [{"rank": r, "step": 0, "op": "all_reduce", "group": "dp", "seq": 2 * i + j, "start": float(2 * i + j),
...          "duration": 0.1, "bytes": (1 << 20) if j == 0 else 4096} for r in (0, 1) for i in range(6) for j in (0, 1)]
>>> found = infer_steps(pd.DataFrame(rows))
>>> found.period, found.records["step"].nunique()
({0: 2, 1: 2}, 6)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from trainhealth._internal.traces.format import COMMUNICATION_OPS

__all__ = ["Iterations", "infer_steps", "needs_inference"]

#: share of positions that must repeat one period later (the first step may differ: DDP rebuilds buckets)
_MATCH = 0.9
#: iterations the pattern must repeat to count as found
_MIN_REPEATS = 3
#: the compute before each iteration of a period of several: within this share of the longest
_SAME_COMPUTE = 0.67


@dataclass(frozen=True)
class Iterations:
    """The records renumbered by inferred step (``records``), or why that was impossible (``problem``)."""

    records: pd.DataFrame | None
    period: dict[int, int]  # per rank: collectives per step
    problem: str | None = None


def needs_inference(records: pd.DataFrame) -> bool:
    """True when the trace has no step markers and every collective carries the same step."""
    if (records["op"] == "step").any():
        return False
    communication = records["op"].isin(COMMUNICATION_OPS)
    return bool(communication.any()) and records.loc[communication, "step"].nunique() <= 1


def infer_steps(records: pd.DataFrame) -> Iterations:
    """Renumber ``step`` from each rank's repeating sequence of collectives (computation rows are dropped)."""
    communication = records[records["op"].isin(COMMUNICATION_OPS)].sort_values(["rank", "start"], kind="stable")
    if communication.empty:
        return Iterations(None, {}, "the trace has no collectives to find iterations in")
    nbytes = communication["bytes"] if "bytes" in communication.columns else pd.Series(-1, index=communication.index)
    signature = pd.factorize(
        communication["op"].astype(str)
        + "|"
        + communication["group"].astype(str)
        + "|"
        + pd.to_numeric(nbytes, errors="coerce").fillna(-1).astype(np.int64).astype(str)
    )[0]
    ranks = communication["rank"].to_numpy()
    steps = np.empty(len(communication), dtype=np.int64)
    periods: dict[int, int] = {}
    boundaries = np.flatnonzero(np.r_[True, ranks[1:] != ranks[:-1], True])
    starts = communication["start"].to_numpy(dtype=np.float64)
    ends = starts + communication["duration"].to_numpy(dtype=np.float64)
    patterns: dict[int, tuple[int, int, int, tuple[int, ...] | None]] = {}  # rank -> (begin, period, phase, split)
    for begin, end in zip(boundaries[:-1], boundaries[1:]):
        rank = int(ranks[begin])
        # collectives of one kind and size (DDP's equal buckets) repeat every collective: the long pause before
        # each step's first one (forward, the optimizer, data loading) marks where a step begins
        pauses = _after_pause(starts[begin:end])
        paced = _period(signature[begin:end] * 2 + pauses)
        period = paced if paced is not None else _period(signature[begin:end])
        if period is None:
            return Iterations(
                None,
                {},
                f"rank {rank}'s {end - begin} collectives do not repeat in a pattern "
                f"(no step markers: record steps with trainhealth.Monitor or mon.step())",
            )
        # a step begins where the pauses fall (collectives before the first one, at set-up, join step 0)
        phase = int(np.argmax([pauses[offset::period].sum() for offset in range(period)])) if paced else 0
        split = _iterations_in_period(signature[begin:end], starts[begin:end], ends[begin:end], period, phase)
        patterns[rank] = (int(begin), period, phase, split)
    # a period of several iterations (an explicit loop with a barrier every k-th) is split where its iterations
    # begin, when every rank agrees on how many it holds
    splits = {len(split) if split else 1 for _, _, _, split in patterns.values()}
    for rank, (begin, period, phase, split) in patterns.items():
        firsts = split if split and len(splits) == 1 else (0,)
        periods[rank] = period
        position = np.arange(int(np.sum(ranks == rank)))
        begins = (position >= phase) & np.isin((position - phase) % period, firsts)
        steps[begin : begin + len(position)] = np.maximum(np.cumsum(begins) - (0 if phase else 1), 0)
    counts = pd.Series(steps).groupby(ranks).max() + 1
    if counts.max() - counts.min() > 1:
        return Iterations(
            None,
            periods,
            f"the ranks' inferred iteration counts differ ({counts.min()}-{counts.max()}): "
            f"their traces do not cover the same steps",
        )
    out = communication.copy()
    out["step"] = steps
    return Iterations(out.reset_index(drop=True), periods)


def _iterations_in_period(
    signature: np.ndarray, starts: np.ndarray, ends: np.ndarray, period: int, phase: int
) -> tuple[int, ...] | None:
    """Where, within one period of the pattern, iterations begin when it holds several: the positions before
    which the rank computes (is idle between collectives) about as long in every period, each the same
    collective. None when the period is one iteration (DDP's buckets: different sizes, backward's chunks
    between them shorter than forward and the optimizer before the first).

    >>> starts = np.array([0.0, 1.0, 1.01, 2.0, 3.0, 3.01, 4.0, 5.0, 5.01, 6.0, 7.0, 7.01])  # AR | AR B | ...
    >>> _iterations_in_period(np.tile([0, 0, 1], 4), starts, starts + 0.005, period=3, phase=0)
    (0, 1)
    """
    repeats = (len(starts) - phase) // period
    if period < 2 or repeats < _MIN_REPEATS:
        return None
    reach = np.maximum.accumulate(ends)
    idle = np.maximum(starts - np.r_[-np.inf, reach[:-1]], 0.0)[phase : phase + repeats * period].reshape(
        repeats, period
    )
    typical = np.median(idle[1:] if repeats > 1 else idle, axis=0)  # the first period may hold set-up time
    if not np.isfinite(typical).all() or typical.max() <= 0:
        return None
    firsts = np.flatnonzero(typical >= _SAME_COMPUTE * typical.max())
    if len(firsts) < 2 or firsts[0] != 0 or len(set(signature[phase + firsts].tolist())) > 1:
        return None
    if (typical[np.setdiff1d(np.arange(period), firsts)] >= 0.5 * typical[firsts].min()).any():
        return None  # a gap neither like the iterations' compute nor clearly shorter: no clean cut
    return tuple(int(f) for f in firsts)


def _after_pause(starts: np.ndarray) -> np.ndarray:
    """1 for a collective that starts after a pause three times the rank's median gap between collectives."""
    gaps = np.diff(starts, prepend=starts[0])
    typical = float(np.median(gaps[1:])) if len(gaps) > 1 else 0.0
    return (gaps > 3.0 * typical).astype(np.int64) if typical > 0 else np.zeros(len(starts), dtype=np.int64)


def _period(signature: np.ndarray) -> int | None:
    """The shortest p such that signature[i] == signature[i + p] for most i, repeated at least 3 times."""
    n = len(signature)
    first_seen = pd.Series(np.arange(n)).groupby(signature).transform("min").to_numpy()
    # a period is a distance between two occurrences of one signature: try those, shortest first
    candidates = np.unique(np.arange(n) - first_seen)
    for period in candidates[(candidates > 0) & (candidates * _MIN_REPEATS <= n)][:200]:
        if np.mean(signature[period:] == signature[:-period]) >= _MATCH:
            return int(period)
    return None
