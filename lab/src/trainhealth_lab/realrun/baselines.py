"""The naive baselines a user would try first, scored as the localizer is (:mod:`trainhealth_lab.scoring`).

>>> from trainhealth_lab.realrun.spec import CaseSpec, Parallelism, lab_fault, truth
>>> t = truth(CaseSpec("c", Parallelism.DDP, 4, 30, 0, lab_fault("compute", target=1, onset=5, severity=2.0)))
>>> s = score_baseline(t, 1)
>>> s.verdict_right, s.top1, s.false_blame
(True, True, False)
>>> score_baseline(t, 3).false_blame
True
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from trainhealth._internal.traces.ops import COMMUNICATION_OPS
from trainhealth_lab.realrun.spec import Truth
from trainhealth_lab.scoring import Score, score

__all__ = ["BASELINE_MARGIN", "baseline_compute", "baseline_wait", "score_baseline"]

#: The naive baselines blame a rank only when it stands this far (relative) from the median rank.
BASELINE_MARGIN = 0.10


def _per_rank_step(records: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Per (rank, step): time outside collectives (from ``step`` rows when there are, else the records' span)
    and the mean collective duration."""
    comm = records[records["op"].isin(COMMUNICATION_OPS)]
    in_comm = comm.groupby(["rank", "step"])["duration"].sum()
    if (records["op"] == "step").any():
        wall = records[records["op"] == "step"].groupby(["rank", "step"])["duration"].sum()
    else:
        ends = records["start"] + records["duration"]
        frame = records.assign(end=ends)
        span = frame.groupby(["rank", "step"]).agg(first=("start", "min"), last=("end", "max"))
        wall = span["last"] - span["first"]
    outside = (wall - in_comm.reindex(wall.index, fill_value=0.0)).clip(lower=0.0)
    return outside, comm.groupby(["rank", "step"])["duration"].mean()


def _pick(per_rank: pd.Series, largest: bool) -> int | None:
    if per_rank.empty or len(per_rank) < 2:
        return None
    median = float(np.median(per_rank.to_numpy()))
    rank = int(per_rank.idxmax() if largest else per_rank.idxmin())
    value = float(per_rank[rank])
    if median <= 0:
        return rank if value > 0 and largest else None
    deviation = (value - median) / median
    return rank if (deviation > BASELINE_MARGIN if largest else -deviation > BASELINE_MARGIN) else None


def baseline_compute(records: pd.DataFrame) -> int | None:
    """Naive: the rank with the largest mean time outside collectives per step (if 10% above the median rank)."""
    outside, _ = _per_rank_step(records)
    return _pick(outside.groupby(level="rank").mean(), largest=True)


def baseline_wait(records: pd.DataFrame) -> int | None:
    """Naive: the rank whose collectives are shortest on average — the one the others wait for (if 10% below)."""
    _, mean_comm = _per_rank_step(records)
    return _pick(mean_comm.groupby(level="rank").mean(), largest=False)


def score_baseline(truth: Truth, rank: int | None) -> Score:
    """A baseline's answer: blame of ``rank`` in the fault's class, or healthy when it names no one."""
    if rank is None:
        return score(truth.expected(), "healthy", [])
    verdict = "communication" if truth.kind.link else "compute"
    component = f"nic:rank-{rank}" if verdict == "communication" else f"gpu:rank-{rank}"
    return score(truth.expected(), verdict, [(component, (rank,), 1.0)])
