"""What one real-run case is: layout, ranks, steps, seed and the injected fault, and its ground truth.

The fault is trainhealth's one :class:`~trainhealth._internal.faults.Fault`; the lab's kinds, one
:class:`LabFault` each (``compute``, ``link_rate``, ``link_delay``, ``cpu_contention``, ``dataloader`` and the
controls ``clean``, ``seq_imbalance``, ``stage_imbalance``), are declared here as fault kinds, and
:func:`lab_fault` lays one out in time by :class:`Pattern`; a kind the lab does not inject is refused with its
name. A :class:`CaseSpec` is written to ``spec.json`` in the run directory; every rank process reads it and
applies the same fault schedule (:func:`compute_factor`), so the schedule is the same on every rank and in the
ground truth.

>>> fault = lab_fault("compute", Pattern.INTERMITTENT, target=2, onset=10, severity=2.0, every=4)
>>> [compute_factor(fault, 2, step) for step in (9, 10, 11, 14)], compute_factor(fault, 1, 10)
([1.0, 2.0, 1.0, 2.0], 1.0)
>>> fault.describe()
'every 4th step from step 10: slow kernels x2 on rank 2'
>>> spec = CaseSpec("ddp-compute", Parallelism.DDP, ranks=4, steps=30, seed=0, fault=fault)
>>> CaseSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
True
>>> truth(spec).expected_verdict, truth(spec).components
('compute', ('gpu:rank-2',))
>>> truth(replace(spec, markers=False)).accepted_verdicts
('compute', 'insufficient_data')
>>> truth(replace(spec, ranks=2, fault=replace(fault, ranks=(1,)))).accepted_verdicts  # no majority to compare with
('compute', 'insufficient_data')
>>> explicit = CaseSpec("explicit", Parallelism.DDP, 4, 40, 0, fault, driver=Driver.EXPLICIT, markers=False)
>>> CaseSpec.from_dict(explicit.to_dict()).driver
<Driver.EXPLICIT: 'explicit'>
>>> LabFault("gpu")  # the cluster simulator's kind, not the lab's
Traceback (most recent call last):
...
ValueError: the lab injects no fault 'gpu': expected one of compute, link_rate, ..., stage_imbalance
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

from trainhealth._internal.config.fields import Range
from trainhealth._internal.faults import KINDS, Fault, FaultError, FaultKind, Param, register
from trainhealth_lab.scoring import Expected

__all__ = [
    "LAB_FAULTS",
    "TRAINER_DRIVERS",
    "CaseSpec",
    "Driver",
    "LabFault",
    "Parallelism",
    "Pattern",
    "Truth",
    "compute_factor",
    "host_name",
    "lab_fault",
    "severity_band",
    "stall_seconds",
    "truth",
    "with_onset",
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


class Pattern(str, enum.Enum):
    """How a case's fault is laid out in time (the values of :attr:`Fault.pattern`)."""

    PERSISTENT = "persistent"  # from the onset to the end (onset 0: from the start)
    TRANSIENT = "transient"  # ``length`` steps from the onset
    INTERMITTENT = "intermittent"  # every ``every``-th step from the onset


class LabFault(str, enum.Enum):
    """A kind of fault the lab injects: each one kind of trainhealth's :class:`Fault` (declared below), which
    says whether it is a control (nothing to find) and whether it takes a severity; ``link`` kinds slow a rank's
    network link. ``LabFault("gpu")`` is a ``ValueError`` naming the kind."""

    COMPUTE = "compute"  # the rank's kernels slower
    LINK_RATE = "link_rate"  # its link's rate limited
    LINK_DELAY = "link_delay"  # its link's packets delayed
    CPU_CONTENTION = "cpu_contention"  # busy processes on its CPU
    DATALOADER = "dataloader"  # its data fetch stalls
    CLEAN = "clean"  # control: no fault
    SEQ_IMBALANCE = "seq_imbalance"  # control: uneven work per replica
    STAGE_IMBALANCE = "stage_imbalance"  # control: the last pipeline stage slower

    def __str__(self) -> str:
        return self.value

    @classmethod
    def _missing_(cls, value: object) -> NoReturn:
        raise ValueError(f"the lab injects no fault {value!r}: expected one of {', '.join(k.value for k in cls)}")

    @property
    def declared(self) -> FaultKind:
        """Its declaration in trainhealth's one fault vocabulary."""
        return KINDS[self.value]

    @property
    def control(self) -> bool:
        return self.declared.control

    @property
    def link(self) -> bool:
        return self in (LabFault.LINK_RATE, LabFault.LINK_DELAY)


def _positive(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"must be a positive number, got {value!r}")
    return float(value)


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 60:
        raise ValueError(f"must be from 0 to 60 seconds, got {value!r}")
    return float(value)


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 64:
        raise ValueError(f"must be an integer from 0 to 64, got {value!r}")
    return value


#: The lab's factors: a compute fault's kernel-time factor, a control's spread, or for a link or a stall the
#: step slowdown the lab aims for.
_FACTOR = Range(0.0, 100.0, above_low=True)
_K = LabFault
for _kind in (
    FaultKind(_K.COMPUTE.value, "lab", "slow kernels x{severity:g}", severity=_FACTOR, needs_ranks=True),
    FaultKind(
        _K.LINK_RATE.value,
        "lab",
        "link limited to {rate_mbit} Mbit/s (steps x{severity:.2f})",
        severity=_FACTOR,
        params={"rate_mbit": Param(None, _positive, "tbf rate limit")},
        needs_ranks=True,
    ),
    FaultKind(
        _K.LINK_DELAY.value,
        "lab",
        "link delayed {delay_ms} ms (steps x{severity:.2f})",
        severity=_FACTOR,
        params={"delay_ms": Param(None, _positive, "netem delay")},
        needs_ranks=True,
    ),
    FaultKind(
        _K.CPU_CONTENTION.value,
        "lab",
        "{hogs} busy processes on its CPU",
        params={"hogs": Param(0, _count, "busy processes")},
        needs_ranks=True,
    ),
    FaultKind(
        _K.DATALOADER.value,
        "lab",
        "data fetch stalls {stall_s:g} s (steps x{severity:.2f})",
        severity=_FACTOR,
        params={"stall_s": Param(0.0, _seconds, "seconds per affected step")},
        needs_ranks=True,
    ),
    FaultKind(_K.CLEAN.value, "lab", "no fault (control)", control=True),
    FaultKind(
        _K.SEQ_IMBALANCE.value,
        "lab",
        "work drawn per step within x{severity:g} (control)",
        severity=_FACTOR,
        control=True,
    ),
    FaultKind(
        _K.STAGE_IMBALANCE.value, "lab", "the last stage x{severity:g} (control)", severity=_FACTOR, control=True
    ),
):
    register(_kind)

#: The names of the lab's kinds, as the fault vocabulary's contract tests list each injector's.
LAB_FAULTS = tuple(kind.value for kind in LabFault)


def lab_fault(
    kind: LabFault | str,
    pattern: Pattern = Pattern.PERSISTENT,
    target: int | None = None,
    onset: int = 0,
    severity: float = 1.0,
    *,
    length: int = 0,
    every: int = 0,
    **params: Any,
) -> Fault:
    """A lab fault on rank ``target`` from step ``onset``: persistent, ``length`` steps (transient) or every
    ``every``-th step (intermittent); ``params`` are the kind's settings (``rate_mbit``, ``delay_ms``, ...)."""
    kind = LabFault(kind)
    if pattern is Pattern.TRANSIENT and length < 1:
        raise FaultError(f"{kind}: a transient fault needs length >= 1")
    if pattern is Pattern.INTERMITTENT and every < 2:
        raise FaultError(f"{kind}: an intermittent fault needs every >= 2")
    return Fault(
        kind.value,
        () if target is None else (target,),
        step=onset,
        until=onset + length - 1 if pattern is Pattern.TRANSIENT else None,
        every=every if pattern is Pattern.INTERMITTENT else 1,
        severity=severity,
        params=params,
    )


def compute_factor(fault: Fault, rank: int, step: int) -> float:
    """The kernel-time factor of a compute fault on ``rank`` at ``step`` (1.0 elsewhere)."""
    return fault.severity if fault.kind == LabFault.COMPUTE and fault.active(step, rank) else 1.0


def stall_seconds(fault: Fault, rank: int, step: int) -> float:
    """Seconds the data fetch of ``rank`` stalls at ``step``."""
    return float(fault.params["stall_s"]) if fault.kind == LabFault.DATALOADER and fault.active(step, rank) else 0.0


def with_onset(fault: Fault, onset: int) -> Fault:
    """``fault`` moved to begin at step ``onset`` (a transient one keeps its length)."""
    until = None if fault.until is None else fault.until + onset - fault.step
    return replace(fault, step=onset, until=until)


def _legacy_fault(data: dict[str, Any]) -> Fault:
    """A fault as ``spec.json`` files written before the one vocabulary hold it (onset, pattern, length, ...)."""
    params = {name: data[name] for name in ("rate_mbit", "delay_ms", "stall_s", "hogs") if data.get(name) is not None}
    kind = LabFault(data["kind"])
    params = {name: value for name, value in params.items() if name in kind.declared.params}
    severity = data.get("severity", 1.0) if kind.declared.severity is not None else 1.0
    return lab_fault(
        kind,
        Pattern(data.get("pattern", "persistent")),
        data.get("target"),
        data.get("onset", 0),
        severity,
        length=data.get("length", 0),
        every=data.get("every", 0),
        **params,
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
    fault: Fault = field(default_factory=lambda: Fault(LabFault.CLEAN.value))
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
        kind = self.kind  # a fault the lab does not inject: refused naming it
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
        if self.driver is not Driver.LAB and kind not in (LabFault.COMPUTE, LabFault.CLEAN, LabFault.DATALOADER):
            raise ValueError(
                f"driver {self.driver.value} takes compute, dataloader and clean cases, got {self.fault.kind}"
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
        if kind is LabFault.STAGE_IMBALANCE and self.layout is not Parallelism.DP_PP:
            raise ValueError("stage_imbalance needs layout dp_pp")
        if self.pin and len(self.pin) != self.ranks:
            raise ValueError("pin must give one CPU per rank")
        if not 0.0 <= self.cpu_share < 1.0:
            raise ValueError(f"cpu_share must be in [0, 1), got {self.cpu_share}")
        if self.compute_s <= 0:
            raise ValueError(f"compute_s must be positive, got {self.compute_s}")

    @property
    def kind(self) -> LabFault:
        """The kind of its fault."""
        return LabFault(self.fault.kind)

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
        factor = compute_factor(self.fault, rank, step)
        if self.kind is LabFault.SEQ_IMBALANCE:
            import numpy as np

            spread = self.fault.severity - 1.0  # e.g. 1.4: work drawn from [0.6, 1.4] x the mean
            draw = np.random.default_rng([self.seed, step, self.replica(rank), 7]).uniform(1 - spread, 1 + spread)
            factor *= float(draw)
        if self.kind is LabFault.STAGE_IMBALANCE and self.stage(rank) == 1:
            factor *= self.fault.severity
        return factor

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["layout"], out["fault"], out["pin"] = self.layout.value, self.fault.to_dict(), list(self.pin)
        out["driver"] = self.driver.value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaseSpec:
        """The inverse of :meth:`to_dict`; a spec written before ``driver`` existed is the lab's own loop, and one
        written before the one fault vocabulary has its fault read the old way."""
        return cls(
            **{
                **data,
                "layout": Parallelism(data["layout"]),
                "fault": _legacy_fault(data["fault"]) if "onset" in data["fault"] else Fault.from_dict(data["fault"]),
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
    kind: LabFault  # from a truth file: its name, refused when the lab injects no such fault
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", LabFault(self.kind))

    def expected(self) -> Expected:
        """What a right answer is, for :func:`trainhealth_lab.scoring.score`."""
        return Expected(
            self.expected_verdict,
            self.accepted_verdicts,
            self.components,
            ranks=() if self.target is None else (self.target,),
            link=self.kind.link,
            transient=self.pattern == Pattern.TRANSIENT.value,
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["kind"] = self.kind.value
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
        fault = with_onset(fault, onset)
    target = fault.target
    target_host = None
    if target is not None:
        target_host = (hosts or {}).get(target, host_name(target))
    kind = spec.kind
    accepted: tuple[str, ...]
    components: tuple[str, ...]
    if kind is LabFault.CLEAN:
        verdict, accepted, components = "healthy", ("healthy",), ()
    elif kind.control:
        verdict, accepted, components = "imbalance", ("imbalance", "healthy"), ()
    elif kind.link:
        verdict, accepted = "communication", ("communication",)
        components = (f"nic:rank-{target}", f"host:{target_host}", f"link:rank-{target}")
    elif kind is LabFault.COMPUTE:
        verdict, accepted, components = "compute", ("compute",), (f"gpu:rank-{target}",)
    elif kind in (LabFault.CPU_CONTENTION, LabFault.DATALOADER):
        # host-side slowness of one rank: its device is late to every collective, as a slow GPU would be
        verdict, accepted, components = "compute", ("compute",), (f"gpu:rank-{target}", f"host:{target_host}")
    else:  # a kind added to LabFault without its right answer
        raise ValueError(f"no ground truth for lab fault {kind.value!r}")
    if not spec.markers or spec.ranks == 2 or spec.driver in (Driver.ACCELERATE, Driver.FSDP2):
        # without step markers, with two ranks (no majority to compare the slow one with), and for the drivers
        # whose traces were incomplete when the suite was written (Accelerate's markers on rank 0 only; FSDP2's
        # all_gather_single and reduce_scatter_single not logged), "insufficient data" is an honest answer;
        # "healthy" for a fault is not
        accepted = accepted + ("insufficient_data",)
    if fault.pattern == Pattern.TRANSIENT and not kind.control:
        # a slowness that came and went is an event with its steps, not a faulty device: once it is over the
        # window may read healthy (or insufficient data), with the event naming the rank (scoring.py)
        accepted = tuple(dict.fromkeys(accepted + ("healthy", "insufficient_data")))
    if spec.driver is Driver.HF_TRAINER:
        notes = notes + ("the trace's steps are the Trainer's state.global_step: the lab's step k is trace step k+1",)
    severity = fault.severity if kind.declared.severity is not None else None
    return Truth(
        case=spec.name,
        layout=spec.layout.value,
        ranks=spec.ranks,
        seed=spec.seed,
        steps=spec.steps,
        kind=kind,
        pattern=fault.pattern,
        target=target,
        target_host=target_host,
        onset=fault.step,
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
