"""What the cluster simulator is asked to run: the layout, the timing model, injected faults and controls.

Injected faults (:class:`~trainhealth._internal.faults.Fault`, kinds ``gpu``, ``nic``, ``host`` and
``switch``, declared here), with ground truth: a slow GPU (compute x severity), a slow NIC or link of
one rank (its inter-host transfers x severity), every NIC of one host, a slow leaf switch (every
inter-host transfer of its hosts x severity) — transient or persistent, or recurrent
(:func:`recurrent_fault`: one device slow in separate episodes). :func:`cluster_fault` makes one from
a rank, host or leaf switch index.
Negative controls: fault-free, a longer last pipeline stage, and varying
sequence lengths; production noise (:mod:`trainhealth._internal.simulator.noise`) on
top of any of them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from itertools import pairwise
from typing import Any

import numpy as np

from trainhealth._internal.config.fields import Range
from trainhealth._internal.faults import Fault, FaultKind, register
from trainhealth._internal.simulator.cluster import ClusterLayout
from trainhealth._internal.simulator.noise import ProductionNoise

__all__ = ["CLUSTER_FAULTS", "Control", "Scenario", "Timing", "cluster_fault", "recurrent_fault", "with_fault"]

#: The simulator's fault kinds; a fault's ranks are the GPU's or NIC's rank, or every rank of the host or
#: leaf switch (see :func:`cluster_fault`).
CLUSTER_FAULTS = ("gpu", "nic", "host", "switch")
_SEVERITY = Range(1.0, 10.0, above_low=True)
for _kind, _what in (
    ("gpu", "slow GPU: compute x{severity:g}"),
    ("nic", "slow NIC: inter-host transfers x{severity:g}"),
    ("host", "slow host network: every NIC x{severity:g}"),
    ("switch", "slow leaf switch: inter-host transfers x{severity:g}"),
):
    register(FaultKind(_kind, "simulator", _what, severity=_SEVERITY, needs_ranks=True))


class Control(str, Enum):
    NONE = "none"
    STAGE_IMBALANCE = "stage_imbalance"
    SEQLEN_IMBALANCE = "seqlen_imbalance"


@dataclass(frozen=True)
class Timing:
    """Seconds per operation of a healthy, average GPU (transfers include their latency)."""

    forward: float = 0.020
    backward_factor: float = 2.0
    optimizer: float = 0.005
    tp_all_reduce: float = 0.0010
    cp_all_gather: float = 0.0015
    ep_all_to_all: float = 0.0040
    p2p_intra: float = 0.0005
    p2p_inter: float = 0.0020
    dp_all_reduce: float = 0.030
    jitter: float = 0.02  # lognormal sigma of compute
    comm_jitter: float = 0.05
    gpu_spread: float = 0.14  # fixed speed factor per GPU: 1 + U(0, spread)
    gc_rate: float = 0.0005  # per compute op
    gc_pause: tuple[float, float] = (0.03, 0.12)
    drift: float = 0.02  # slowdown of every GPU over the whole run
    stage_imbalance: float = 1.5
    seqlen_sigma: float = 0.25


@dataclass(frozen=True)
class Scenario:
    layout: ClusterLayout
    steps: int = 20
    microbatches: int = 4
    seed: int = 0
    faults: tuple[Fault, ...] = ()
    control: Control = Control.NONE
    timing: Timing = field(default_factory=Timing)
    noise: ProductionNoise | None = None  # production noise on top of the timing model's own

    def __post_init__(self) -> None:
        if self.steps < 1 or self.microbatches < 1:
            raise ValueError("steps and microbatches must be >= 1")
        for fault in self.faults:
            if fault.kind not in CLUSTER_FAULTS:
                raise ValueError(f"the simulator injects {', '.join(CLUSTER_FAULTS)} faults, not {fault.kind}")
            if max(fault.ranks) >= self.layout.world:
                raise ValueError(f"{fault.kind} fault on rank {max(fault.ranks)}, outside the cluster")

    def ground_truth(self) -> dict[str, Any]:
        """What a localizer should find, for evaluation."""
        layout = self.layout
        faults = []
        for fault in self.faults:
            first = fault.ranks[0]
            if fault.kind == "switch":
                component = f"switch:leaf-{int(layout.leaf_of(first))}"
            elif fault.kind == "host":
                component = f"host:{layout.host_name(int(layout.host_of(first)))}"
            else:
                component = f"{fault.kind}:rank-{first}"
            faults.append(
                {
                    **fault.to_dict(),
                    "ranks": list(fault.ranks),
                    "component": component,
                    "host": layout.host_name(int(layout.host_of(first))),
                }
            )
        if faults:
            verdict = "compute" if self.faults[0].kind == "gpu" else "communication"  # the first is the one to find
        else:
            verdict = "imbalance" if self.control is not Control.NONE else "healthy"
        truth = {
            "simulated": True,
            "verdict": verdict,
            "control": self.control.value,
            "faults": faults,
            "layout": asdict(layout),
            "steps": self.steps,
            "microbatches": self.microbatches,
            "seed": self.seed,
        }
        if self.noise is not None:
            truth["noise"] = asdict(self.noise)
        return truth


def with_fault(scenario: Scenario, fault: Fault) -> Scenario:
    return replace(scenario, faults=scenario.faults + (fault,))


def cluster_fault(
    layout: ClusterLayout, kind: str, index: int, severity: float, step: int = 0, until: int | None = None
) -> Fault:
    """A simulator fault on the GPU or NIC of rank ``index``, every NIC of host ``index`` or the leaf switch
    ``index``, in steps ``step`` to ``until`` (None: to the end).

    >>> layout = ClusterLayout(dp=4, pp=2, tp=8)  # 64 GPUs: 8 hosts of 8, under one leaf switch
    >>> cluster_fault(layout, "host", 1, 1.5, step=4).describe()
    'from step 4: slow host network: every NIC x1.5 on ranks 8, 9, 10, 11, 12, 13, 14, 15'
    >>> cluster_fault(layout, "switch", 3, 2.0)
    Traceback (most recent call last):
    ...
    ValueError: switch 3 is outside the cluster (leaf switches 0 to 0)
    """
    if kind == "host":
        owners, names = layout.host_of(np.arange(layout.world)), "hosts"
    elif kind == "switch":
        owners, names = layout.leaf_of(np.arange(layout.world)), "leaf switches"
    else:
        owners, names = np.arange(layout.world), "ranks"
    ranks = tuple(int(rank) for rank in np.flatnonzero(owners == index))
    if not ranks:
        raise ValueError(f"{kind} {index} is outside the cluster ({names} 0 to {int(owners.max())})")
    return Fault(kind, ranks, step=step, until=until, severity=severity)


def recurrent_fault(
    layout: ClusterLayout, kind: str, index: int, severity: float, episodes: Iterable[tuple[int, int]]
) -> tuple[Fault, ...]:
    """One device slow in separate episodes (first step, last step): a recurrent transient fault.

    >>> layout = ClusterLayout(dp=4, pp=2, tp=8)
    >>> [(f.step, f.until) for f in recurrent_fault(layout, "gpu", 5, 1.5, [(40, 42), (10, 13)])]
    [(10, 13), (40, 42)]
    """
    faults = tuple(
        cluster_fault(layout, kind, index, severity, step=first, until=last) for first, last in sorted(episodes)
    )
    for before, after in pairwise(faults):
        if before.until is None or after.step <= before.until + 1:
            raise ValueError("the episodes of a recurrent fault must be separate (a healthy step between them)")
    return faults
