"""Scoring a localization answer against the ground truth, and the naive baselines a user would try first.

A right answer has an accepted verdict and, for a fault, the top suspect among the
truth's components. Under a ``compute`` or ``communication`` verdict the top suspect
and every suspect scored 0.5 or more are blamed; false blame is any blamed suspect in
a control run, or a blamed suspect that does not cover the target in a fault run.

>>> from trainhealth_lab.realrun.spec import CaseSpec, Fault, RealRunFaultKind, Parallelism, truth
>>> t = truth(CaseSpec("c", Parallelism.DDP, 4, 30, 0, Fault(RealRunFaultKind.COMPUTE, target=1, onset=5, severity=2.0)))
>>> s = score_answer(t, "compute", [("gpu:rank-1", (1,), 0.9), ("gpu:rank-3", (3,), 0.3)])
>>> s.verdict_right, s.top1_right, s.false_blame
(True, True, False)
>>> score_answer(t, "compute", [("gpu:rank-1", (1,), 0.9), ("gpu:rank-3", (3,), 0.6)]).false_blame
True
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from trainhealth._internal.traces.ops import COMMUNICATION_OPS
from trainhealth_lab.realrun.spec import Truth

__all__ = [
    "BLAME_SCORE",
    "BASELINE_MARGIN",
    "AnswerScore",
    "baseline_compute",
    "baseline_wait",
    "score_answer",
    "score_result",
]

#: A suspect at this score or more is blamed (docs/trace-format.md: 0.5 is the threshold).
BLAME_SCORE = 0.5
#: The naive baselines blame a rank only when it stands this far (relative) from the median rank.
BASELINE_MARGIN = 0.10


@dataclass(frozen=True)
class AnswerScore:
    verdict: str
    top: str | None  # the top suspect's component
    blamed: tuple[str, ...]
    verdict_right: bool
    top1_right: bool | None  # None for controls (nothing to name)
    false_blame: bool

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["blamed"] = list(self.blamed)
        return out


def _covers(truth: Truth, component: str | None, ranks: Sequence[int]) -> bool:
    if component is not None and component in truth.components:
        return True
    return (
        truth.target is not None
        and tuple(ranks) == (truth.target,)
        and truth.kind.startswith("link")
        and (component is None or not component.startswith("gpu:"))
    )


def score_answer(
    truth: Truth,
    verdict: str,
    suspects: Iterable[tuple[str | None, Sequence[int], float]],
    events: Iterable[tuple[str | None, Sequence[int]]] = (),
) -> AnswerScore:
    """Score ``verdict`` and ``suspects`` ((component, ranks, score), best first) against ``truth``; for a fault
    that came and went (transient), the first of ``events`` ((component, ranks)) naming it is top-1 when nobody
    is blamed."""
    suspects = list(suspects)
    events = list(events)
    blamed = []
    if verdict in ("compute", "communication"):  # the top suspect of a blaming verdict is blamed whatever its score
        blamed = [(c, r) for i, (c, r, s) in enumerate(suspects) if i == 0 or s >= BLAME_SCORE]
    top = suspects[0][0] if suspects else None
    verdict_right = verdict in truth.accepted_verdicts
    if truth.target is None:
        return AnswerScore(verdict, top, tuple(str(c) for c, _ in blamed), verdict_right, None, bool(blamed))
    top1 = bool(blamed) and _covers(truth, blamed[0][0], blamed[0][1])
    if not blamed and events and (truth.fault or {}).get("pattern") == "transient":
        top1 = _covers(truth, events[0][0], events[0][1])
    wrong = any(truth.target not in tuple(r) for _, r in blamed)
    return AnswerScore(verdict, top, tuple(str(c) for c, _ in blamed), verdict_right, top1, wrong)


def score_result(truth: Truth, result: Any) -> AnswerScore:
    """Score a :class:`~trainhealth._internal.localize.result.LocalizationResult`."""
    suspects = [(s.component, tuple(s.ranks), float(s.score)) for s in result.suspects]
    events = [(e.get("component"), tuple(e.get("ranks", ()))) for e in result.details.get("events", [])]
    return score_answer(truth, str(result.verdict), suspects, events)


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


def score_baseline(truth: Truth, rank: int | None) -> AnswerScore:
    """A baseline's answer: compute blame of ``rank``, or healthy when it names no one."""
    if rank is None:
        return score_answer(truth, "healthy", [])
    verdict = "communication" if truth.kind.startswith("link") else "compute"
    component = f"nic:rank-{rank}" if verdict == "communication" else f"gpu:rank-{rank}"
    return score_answer(truth, verdict, [(component, (rank,), 1.0)])
