"""Localization accuracy on simulated clusters: cases, scoring, threshold choice.

A case is one simulated window (20 steps, 4 micro-batches) of one layout with
one injected fault — a slow GPU, NIC, host network path or leaf switch at
severity 1.02 to 3, persistent (from a step between 4 and 10 to the end) or
transient (3 to 6 steps) — or a negative control (fault-free, a longer last
stage, varying sequence lengths). Layouts cover 3-D to 5-D parallelism at each
scale. Everything is seeded: the same (scale, seed) gives the same cases.

Cases are scored by the one scorer (:mod:`trainhealth_lab.scoring`): a fault case is **top-1
correct** when the verdict names the fault's class (compute or communication) and the first
suspect is the faulty component (``gpu:rank-N``, ``nic:rank-N``, ``host:NAME`` or
``switch:NAME``), or, for a transient fault that left nobody blamed, the first event names it;
**top-3** when it is among the first three. A control run is **falsely blamed** when any suspect
is named. The naive baseline blames the rank whose operations took the
longest in total; it scores a hit when that rank is one of the fault's ranks.

>>> from trainhealth._internal.localize.localizer import Thresholds
>>> case = next(c for c in cases(64, seeds=[1]) if c.fault and c.fault.severity == 1.5)
>>> outcome = evaluate(case, Thresholds())
>>> outcome.top1, outcome.expected.components[0] == outcome.components[0]
(True, True)
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from trainhealth._internal.faults import Fault
from trainhealth._internal.localize.localizer import Analysis, Thresholds, analyze, decide
from trainhealth._internal.simulator.cluster import ClusterLayout
from trainhealth._internal.simulator.scenario import CLUSTER_FAULTS, Control, Scenario, cluster_fault
from trainhealth._internal.simulator.simulate import simulate
from trainhealth._internal.traces.ops import COMPUTATION_OPS
from trainhealth_lab.scoring import Expected, Score, score_result

__all__ = ["SCALES", "SEVERITIES", "Case", "Outcome", "cases", "evaluate", "judge", "summarize"]

SCALES: dict[int, tuple[ClusterLayout, ...]] = {
    64: (
        ClusterLayout(dp=4, pp=2, tp=8),
        ClusterLayout(dp=2, pp=2, tp=8, cp=2),
        ClusterLayout(dp=4, pp=2, tp=8, ep=2),
        ClusterLayout(dp=4, pp=4, tp=2, cp=2, ep=2),
    ),
    512: (
        ClusterLayout(dp=16, pp=4, tp=8),
        ClusterLayout(dp=8, pp=4, tp=8, cp=2),
        ClusterLayout(dp=16, pp=4, tp=8, ep=4),
        ClusterLayout(dp=8, pp=4, tp=4, cp=2, ep=2),
    ),
    2048: (
        ClusterLayout(dp=32, pp=8, tp=8),
        ClusterLayout(dp=16, pp=8, tp=8, cp=2),
        ClusterLayout(dp=32, pp=8, tp=8, ep=8),
        ClusterLayout(dp=16, pp=4, tp=8, cp=4, ep=4),
    ),
    8192: (
        ClusterLayout(dp=64, pp=16, tp=8),
        ClusterLayout(dp=32, pp=16, tp=8, cp=2),
        ClusterLayout(dp=64, pp=16, tp=8, ep=8),
        ClusterLayout(dp=32, pp=8, tp=8, cp=4, ep=4),
    ),
}
SEVERITIES = (1.02, 1.05, 1.1, 1.2, 1.5, 2.0, 3.0)
KINDS = CLUSTER_FAULTS
STEPS, MICROBATCHES = 20, 4


@dataclass(frozen=True)
class Case:
    scale: int
    layout: ClusterLayout
    seed: int
    fault: Fault | None
    control: Control = Control.NONE

    @property
    def pattern(self) -> str:
        if self.fault is None:
            return "control"
        return self.fault.pattern

    def scenario(self) -> Scenario:
        return Scenario(
            self.layout,
            steps=STEPS,
            microbatches=MICROBATCHES,
            seed=self.seed,
            faults=(self.fault,) if self.fault else (),
            control=self.control,
        )


def cases(
    scale: int,
    seeds: Iterable[int],
    severities: Sequence[float] = SEVERITIES,
    kinds: Sequence[str] = KINDS,
) -> list[Case]:
    """Per seed and layout of ``scale``: every kind at every severity, and the three controls."""
    out = []
    for seed in seeds:
        for position, layout in enumerate(SCALES[scale]):
            for kind in kinds:
                for severity in severities:
                    rng = np.random.default_rng(zlib.crc32(f"{scale}/{seed}/{position}/{kind}/{severity}".encode()))
                    out.append(Case(scale, layout, seed, _fault(layout, kind, severity, rng)))
            out += [Case(scale, layout, seed, None, control) for control in Control]
    return out


def _fault(layout: ClusterLayout, kind: str, severity: float, rng: np.random.Generator) -> Fault:
    limit = {
        "host": int(layout.host_of(layout.world - 1)) + 1,
        "switch": int(layout.leaf_of(layout.world - 1)) + 1,
    }.get(kind, layout.world)
    target = int(rng.integers(limit))
    if rng.random() < 0.5:
        return cluster_fault(layout, kind, target, severity, step=int(rng.integers(4, 11)))
    start = int(rng.integers(4, 12))
    return cluster_fault(layout, kind, target, severity, step=start, until=start + int(rng.integers(3, 7)) - 1)


@dataclass(frozen=True)
class Outcome:
    case: Case
    expected: Expected
    naive_rank: int
    seconds: float
    analysis: Analysis
    score: Score = Score("healthy", None, (), False, None, None, False)  # set by :func:`judge`

    @property
    def verdict(self) -> str:
        return self.score.verdict

    @property
    def components(self) -> tuple[str, ...]:
        """The suspects' components, best first."""
        return self.score.suspects

    @property
    def top1(self) -> bool:
        return bool(self.score.top1) if not self.expected.control else self.score.verdict_right

    @property
    def top3(self) -> bool:
        return bool(self.score.top3) if not self.expected.control else self.score.verdict_right

    @property
    def blamed(self) -> bool:
        return bool(self.score.blamed)

    @property
    def naive_hit(self) -> bool:
        return self.naive_rank in self.expected.ranks


def expected(truth: dict[str, Any], transient: bool) -> Expected:
    """What a right answer is for a simulated scenario's ground truth (:meth:`Scenario.ground_truth`): the
    first fault's component, first, under its class; a transient one may also leave the window healthy or
    without enough data, with an event naming it."""
    verdict = truth["verdict"]
    if not truth["faults"]:
        return Expected(verdict, (verdict,))
    fault = truth["faults"][0]
    accepted = (verdict, "healthy", "insufficient_data") if transient else (verdict,)
    return Expected(verdict, accepted, (fault["component"],), tuple(fault["ranks"]), transient=transient)


def evaluate(case: Case, thresholds: Thresholds, collectives_only: bool = False) -> Outcome:
    """Simulate ``case``, localize it and compare with the ground truth."""
    trace = simulate(case.scenario())
    records = trace.records
    if collectives_only:
        records = records[~records["op"].isin(COMPUTATION_OPS)].reset_index(drop=True)
    began = time.perf_counter()
    # analysed at the thresholds that judge it: which stretch of a rank is scored (a fault now before one that
    # ended) and the power (injections judged by the rules that blame) depend on them
    analysis = analyze(records, trace.topology, replace(thresholds, max_suspects=10))
    seconds = time.perf_counter() - began
    totals = records.groupby("rank", sort=False)["duration"].sum()
    base = Outcome(
        case, expected(trace.ground_truth, case.pattern == "transient"), int(totals.idxmax()), seconds, analysis
    )
    return judge(base, thresholds)


def judge(outcome: Outcome, thresholds: Thresholds) -> Outcome:
    """The outcome judged at ``thresholds`` from its analysis (made by :func:`evaluate` at the thresholds given
    there: which stretch is scored and the power depend on them)."""
    return replace(outcome, score=score_result(outcome.expected, decide(outcome.analysis, thresholds)))


def summarize(outcomes: Sequence[Outcome], by: str) -> pd.DataFrame:
    """Accuracy table grouped by ``by`` (scale, dims, kind, severity, pattern, control)."""
    rows = []
    for outcome in outcomes:
        case = outcome.case
        rows.append(
            {
                "scale": case.scale,
                "dims": case.layout.dimensions,
                "kind": case.fault.kind if case.fault else "control",
                "severity": case.fault.severity if case.fault else np.nan,
                "pattern": case.pattern,
                "control": case.control.value if case.fault is None else "-",
                "fault": case.fault is not None,
                "top1": outcome.top1,
                "top3": outcome.top3,
                "naive": outcome.naive_hit,
                "blamed": outcome.blamed,
                "verdict_ok": outcome.verdict == outcome.expected.verdict,
                "seconds": outcome.seconds,
            }
        )
    frame = pd.DataFrame(rows)
    faults, controls = frame[frame["fault"]], frame[~frame["fault"]]
    table = (
        faults.groupby(by).agg(
            cases=("top1", "size"), top1=("top1", "mean"), top3=("top3", "mean"), naive=("naive", "mean")
        )
        if len(faults) and by in faults
        else pd.DataFrame()
    )
    if by in ("scale", "dims", "control") and len(controls):
        blame = controls.groupby(by).agg(
            controls=("blamed", "size"), false_blame=("blamed", "mean"), verdict_ok=("verdict_ok", "mean")
        )
        table = blame if table.empty else table.join(blame, how="outer")
    return table
