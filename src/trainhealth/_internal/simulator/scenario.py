"""What the cluster simulator is asked to run: the layout, the timing model, injected faults and controls.

Injected faults, with ground truth: a slow GPU (compute x severity), a slow NIC
or link of one rank (its inter-host transfers x severity), every NIC of one host,
a slow leaf switch (every inter-host transfer of its hosts x severity) — transient or persistent,
severity 1.02 to 3, or recurrent (:func:`recurrent_fault`: one device slow in separate episodes).
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

from trainhealth._internal.simulator.cluster import ClusterLayout
from trainhealth._internal.simulator.noise import ProductionNoise

__all__ = ["ClusterFaultKind", "Control", "InjectedFault", "Scenario", "Timing", "recurrent_fault", "with_fault"]


class ClusterFaultKind(str, Enum):
    GPU = "gpu"  # the GPU computes slowly (throttling, a degraded HBM stack)
    NIC = "nic"  # one rank's NIC or link: its inter-host transfers are slow
    HOST = "host"  # every NIC of one host (a host-level network problem)
    SWITCH = "switch"  # a leaf switch: every inter-host transfer of the hosts under it


class Control(str, Enum):
    NONE = "none"
    STAGE_IMBALANCE = "stage_imbalance"
    SEQLEN_IMBALANCE = "seqlen_imbalance"


@dataclass(frozen=True)
class InjectedFault:
    """``target`` is a rank (gpu, nic), a host index (host) or a leaf switch (switch);
    active in steps ``[start_step, end_step)``."""

    kind: ClusterFaultKind
    target: int
    severity: float
    start_step: int = 0
    end_step: int | None = None

    def __post_init__(self) -> None:
        if not 1.0 < self.severity <= 10.0:
            raise ValueError("severity must be in (1, 10]")

    def active(self, step: int) -> bool:
        return self.start_step <= step and (self.end_step is None or step < self.end_step)


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
    faults: tuple[InjectedFault, ...] = ()
    control: Control = Control.NONE
    timing: Timing = field(default_factory=Timing)
    noise: ProductionNoise | None = None  # production noise on top of the timing model's own

    def __post_init__(self) -> None:
        if self.steps < 1 or self.microbatches < 1:
            raise ValueError("steps and microbatches must be >= 1")
        for fault in self.faults:
            limit = {
                ClusterFaultKind.SWITCH: int(self.layout.leaf_of(self.layout.world - 1)) + 1,
                ClusterFaultKind.HOST: int(self.layout.host_of(self.layout.world - 1)) + 1,
            }.get(fault.kind, self.layout.world)
            if not 0 <= fault.target < limit:
                raise ValueError(f"{fault.kind.value} fault target {fault.target} is outside the cluster")

    def ground_truth(self) -> dict[str, Any]:
        """What a localizer should find, for evaluation."""
        layout = self.layout
        faults = []
        for fault in self.faults:
            if fault.kind is ClusterFaultKind.SWITCH:
                per_leaf = layout.gpus_per_host * layout.hosts_per_leaf
                ranks = [r for r in range(fault.target * per_leaf, (fault.target + 1) * per_leaf) if r < layout.world]
                component = f"switch:leaf-{fault.target}"
            elif fault.kind is ClusterFaultKind.HOST:
                per_host = layout.gpus_per_host
                ranks = [r for r in range(fault.target * per_host, (fault.target + 1) * per_host) if r < layout.world]
                component = f"host:{layout.host_name(fault.target)}"
            else:
                ranks = [fault.target]
                component = f"{fault.kind.value}:rank-{fault.target}"
            faults.append(
                {
                    **asdict(fault),
                    "kind": fault.kind.value,
                    "ranks": ranks,
                    "component": component,
                    "host": layout.host_name(int(layout.host_of(ranks[0]))),
                }
            )
        if faults:
            verdict = (
                "compute" if self.faults[0].kind is ClusterFaultKind.GPU else "communication"
            )  # the first is the one to find
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


def with_fault(scenario: Scenario, fault: InjectedFault) -> Scenario:
    return replace(scenario, faults=scenario.faults + (fault,))


def recurrent_fault(
    kind: ClusterFaultKind, target: int, severity: float, episodes: Iterable[tuple[int, int]]
) -> tuple[InjectedFault, ...]:
    """One device slow in separate episodes ``(start_step, end_step)``: a recurrent transient fault.

    >>> [(f.start_step, f.end_step) for f in recurrent_fault(ClusterFaultKind.GPU, 5, 1.5, [(40, 43), (10, 14)])]
    [(10, 14), (40, 43)]
    """
    faults = tuple(
        InjectedFault(kind, target, severity, start_step=start, end_step=end) for start, end in sorted(episodes)
    )
    for before, after in pairwise(faults):
        if before.end_step is None or after.start_step <= before.end_step:
            raise ValueError("the episodes of a recurrent fault must be separate (a healthy step between them)")
    return faults
