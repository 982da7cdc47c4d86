"""Silent-data-corruption trials on real DDP training: inject faults, record what each detector saw.

One trial is a short data-parallel training run of :class:`~trainhealth._internal.demo.tiny_gpt.TinyGPT`
on gloo with the Monitor on every rank and a fault schedule for the
:class:`~trainhealth._internal.injectors.schedule.Injector`. Each rank returns the faults
it injected (ground truth) and the detections it made, by detector:

* ``fingerprint`` — the cross-replica parameter fingerprint named this rank;
* ``grad_norm`` — the peer comparison of local gradient norms named this rank;
* ``loss_spike`` — a loss detector (other than ``nonfinite``) opened an anomaly;
* ``nonfinite`` — a non-finite loss or gradient norm, or a non-finite activation.

Each rank also returns its first ``nonfinite_origin`` (step, block, local or
received), the first step whose loss or gradient norm (after the all-reduce) went bad on
it — what a flip must reach to have corrupted training — and, with ``measure_peaks``
(for clean trials), the largest magnitudes
its block outputs and local gradients reached (what :data:`~trainhealth._internal.exporters.training.provenance.OVERFLOW_BOUND`
must stay far above).

``benchmarks/sdc_detection.py`` runs the grid; the tests run single trials.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["CleanPeaks", "Detection", "FirstOrigin", "Trial", "TrialResult", "run_trials"]


@dataclass(frozen=True)
class Trial:
    """A training run: ``faults`` is an injector schedule; ``settings`` overrides Monitor settings;
    ``measure_peaks`` records the largest block output and local gradient (a host read every step)."""

    name: str
    faults: tuple[dict[str, Any], ...] = ()
    steps: int = 200
    seed: int = 0
    settings: dict[str, Any] = field(default_factory=dict)
    measure_peaks: bool = False


@dataclass(frozen=True)
class Detection:
    detector: str
    step: int
    rank: int  # the rank that reported it (for fingerprint and grad_norm: the suspect)
    detail: str = ""


@dataclass(frozen=True)
class FirstOrigin:
    """This rank's first ``nonfinite_origin`` event."""

    step: int
    block: str
    where: str  # local or received
    stage: str  # output, gradient or all_reduce


@dataclass(frozen=True)
class CleanPeaks:
    """Largest magnitude over a trial: of any block output and of any local gradient."""

    output: float
    gradient: float


@dataclass(frozen=True)
class TrialResult:
    trial: str
    rank: int
    injected: list[dict[str, Any]]
    detections: list[Detection]
    step_seconds: float  # median wall time of a training step on this rank
    check_seconds: dict[str, float]  # median wall time of each cross-replica check
    origin: FirstOrigin | None = None
    clean_peaks: CleanPeaks | None = None  # with Trial.measure_peaks
    #: the first step whose loss or gradient norm was NaN, infinite or above the overflow bound on this rank
    reached_training: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


MODEL = {"vocab": 64, "width": 32, "layers": 2, "heads": 2, "context": 32}
BATCH = 8


def run_trials(
    rank: int, world: int, trials: Sequence[Trial], model_shape: dict[str, int] | None = None, batch: int = BATCH
) -> list[TrialResult]:
    """Run ``trials`` one after the other on this rank (torch.distributed must be initialised on gloo)."""
    return [_run_trial(rank, world, trial, model_shape or MODEL, batch) for trial in trials]


def _run_trial(rank: int, world: int, trial: Trial, shape: dict[str, int], batch: int) -> TrialResult:
    import statistics

    import torch

    from trainhealth._internal.demo.tiny_gpt import TinyGPT, synthetic_batch
    from trainhealth._internal.exporters.monitor import Monitor
    from trainhealth._internal.injectors.schedule import Injector

    torch.manual_seed(trial.seed)
    model = TinyGPT(**shape)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    settings = {"prometheus": False, "otel": False, "gpu_backend": "off", "stats_every": 10, **trial.settings}
    monitor = Monitor(ddp, optimizer, env={}, **settings)
    detections: list[Detection] = []
    origins: list[FirstOrigin] = []
    monitor.events.add_listener(lambda event: _record(event, rank, detections, origins))
    injector = Injector(list(trial.faults), model=model, optimizer=optimizer, rank=rank, seed=trial.seed)
    peaks = _PeakProbe(torch, ddp) if trial.measure_peaks else None
    step_times: list[float] = []
    check_times: dict[str, list[float]] = {}
    reached: int | None = None
    try:
        for step in range(trial.steps):
            began = time.perf_counter()
            injector.begin_step(step)
            tokens = synthetic_batch(
                shape["vocab"], shape["context"], batch, seed=trial.seed * 100_003 + step * world + rank
            )
            loss = _ddp_loss(ddp, tokens)
            loss.backward()
            if reached is None and _reached_training(torch, loss, model):  # lab only: a host read per step
                reached = step
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            trained = time.perf_counter()
            monitor.step(loss=loss, tokens=tokens.numel(), step=step)
            done = time.perf_counter()
            if peaks is not None:
                peaks.read()
            step_times.append(trained - began)
            for result in monitor.health.checks.results if monitor.health and monitor.health.checks else []:
                if result.step == step:
                    check_times.setdefault(result.check, []).append(done - trained)
    finally:
        monitor.close()
        injector.close()
        if peaks is not None:
            peaks.close()
    return TrialResult(
        trial=trial.name,
        rank=rank,
        injected=list(injector.log),
        detections=detections,
        step_seconds=statistics.median(step_times) if step_times else 0.0,
        check_seconds={check: statistics.median(times) for check, times in check_times.items()},
        origin=origins[0] if origins else None,
        clean_peaks=None if peaks is None else CleanPeaks(peaks.output, peaks.gradient),
        reached_training=reached,
    )


def _reached_training(torch: Any, loss: Any, model: Any) -> bool:
    """Whether this step's loss or gradient norm (DDP's averaged gradients) is bad as provenance judges it."""
    from trainhealth._internal.exporters.training.provenance import OVERFLOW_BOUND

    norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    return not (abs(float(loss.detach())) <= OVERFLOW_BOUND and float(norm) <= OVERFLOW_BOUND)


class _PeakProbe:
    """The provenance hooks' peaks, read on the host every step (lab only: a host sync per step)."""

    def __init__(self, torch: Any, model: Any) -> None:
        from trainhealth._internal.exporters.model_health import transformer_blocks
        from trainhealth._internal.exporters.training.model_signals import ModelSignals

        self._signals = ModelSignals(torch, model, transformer_blocks(torch, model))
        self.output = 0.0
        self.gradient = 0.0

    def read(self) -> None:
        tensors, _ = self._signals.take()
        for name, tensor, _ in tensors:
            peak = float(tensor.max())
            if name == "block_peak":
                self.output = max(self.output, peak)
            elif name == "grad_peak":
                self.gradient = max(self.gradient, peak)

    def close(self) -> None:
        self._signals.close()


def _ddp_loss(ddp: Any, tokens: Any) -> Any:
    import torch

    logits = ddp(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def _record(event: Any, rank: int, detections: list[Detection], origins: list[FirstOrigin]) -> None:
    attributes = event.attributes
    step = attributes.get("step")
    if event.name == "sdc_suspect":
        detections.append(
            Detection(str(attributes["check"]), int(step), int(attributes["rank"]), str(attributes.get("tensors", "")))
        )
    elif event.name == "nonfinite_origin":
        detections.append(Detection("nonfinite", int(step), rank, str(attributes["block"])))
        origins.append(
            FirstOrigin(int(step), str(attributes["block"]), str(attributes["where"]), str(attributes["stage"]))
        )
    elif event.name == "anomaly" and step is not None:
        if attributes["detector"] == "nonfinite":
            detections.append(Detection("nonfinite", int(step), rank, str(attributes["signal"])))
        elif attributes["signal"] == "loss":
            detections.append(Detection("loss_spike", int(step), rank, str(attributes["detector"])))
