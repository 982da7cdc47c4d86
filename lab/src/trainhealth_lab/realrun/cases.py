"""The suites: which cases run, with onset, target and severity drawn from the seed.

>>> [c.name for c in suite_cases("small", seeds=(0,))][:2]
['s0-ddp-compute-persistent-r4', 's0-ddp-clean-r4']
>>> len(suite_cases("full", seeds=(0, 1, 2)))
72
>>> suite_cases("full", seeds=(1,)) == suite_cases("full", seeds=(1,))
True
>>> [c.name for c in suite_cases("shapes", seeds=(0,))][:2]
['s0-explicit-compute-persistent-nomarkers-r4', 's0-explicit-compute-persistent-start-nomarkers-r4']
>>> min(c.fault.severity for c in suite_cases("shapes", seeds=(0, 1, 2)) if c.fault.target is not None) >= 1.5
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from trainhealth_lab.realrun.spec import (
    CaseSpec,
    Driver,
    LabFault,
    Parallelism,
    Pattern,
    lab_fault,
)

__all__ = ["SHAPES", "SUITES", "Entry", "issue30_repro", "make_case", "suite_cases"]

STEPS = 40
#: Kernel seconds per step (forward, backward, optimizer): long beside the host's own work per step (~6 ms of CPU
#: per rank), so 8 ranks on 2 cores still compute evenly
COMPUTE_S = 0.08
WIDTH, LAYERS, BATCH = 128, 4, 8
#: The CPU-bound share of every rank's kernels in a CPU-contention case (what the competing process slows)
CONTENTION_CPU_SHARE = 0.25
#: The controls' spread: 1.0 for a clean run, else the factor work per step is drawn within (:class:`LabFault`).
CONTROL_SEVERITY = {LabFault.CLEAN: 1.0, LabFault.SEQ_IMBALANCE: 1.3, LabFault.STAGE_IMBALANCE: 1.5}
#: Rough step seconds of a clean run here (2 cores), to turn a link's target slowdown into a rate.
BASE_STEP_S = {4: 0.11, 8: 0.13}


class Entry(NamedTuple):
    """One line of a suite: a case per seed. ``ranks`` None alternates 4 and 8 between entries and seeds."""

    kind: LabFault
    pattern: Pattern
    layout: Parallelism
    mid_run: bool = True
    ranks: int | None = None
    markers: bool = True
    driver: Driver = Driver.LAB
    min_severity: float = 1.1  # a compute fault's severity is drawn from [min_severity, 3] (log-uniform)


_K, _P, _L = LabFault, Pattern, Parallelism
_FULL: tuple[Entry, ...] = (
    Entry(_K.COMPUTE, _P.PERSISTENT, _L.DDP),
    Entry(_K.COMPUTE, _P.PERSISTENT, _L.DP_PP),
    Entry(_K.COMPUTE, _P.PERSISTENT, _L.DP_TP),
    Entry(_K.COMPUTE, _P.TRANSIENT, _L.DDP),
    Entry(_K.COMPUTE, _P.TRANSIENT, _L.DP_TP),
    Entry(_K.COMPUTE, _P.INTERMITTENT, _L.DDP),
    Entry(_K.COMPUTE, _P.INTERMITTENT, _L.DP_PP),
    Entry(_K.LINK_RATE, _P.PERSISTENT, _L.DDP, mid_run=False),
    Entry(_K.LINK_RATE, _P.PERSISTENT, _L.DDP),
    Entry(_K.LINK_RATE, _P.PERSISTENT, _L.DP_PP),
    Entry(_K.LINK_RATE, _P.PERSISTENT, _L.DP_TP),
    Entry(_K.LINK_DELAY, _P.PERSISTENT, _L.DDP),
    # 4 ranks only: at 8, the seven ranks pinned to the other CPU would saturate it with their own CPU-bound share
    Entry(_K.CPU_CONTENTION, _P.PERSISTENT, _L.DDP, ranks=4),
    Entry(_K.CPU_CONTENTION, _P.PERSISTENT, _L.DP_TP, ranks=4),
    Entry(_K.DATALOADER, _P.PERSISTENT, _L.DDP),
    Entry(_K.DATALOADER, _P.INTERMITTENT, _L.DP_PP),
    Entry(_K.CLEAN, _P.PERSISTENT, _L.DDP, mid_run=False),
    Entry(_K.CLEAN, _P.PERSISTENT, _L.DP_PP, mid_run=False),
    Entry(_K.CLEAN, _P.PERSISTENT, _L.DP_TP, mid_run=False),
    Entry(_K.SEQ_IMBALANCE, _P.PERSISTENT, _L.DDP, mid_run=False),
    Entry(_K.SEQ_IMBALANCE, _P.PERSISTENT, _L.DP_TP, mid_run=False),
    Entry(_K.STAGE_IMBALANCE, _P.PERSISTENT, _L.DP_PP, mid_run=False),
    # the collective logger alone (no Monitor, no step markers): a right verdict or "insufficient data"
    Entry(_K.COMPUTE, _P.PERSISTENT, _L.DDP, ranks=4, markers=False),
    Entry(_K.CLEAN, _P.PERSISTENT, _L.DDP, mid_run=False, ranks=4, markers=False),
)
_SMALL: tuple[Entry, ...] = (
    Entry(_K.COMPUTE, _P.PERSISTENT, _L.DDP),
    Entry(_K.CLEAN, _P.PERSISTENT, _L.DDP, mid_run=False),
    Entry(_K.COMPUTE, _P.PERSISTENT, _L.DP_PP),
    Entry(_K.CLEAN, _P.PERSISTENT, _L.DP_TP, mid_run=False),
    Entry(_K.LINK_RATE, _P.PERSISTENT, _L.DDP),
    Entry(_K.STAGE_IMBALANCE, _P.PERSISTENT, _L.DP_PP, mid_run=False),
)
#: The shapes of issue 30 (driver, layout, ranks, markers): explicit collectives with the collective logger
#: alone, FSDP-style per-layer gathers and reduce-scatters (with and without the Monitor), the Hugging Face
#: Trainer and Accelerate with trainhealth's integrations, 2-rank jobs of the lab's layouts and of the explicit
#: loop (no majority to compare the slow rank with), and torch's own FSDP2.
SHAPES: tuple[tuple[Driver, Parallelism, int, bool], ...] = (
    (Driver.EXPLICIT, Parallelism.DDP, 4, False),
    (Driver.FSDP, Parallelism.DDP, 4, True),
    (Driver.FSDP, Parallelism.DDP, 4, False),
    (Driver.HF_TRAINER, Parallelism.DDP, 4, True),
    (Driver.ACCELERATE, Parallelism.DDP, 4, True),
    (Driver.LAB, Parallelism.DDP, 2, True),
    (Driver.LAB, Parallelism.DP_PP, 2, True),
    (Driver.LAB, Parallelism.DP_TP, 2, True),
    (Driver.EXPLICIT, Parallelism.DDP, 2, False),
    (Driver.FSDP2, Parallelism.DDP, 4, True),  # last: the draws of the shapes above stay those of the first runs
)
#: Each shape with a compute straggler (>= 1.5x) from mid-run, the same from step 0, and a clean control.
_SHAPE_ENTRIES: tuple[Entry, ...] = tuple(
    entry
    for driver, layout, ranks, markers in SHAPES
    for entry in (
        Entry(_K.COMPUTE, _P.PERSISTENT, layout, True, ranks, markers, driver, 1.5),
        Entry(_K.COMPUTE, _P.PERSISTENT, layout, False, ranks, markers, driver, 1.5),
        Entry(_K.CLEAN, _P.PERSISTENT, layout, False, ranks, markers, driver),
    )
)
SUITES = {"small": _SMALL, "full": _FULL, "shapes": _SHAPE_ENTRIES}
#: Issue 30's reproduction: kernel seconds per step of the other ranks, and the slow rank's factor (~15 ms more).
REPRO_COMPUTE_S, REPRO_SEVERITY, REPRO_ONSET = 0.001, 16.0, 10


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


def make_case(
    kind: LabFault | str,
    pattern: Pattern,
    layout: Parallelism,
    ranks: int,
    seed: int,
    *,
    mid_run: bool = True,
    index: int = 0,
    steps: int = STEPS,
    markers: bool = True,
    driver: Driver = Driver.LAB,
    min_severity: float = 1.1,
) -> CaseSpec:
    """One case with onset, target and severity drawn from ``(seed, index)``; a kind the lab does not inject is a
    ``ValueError`` naming it."""
    kind = LabFault(kind)
    rng = np.random.default_rng([seed, index, 1515])
    onset = int(rng.integers(steps // 4, steps // 2 + 1)) if mid_run else 0
    target = int(rng.integers(0, ranks))
    severity = float(np.exp(rng.uniform(np.log(min_severity), np.log(3.0))))
    fields: dict[str, int] = {}  # the pattern's length or period
    if pattern is Pattern.TRANSIENT:
        fields["length"] = int(rng.integers(3, 9))
    if pattern is Pattern.INTERMITTENT:
        fields["every"] = int(rng.integers(3, 7))
    if kind.control:
        fault = lab_fault(kind, severity=CONTROL_SEVERITY[kind])
    elif kind is LabFault.LINK_RATE:
        severity = float(rng.uniform(1.3, 2.5))
        extra_s = (severity - 1.0) * BASE_STEP_S.get(ranks, 0.12)
        rate = float(np.clip(_bits_per_step(layout, ranks) / extra_s / 1e6, 10.0, 2000.0))
        fault = lab_fault(kind, pattern, target, onset, severity, rate_mbit=round(rate, 1), **fields)
    elif kind is LabFault.LINK_DELAY:
        severity = float(rng.uniform(1.3, 2.5))
        delay = (severity - 1.0) * BASE_STEP_S.get(ranks, 0.12) * 1000 / 8  # ~8 round trips per step
        fault = lab_fault(kind, pattern, target, onset, severity, delay_ms=round(delay, 1), **fields)
    elif kind is LabFault.CPU_CONTENTION:
        fault = lab_fault(kind, pattern, target, onset, 1.0, hogs=2, **fields)
    elif kind is LabFault.DATALOADER:
        severity = float(rng.uniform(1.3, 2.5))
        fault = lab_fault(
            kind, pattern, target, onset, severity, stall_s=round((severity - 1.0) * COMPUTE_S * 1.5, 4), **fields
        )
    elif kind is LabFault.COMPUTE:
        fault = lab_fault(kind, pattern, target, onset, round(severity, 3), **fields)
    else:  # a kind added to LabFault without its draw here
        raise ValueError(f"no case is drawn for lab fault {kind.value!r}")
    shape = layout.value if driver is Driver.LAB else driver.value
    name = (
        f"s{seed}-{shape}-{kind.value}"
        + ("" if kind.control else f"-{pattern.value}")
        + ("-start" if not kind.control and not mid_run else "")
        + ("" if markers else "-nomarkers")
        + f"-r{ranks}"
    )
    cpu_share = CONTENTION_CPU_SHARE if kind is LabFault.CPU_CONTENTION else 0.0
    return CaseSpec(
        name,
        layout,
        ranks,
        steps,
        seed,
        fault,
        compute_s=COMPUTE_S,
        width=WIDTH,
        layers=LAYERS,
        batch=BATCH,
        cpu_share=cpu_share,
        markers=markers,
        driver=driver,
    )


def issue30_repro(seed: int) -> CaseSpec:
    """Issue 30's failing job: 4 ranks call ``dist.all_reduce`` themselves every iteration and ``dist.barrier()``
    every 5th, the collective logger alone; one rank spends ~15 ms more before its all-reduce from iteration 10
    of 40 (the others ~1 ms). The slow rank is drawn from the seed.

    >>> issue30_repro(0).name, issue30_repro(0).fault.step, issue30_repro(0).driver.value
    ('s0-issue30-repro-explicit-r4', 10, 'explicit')
    """
    target = int(np.random.default_rng([seed, 30]).integers(0, 4))
    fault = lab_fault(LabFault.COMPUTE, Pattern.PERSISTENT, target, REPRO_ONSET, REPRO_SEVERITY)
    return CaseSpec(
        f"s{seed}-issue30-repro-explicit-r4",
        Parallelism.DDP,
        4,
        STEPS,
        seed,
        fault,
        compute_s=REPRO_COMPUTE_S,
        width=WIDTH,
        layers=LAYERS,
        batch=BATCH,
        markers=False,
        driver=Driver.EXPLICIT,
    )


def suite_cases(suite: str, seeds: Sequence[int] = (0, 1, 2), kinds: Sequence[str] = ()) -> list[CaseSpec]:
    """The cases of ``suite`` (small, full or shapes) for ``seeds``, optionally only those whose kind or name
    matches. ``shapes`` ends each seed with :func:`issue30_repro`."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; expected one of {', '.join(SUITES)}")
    cases = []
    for seed in seeds:
        for index, entry in enumerate(SUITES[suite]):
            ranks = entry.ranks or (4 if suite == "small" or (seed + index) % 2 == 0 else 8)
            case = make_case(
                entry.kind,
                entry.pattern,
                entry.layout,
                ranks,
                seed,
                mid_run=entry.mid_run,
                index=index,
                markers=entry.markers,
                driver=entry.driver,
                min_severity=entry.min_severity,
            )
            if not kinds or any(k == entry.kind or k in case.name for k in kinds):
                cases.append(case)
        if suite == "shapes":
            repro = issue30_repro(seed)
            if not kinds or any(k == repro.fault.kind or k in repro.name for k in kinds):
                cases.append(repro)
    return cases
