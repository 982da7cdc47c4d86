"""The suites: which cases run, with onset, target and severity drawn from the seed.

>>> [c.name for c in suite_cases("small", seeds=(0,))][:2]
['s0-ddp-compute-persistent-r4', 's0-ddp-clean-r4']
>>> len(suite_cases("full", seeds=(0, 1, 2)))
72
>>> suite_cases("full", seeds=(1,)) == suite_cases("full", seeds=(1,))
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from trainhealth.lab.realrun.spec import CONTROL_KINDS, CaseSpec, Fault, RealRunFaultKind, Parallelism, Pattern

__all__ = ["SUITES", "Entry", "make_case", "suite_cases"]

STEPS = 40
#: Kernel seconds per step (forward, backward, optimizer): long beside the host's own work per step (~6 ms of CPU
#: per rank), so 8 ranks on 2 cores still compute evenly
COMPUTE_S = 0.08
WIDTH, LAYERS, BATCH = 128, 4, 8
#: The CPU-bound share of every rank's kernels in a CPU-contention case (what the competing process slows)
CONTENTION_CPU_SHARE = 0.25
#: Rough step seconds of a clean run here (2 cores), to turn a link's target slowdown into a rate.
BASE_STEP_S = {4: 0.11, 8: 0.13}


class Entry(NamedTuple):
    """One line of a suite: a case per seed. ``ranks`` None alternates 4 and 8 between entries and seeds."""

    kind: RealRunFaultKind
    pattern: Pattern
    layout: Parallelism
    mid_run: bool = True
    ranks: int | None = None
    markers: bool = True


_C, _P, _L = RealRunFaultKind, Pattern, Parallelism
_FULL: tuple[Entry, ...] = (
    Entry(_C.COMPUTE, _P.PERSISTENT, _L.DDP),
    Entry(_C.COMPUTE, _P.PERSISTENT, _L.DP_PP),
    Entry(_C.COMPUTE, _P.PERSISTENT, _L.DP_TP),
    Entry(_C.COMPUTE, _P.TRANSIENT, _L.DDP),
    Entry(_C.COMPUTE, _P.TRANSIENT, _L.DP_TP),
    Entry(_C.COMPUTE, _P.INTERMITTENT, _L.DDP),
    Entry(_C.COMPUTE, _P.INTERMITTENT, _L.DP_PP),
    Entry(_C.LINK_RATE, _P.PERSISTENT, _L.DDP, mid_run=False),
    Entry(_C.LINK_RATE, _P.PERSISTENT, _L.DDP),
    Entry(_C.LINK_RATE, _P.PERSISTENT, _L.DP_PP),
    Entry(_C.LINK_RATE, _P.PERSISTENT, _L.DP_TP),
    Entry(_C.LINK_DELAY, _P.PERSISTENT, _L.DDP),
    # 4 ranks only: at 8, the seven ranks pinned to the other CPU would saturate it with their own CPU-bound share
    Entry(_C.CPU_CONTENTION, _P.PERSISTENT, _L.DDP, ranks=4),
    Entry(_C.CPU_CONTENTION, _P.PERSISTENT, _L.DP_TP, ranks=4),
    Entry(_C.DATALOADER, _P.PERSISTENT, _L.DDP),
    Entry(_C.DATALOADER, _P.INTERMITTENT, _L.DP_PP),
    Entry(_C.CLEAN, _P.PERSISTENT, _L.DDP, mid_run=False),
    Entry(_C.CLEAN, _P.PERSISTENT, _L.DP_PP, mid_run=False),
    Entry(_C.CLEAN, _P.PERSISTENT, _L.DP_TP, mid_run=False),
    Entry(_C.SEQ_IMBALANCE, _P.PERSISTENT, _L.DDP, mid_run=False),
    Entry(_C.SEQ_IMBALANCE, _P.PERSISTENT, _L.DP_TP, mid_run=False),
    Entry(_C.STAGE_IMBALANCE, _P.PERSISTENT, _L.DP_PP, mid_run=False),
    # the collective logger alone (no Monitor, no step markers): a right verdict or "insufficient data"
    Entry(_C.COMPUTE, _P.PERSISTENT, _L.DDP, ranks=4, markers=False),
    Entry(_C.CLEAN, _P.PERSISTENT, _L.DDP, mid_run=False, ranks=4, markers=False),
)
_SMALL: tuple[Entry, ...] = (
    Entry(_C.COMPUTE, _P.PERSISTENT, _L.DDP),
    Entry(_C.CLEAN, _P.PERSISTENT, _L.DDP, mid_run=False),
    Entry(_C.COMPUTE, _P.PERSISTENT, _L.DP_PP),
    Entry(_C.CLEAN, _P.PERSISTENT, _L.DP_TP, mid_run=False),
    Entry(_C.LINK_RATE, _P.PERSISTENT, _L.DDP),
    Entry(_C.STAGE_IMBALANCE, _P.PERSISTENT, _L.DP_PP, mid_run=False),
)
SUITES = {"small": _SMALL, "full": _FULL}


def _bits_per_step(layout: Parallelism, ranks: int) -> float:
    """Bits one rank's link carries per step in each direction (ring all-reduce estimate)."""
    parameters = LAYERS * (WIDTH * WIDTH + WIDTH)
    activation = BATCH * WIDTH * 32.0
    if layout is Parallelism.DDP:
        return 2 * (ranks - 1) / ranks * parameters * 32.0
    replicas = ranks // 2
    ring = 2 * (replicas - 1) / replicas
    if layout is Parallelism.DP_PP:
        return ring * parameters / 2 * 32.0 + 2 * activation
    return ring * parameters * 32.0 + 2 * LAYERS * activation


def make_case(kind: RealRunFaultKind, pattern: Pattern, layout: Parallelism, ranks: int, seed: int, *, mid_run: bool = True,
              index: int = 0, steps: int = STEPS, markers: bool = True) -> CaseSpec:
    """One case with onset, target and severity drawn from ``(seed, index)``."""
    rng = np.random.default_rng([seed, index, 1515])
    onset = int(rng.integers(steps // 4, steps // 2 + 1)) if mid_run else 0
    target = int(rng.integers(0, ranks))
    severity = float(np.exp(rng.uniform(np.log(1.1), np.log(3.0))))
    fields: dict[str, int] = {}  # the pattern's length or period
    if pattern is Pattern.TRANSIENT:
        fields["length"] = int(rng.integers(3, 9))
    if pattern is Pattern.INTERMITTENT:
        fields["every"] = int(rng.integers(3, 7))
    if kind in CONTROL_KINDS:
        severity = {RealRunFaultKind.CLEAN: 1.0, RealRunFaultKind.SEQ_IMBALANCE: 1.3, RealRunFaultKind.STAGE_IMBALANCE: 1.5}[kind]
        fault = Fault(kind, severity=severity)
    elif kind is RealRunFaultKind.LINK_RATE:
        severity = float(rng.uniform(1.3, 2.5))
        extra_s = (severity - 1.0) * BASE_STEP_S.get(ranks, 0.12)
        rate = float(np.clip(_bits_per_step(layout, ranks) / extra_s / 1e6, 10.0, 2000.0))
        fault = Fault(kind, pattern, target, onset, severity, rate_mbit=round(rate, 1), **fields)
    elif kind is RealRunFaultKind.LINK_DELAY:
        severity = float(rng.uniform(1.3, 2.5))
        delay = (severity - 1.0) * BASE_STEP_S.get(ranks, 0.12) * 1000 / 8  # ~8 round trips per step
        fault = Fault(kind, pattern, target, onset, severity, delay_ms=round(delay, 1), **fields)
    elif kind is RealRunFaultKind.CPU_CONTENTION:
        fault = Fault(kind, pattern, target, onset, 1.0, hogs=2, **fields)
    elif kind is RealRunFaultKind.DATALOADER:
        severity = float(rng.uniform(1.3, 2.5))
        fault = Fault(kind, pattern, target, onset, severity, stall_s=round((severity - 1.0) * COMPUTE_S * 1.5, 4),
                      **fields)
    else:
        fault = Fault(kind, pattern, target, onset, round(severity, 3), **fields)
    name = f"s{seed}-{layout.value}-{kind.value}" + ("" if kind in CONTROL_KINDS else f"-{pattern.value}") + (
        "-start" if kind not in CONTROL_KINDS and not mid_run else "") + ("" if markers else "-nomarkers") + f"-r{ranks}"
    cpu_share = CONTENTION_CPU_SHARE if kind is RealRunFaultKind.CPU_CONTENTION else 0.0
    return CaseSpec(name, layout, ranks, steps, seed, fault, compute_s=COMPUTE_S, width=WIDTH, layers=LAYERS,
                    batch=BATCH, cpu_share=cpu_share, markers=markers)


def suite_cases(suite: str, seeds: Sequence[int] = (0, 1, 2), kinds: Sequence[str] = ()) -> list[CaseSpec]:
    """The cases of ``suite`` (small or full) for ``seeds``, optionally only those whose kind or name matches."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; expected one of {', '.join(SUITES)}")
    cases = []
    for seed in seeds:
        for index, entry in enumerate(SUITES[suite]):
            ranks = entry.ranks or (4 if suite == "small" or (seed + index) % 2 == 0 else 8)
            case = make_case(entry.kind, entry.pattern, entry.layout, ranks, seed, mid_run=entry.mid_run, index=index,
                             markers=entry.markers)
            if not kinds or any(k == entry.kind.value or k in case.name for k in kinds):
                cases.append(case)
    return cases
