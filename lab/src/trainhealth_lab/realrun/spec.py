"""What one real-run case is: layout, ranks, steps, seed and the injected fault, and its ground truth.

A :class:`CaseSpec` is written to ``spec.json`` in the run directory; every rank
process reads it and applies the same fault schedule (:meth:`Fault.factor`), so
the schedule is the same on every rank and in the ground truth.

>>> fault = Fault(RealRunFaultKind.COMPUTE, Pattern.INTERMITTENT, target=2, onset=10, severity=2.0, every=4)
>>> [fault.factor(2, step) for step in (9, 10, 11, 14)]
[1.0, 2.0, 1.0, 2.0]
>>> fault.factor(1, 10)
1.0
>>> spec = CaseSpec("ddp-compute", Parallelism.DDP, ranks=4, steps=30, seed=0, fault=fault)
>>> CaseSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
True
>>> truth(spec).expected_verdict, truth(spec).components
('compute', ('gpu:rank-2',))
>>> truth(replace(spec, markers=False)).accepted_verdicts
('compute', 'insufficient_data')
>>> truth(replace(spec, ranks=2, fault=replace(fault, target=1))).accepted_verdicts  # no majority to compare with
('compute', 'insufficient_data')
>>> explicit = CaseSpec("explicit", Parallelism.DDP, 4, 40, 0, fault, driver=Driver.EXPLICIT, markers=False)
>>> CaseSpec.from_dict(explicit.to_dict()).driver
<Driver.EXPLICIT: 'explicit'>
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from trainhealth_lab.scoring import Expected

__all__ = [
    "CONTROL_KINDS",
    "LINK_KINDS",
    "TRAINER_DRIVERS",
    "CaseSpec",
    "Driver",
    "Fault",
    "Parallelism",
    "Pattern",
    "RealRunFaultKind",
    "Truth",
    "host_name",
    "severity_band",
    "truth",
]


class Parallelism(str, enum.Enum):
    """How the ranks split the model: pure data parallelism, DP x 2 pipeline stages, DP x tensor-parallel pairs."""

    DDP = "ddp"
    DP_PP = "dp_pp"
    DP_TP = "dp_tp"


class Driver(str, enum.Enum):
    """What drives the ranks' training loop and so which collectives, in which shape, reach the logger.

    ``lab``: the lab's own loop per :class:`Parallelism` (DDP buckets, pipeline send/recv, TP all-reduces)
    under the Monitor. The others are shapes users run (layout ``ddp``: every rank one data-parallel replica):
    ``explicit``, the loop calls ``dist.all_reduce`` itself each iteration and ``dist.barrier()`` every 5th,
    with ``trainhealth.comm.install`` alone (no Monitor, no step markers); ``fsdp``, per-layer
    ``all_gather_into_tensor`` before each layer's forward and backward and ``reduce_scatter_tensor`` of each
    layer's gradient on flat shards; ``fsdp2``, torch's own ``fully_shard`` per layer; ``hf_trainer``, a tiny
    ``transformers`` model under ``Trainer`` with trainhealth's callback; ``accelerate``, an Accelerate loop
    with trainhealth's tracker.
    """

    LAB = "lab"
    EXPLICIT = "explicit"
    FSDP = "fsdp"
    FSDP2 = "fsdp2"
    HF_TRAINER = "hf_trainer"
    ACCELERATE = "accelerate"


#: Drivers whose loop is a trainer's (the ranks' kernels are hooked into its model).
TRAINER_DRIVERS = frozenset({Driver.HF_TRAINER, Driver.ACCELERATE})


class RealRunFaultKind(str, enum.Enum):
    COMPUTE = "compute"  # slower kernels on one rank
    LINK_RATE = "link_rate"  # tbf rate limit on one rank's link
    LINK_DELAY = "link_delay"  # netem delay on one rank's link
    CPU_CONTENTION = "cpu_contention"  # busy processes on the target rank's CPU
    DATALOADER = "dataloader"  # a stall in one rank's data fetch, before forward
    CLEAN = "clean"  # negative control
    SEQ_IMBALANCE = "seq_imbalance"  # negative control: every replica's work drawn per step
    STAGE_IMBALANCE = "stage_imbalance"  # negative control (dp_pp): the last stage longer on every replica


class Pattern(str, enum.Enum):
    PERSISTENT = "persistent"  # from the onset to the end (onset 0: from the start)
    TRANSIENT = "transient"  # ``length`` steps from the onset
    INTERMITTENT = "intermittent"  # every ``every``-th step from the onset


LINK_KINDS = frozenset({RealRunFaultKind.LINK_RATE, RealRunFaultKind.LINK_DELAY})
CONTROL_KINDS = frozenset({RealRunFaultKind.CLEAN, RealRunFaultKind.SEQ_IMBALANCE, RealRunFaultKind.STAGE_IMBALANCE})


@dataclass(frozen=True)
class Fault:
    """One injected fault (or control). ``severity`` is the kernel-time factor of a compute fault and of the
    stage/batch spread of a control; for a link or a stall it is the step slowdown the lab aims for."""

    kind: RealRunFaultKind
    pattern: Pattern = Pattern.PERSISTENT
    target: int | None = None
    onset: int = 0
    severity: float = 1.0
    length: int = 0  # transient: steps affected
    every: int = 0  # intermittent: period in steps
    rate_mbit: float | None = None  # link_rate
    delay_ms: float | None = None  # link_delay
    stall_s: float = 0.0  # dataloader: seconds per affected step
    hogs: int = 0  # cpu_contention: busy processes on the target's CPU

    def __post_init__(self) -> None:
        if self.kind not in CONTROL_KINDS and self.target is None:
            raise ValueError(f"fault {self.kind.value}: a target rank is required")
        if self.pattern is Pattern.TRANSIENT and self.length < 1:
            raise ValueError("a transient fault needs length >= 1")
        if self.pattern is Pattern.INTERMITTENT and self.every < 2:
            raise ValueError("an intermittent fault needs every >= 2")
        if self.severity <= 0 or not math.isfinite(self.severity):
            raise ValueError(f"severity must be a positive number, got {self.severity}")

    def active(self, step: int) -> bool:
        """Whether the fault acts at ``step`` (the same answer on every rank)."""
        if step < self.onset:
            return False
        if self.pattern is Pattern.TRANSIENT:
            return step < self.onset + self.length
        if self.pattern is Pattern.INTERMITTENT:
            return (step - self.onset) % self.every == 0
        return True

    def factor(self, rank: int, step: int) -> float:
        """The kernel-time factor of a compute fault on ``rank`` at ``step`` (1.0 elsewhere)."""
        if self.kind is RealRunFaultKind.COMPUTE and rank == self.target and self.active(step):
            return self.severity
        return 1.0

    def stall(self, rank: int, step: int) -> float:
        """Seconds the data fetch of ``rank`` stalls at ``step``."""
        if self.kind is RealRunFaultKind.DATALOADER and rank == self.target and self.active(step):
            return self.stall_s
        return 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["kind"], out["pattern"] = self.kind.value, self.pattern.value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Fault:
        return cls(
            **{**data, "kind": RealRunFaultKind(data["kind"]), "pattern": Pattern(data.get("pattern", "persistent"))}
        )


@dataclass(frozen=True)
class CaseSpec:
    """One run of the lab.

    ``compute_s`` is each rank's kernel time per step (forward, backward, optimizer): the
    worker paces its kernels so that a step's compute takes ``compute_s`` times the work
    factor, whatever the host's own overhead. ``cpu_share`` of that time is a CPU-bound
    busy loop (host-side launch overhead and preprocessing), the rest a sleep (a GPU
    kernel as the host thread sees it). ``markers=False`` runs without the Monitor: the
    collective logger alone, so every record has step 0.
    """

    name: str
    layout: Parallelism
    ranks: int
    steps: int
    seed: int
    fault: Fault = field(default_factory=lambda: Fault(RealRunFaultKind.CLEAN))
    compute_s: float = 0.08
    width: int = 128
    layers: int = 4
    batch: int = 8
    netns: bool = False  # each rank in its own network namespace (link cases)
    pin: tuple[int, ...] = ()  # CPU per rank (cpu_contention), empty: not pinned
    cpu_share: float = 0.0  # share of the kernel time spent in a CPU-bound loop
    markers: bool = True  # the Monitor's step markers; False: the collective logger alone
    driver: Driver = Driver.LAB  # who runs the loop (:class:`Driver`); not ``lab``: layout ``ddp``

    def __post_init__(self) -> None:
        if self.driver is not Driver.LAB and self.layout is not Parallelism.DDP:
            raise ValueError(
                f"driver {self.driver.value} runs one data-parallel group: layout must be ddp, got {self.layout.value}"
            )
        if self.driver is Driver.EXPLICIT and self.markers:
            raise ValueError("driver explicit runs the collective logger alone: markers must be False")
        if self.driver in TRAINER_DRIVERS and not self.markers:
            raise ValueError(
                f"driver {self.driver.value} runs trainhealth's integration (its Monitor): markers must be True"
            )
        if self.driver is not Driver.LAB and self.fault.kind not in (
            RealRunFaultKind.COMPUTE,
            RealRunFaultKind.CLEAN,
            RealRunFaultKind.DATALOADER,
        ):
            raise ValueError(
                f"driver {self.driver.value} takes compute, dataloader and clean cases, got {self.fault.kind.value}"
            )
        if self.ranks < 2:
            raise ValueError("ranks must be at least 2")
        if self.layout is not Parallelism.DDP and self.ranks % 2:
            raise ValueError(f"layout {self.layout.value} needs an even number of ranks, got {self.ranks}")
        if self.layout is Parallelism.DP_PP and self.layers % 2:
            raise ValueError("layout dp_pp needs an even number of layers")
        if self.steps < 5:
            raise ValueError("steps must be at least 5")
        if self.fault.target is not None and not 0 <= self.fault.target < self.ranks:
            raise ValueError(f"target rank {self.fault.target} is not below {self.ranks} ranks")
        if self.fault.kind is RealRunFaultKind.STAGE_IMBALANCE and self.layout is not Parallelism.DP_PP:
            raise ValueError("stage_imbalance needs layout dp_pp")
        if self.pin and len(self.pin) != self.ranks:
            raise ValueError("pin must give one CPU per rank")
        if not 0.0 <= self.cpu_share < 1.0:
            raise ValueError(f"cpu_share must be in [0, 1), got {self.cpu_share}")
        if self.compute_s <= 0:
            raise ValueError(f"compute_s must be positive, got {self.compute_s}")

    @property
    def replicas(self) -> int:
        return self.ranks if self.layout is Parallelism.DDP else self.ranks // 2

    def replica(self, rank: int) -> int:
        """The data-parallel replica of ``rank`` (the ranks of one replica process the same batch)."""
        if self.layout is Parallelism.DP_PP:
            return rank % self.replicas
        if self.layout is Parallelism.DP_TP:
            return rank // 2
        return rank

    def stage(self, rank: int) -> int:
        return rank // self.replicas if self.layout is Parallelism.DP_PP else 0

    def work_factor(self, rank: int, step: int) -> float:
        """Kernel-time factor of ``rank`` at ``step``: the fault times the workload's own unevenness."""
        factor = self.fault.factor(rank, step)
        if self.fault.kind is RealRunFaultKind.SEQ_IMBALANCE:
            import numpy as np

            spread = self.fault.severity - 1.0  # e.g. 1.4: work drawn from [0.6, 1.4] x the mean
            draw = np.random.default_rng([self.seed, step, self.replica(rank), 7]).uniform(1 - spread, 1 + spread)
            factor *= float(draw)
        if self.fault.kind is RealRunFaultKind.STAGE_IMBALANCE and self.stage(rank) == 1:
            factor *= self.fault.severity
        return factor

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["layout"], out["fault"], out["pin"] = self.layout.value, self.fault.to_dict(), list(self.pin)
        out["driver"] = self.driver.value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaseSpec:
        """The inverse of :meth:`to_dict`; a spec written before ``driver`` existed is the lab's own loop."""
        return cls(
            **{
                **data,
                "layout": Parallelism(data["layout"]),
                "fault": Fault.from_dict(data["fault"]),
                "pin": tuple(data.get("pin", ())),
                "driver": Driver(data.get("driver", "lab")),
            }
        )

    @classmethod
    def load(cls, path: str | Path) -> CaseSpec:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


def host_name(rank: int) -> str:
    """The host name a rank reports when it is not in a network namespace (one GPU per host)."""
    return f"lab-host-{rank}"


@dataclass(frozen=True)
class Truth:
    """What was injected and what a right answer is (``truth.json``)."""

    case: str
    layout: str
    ranks: int
    seed: int
    steps: int
    kind: str
    pattern: str
    target: int | None
    target_host: str | None
    onset: int
    severity: float | None  # None where the lab sets no severity (clean runs, CPU contention)
    severity_band: str
    expected_verdict: str
    accepted_verdicts: tuple[str, ...]
    components: tuple[str, ...]  # a right top-1 suspect is one of these
    fault: dict[str, Any]
    notes: tuple[str, ...] = ()
    driver: str = "lab"  # Driver.value (absent from truth files written before it existed)
    markers: bool = True  # whether the Monitor wrote step markers (on rank 0 only for accelerate)

    def expected(self) -> Expected:
        """What a right answer is, for :func:`trainhealth_lab.scoring.score`."""
        return Expected(
            self.expected_verdict,
            self.accepted_verdicts,
            self.components,
            ranks=() if self.target is None else (self.target,),
            link=self.kind.startswith("link"),
            transient=self.pattern == Pattern.TRANSIENT.value,
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["accepted_verdicts"], out["components"], out["notes"] = (
            list(self.accepted_verdicts),
            list(self.components),
            list(self.notes),
        )
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Truth:
        return cls(
            **{
                **data,
                "accepted_verdicts": tuple(data["accepted_verdicts"]),
                "components": tuple(data["components"]),
                "notes": tuple(data.get("notes", ())),
            }
        )


def severity_band(severity: float | None) -> str:
    """``<1.2``, ``1.2-1.5``, ``1.5-2``, ``>=2`` (``-`` when unknown)."""
    if severity is None or not math.isfinite(severity):
        return "-"
    if severity < 1.2:
        return "<1.2"
    if severity < 1.5:
        return "1.2-1.5"
    if severity < 2.0:
        return "1.5-2"
    return ">=2"


def truth(
    spec: CaseSpec, hosts: dict[int, str] | None = None, *, onset: int | None = None, notes: tuple[str, ...] = ()
) -> Truth:
    """The ground truth of ``spec`` (``onset`` overrides the planned one: the step a mid-run switch happened)."""
    fault = spec.fault
    if onset is not None:
        fault = replace(fault, onset=onset)
    target = fault.target
    target_host = None
    if target is not None:
        target_host = (hosts or {}).get(target, host_name(target))
    kind = fault.kind
    accepted: tuple[str, ...]
    components: tuple[str, ...]
    if kind is RealRunFaultKind.CLEAN:
        verdict, accepted, components = "healthy", ("healthy",), ()
    elif kind in CONTROL_KINDS:
        verdict, accepted, components = "imbalance", ("imbalance", "healthy"), ()
    elif kind in LINK_KINDS:
        verdict, accepted = "communication", ("communication",)
        components = (f"nic:rank-{target}", f"host:{target_host}", f"link:rank-{target}")
    elif kind is RealRunFaultKind.COMPUTE:
        verdict, accepted, components = "compute", ("compute",), (f"gpu:rank-{target}",)
    else:  # host-side slowness of one rank: its device is late to every collective, as a slow GPU would be
        verdict, accepted, components = "compute", ("compute",), (f"gpu:rank-{target}", f"host:{target_host}")
    if not spec.markers or spec.ranks == 2 or spec.driver in (Driver.ACCELERATE, Driver.FSDP2):
        # without step markers, with two ranks (no majority to compare the slow one with), and for the drivers
        # whose traces were incomplete when the suite was written (Accelerate's markers on rank 0 only; FSDP2's
        # all_gather_single and reduce_scatter_single not logged), "insufficient data" is an honest answer;
        # "healthy" for a fault is not
        accepted = accepted + ("insufficient_data",)
    if fault.pattern is Pattern.TRANSIENT and kind not in CONTROL_KINDS | {RealRunFaultKind.CLEAN}:
        # a slowness that came and went is an event with its steps, not a faulty device: once it is over the
        # window may read healthy (or insufficient data), with the event naming the rank (scoring.py)
        accepted = tuple(dict.fromkeys(accepted + ("healthy", "insufficient_data")))
    if spec.driver is Driver.HF_TRAINER:
        notes = notes + ("the trace's steps are the Trainer's state.global_step: the lab's step k is trace step k+1",)
    severity = fault.severity if kind not in (RealRunFaultKind.CLEAN, RealRunFaultKind.CPU_CONTENTION) else None
    return Truth(
        case=spec.name,
        layout=spec.layout.value,
        ranks=spec.ranks,
        seed=spec.seed,
        steps=spec.steps,
        kind=kind.value,
        pattern=fault.pattern.value,
        target=target,
        target_host=target_host,
        onset=fault.onset,
        severity=severity,
        severity_band=severity_band(severity),
        expected_verdict=verdict,
        accepted_verdicts=accepted,
        components=components,
        fault=fault.to_dict(),
        notes=notes,
        driver=spec.driver.value,
        markers=spec.markers,
    )
