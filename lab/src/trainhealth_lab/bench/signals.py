"""Labelled training signals: a seeded generator and a scorer for detectors.

The generator makes a loss curve, a gradient-norm series and a step-time series
of ``steps`` steps with labelled events: loss spikes that decay over a few
steps, gradient-norm spikes, delta-irregular steps (a step 1.6-3x longer) and a
persistent step-time degradation (+8% from a random step on). Each detector
runs on the signals it is meant for through a :class:`~trainhealth._internal.detectors.watch.Watch`,
and every anomaly is matched to the labelled events: an anomaly opening between
an event's start and ``tolerance`` steps after its end detects it (delay =
opening step - start); one that detects nothing is a false positive.

>>> run = generate(seed=0, steps=3000)
>>> sorted({e.kind for e in run.events})
['degradation', 'grad_spike', 'irregular_step', 'loss_spike']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from trainhealth._internal.detectors.spec import parse_item
from trainhealth._internal.detectors.watch import Watch

__all__ = ["DetectorResult", "LabelledEvent", "TrainingRun", "evaluate", "generate"]


@dataclass(frozen=True)
class LabelledEvent:
    kind: str  # loss_spike, grad_spike, irregular_step, degradation
    signal: str  # loss, grad_norm, step_time
    start: int
    end: int


@dataclass(frozen=True)
class TrainingRun:
    signals: dict[str, np.ndarray]
    events: tuple[LabelledEvent, ...]


def generate(seed: int, steps: int = 5000) -> TrainingRun:
    """A training run's loss, gradient norm and step time with labelled events."""
    rng = np.random.default_rng(seed)
    t = np.arange(steps)
    loss = 2.2 + 2.5 * np.exp(-t / (steps / 5)) + rng.normal(0, 0.015, steps)
    grad_norm = np.exp(rng.normal(0.0, 0.08, steps)) * (0.6 + 0.6 * np.exp(-t / (steps / 10)))
    step_time = 0.5 * (1 + rng.normal(0, 0.01, steps))
    events: list[LabelledEvent] = []
    warm = steps // 10  # no events during the detectors' warm-up
    for start in np.sort(rng.choice(np.arange(warm, steps - 20), size=max(3, steps // 800), replace=False)):
        length = int(rng.integers(1, 5))
        height = float(rng.uniform(0.15, 0.8))
        loss[start : start + length] += height * np.exp(-np.arange(length) / 1.5)
        events.append(LabelledEvent("loss_spike", "loss", int(start), int(start + length - 1)))
    for start in np.sort(rng.choice(np.arange(warm, steps - 5), size=max(3, steps // 800), replace=False)):
        grad_norm[start] *= float(rng.uniform(3.0, 10.0))
        events.append(LabelledEvent("grad_spike", "grad_norm", int(start), int(start)))
    irregular = np.sort(rng.choice(np.arange(warm, steps), size=max(5, steps // 100), replace=False))
    step_time[irregular] *= rng.uniform(1.6, 3.0, len(irregular))
    events += [LabelledEvent("irregular_step", "step_time", int(i), int(i)) for i in irregular]
    onset = int(rng.integers(steps // 2, steps - steps // 5))
    step_time[onset:] *= 1.08
    events.append(LabelledEvent("degradation", "step_time", onset, steps - 1))
    return TrainingRun({"loss": loss, "grad_norm": grad_norm, "step_time": step_time}, tuple(events))


@dataclass(frozen=True)
class DetectorResult:
    detector: str
    signal: str
    kind: str  # the event kind scored for recall and delay
    events: int
    detected: int
    anomalies: int
    false_positives: int
    delays: tuple[int, ...]

    @property
    def recall(self) -> float:
        return self.detected / self.events if self.events else float("nan")

    @property
    def precision(self) -> float:
        return 1.0 - self.false_positives / self.anomalies if self.anomalies else float("nan")

    @property
    def median_delay(self) -> float:
        return float(np.median(self.delays)) if self.delays else float("nan")


def evaluate(runs: Sequence[TrainingRun], detector: str, signal: str, kind: str, tolerance: int = 5) -> DetectorResult:
    """Run ``detector`` (a spec item) on ``signal`` of every run; score it on events of ``kind``.

    Anomalies that match an event of another kind on the same signal are neither
    true nor false positives (an irregular step is not what a level-shift
    detector is for, but it is no false alarm either).
    """
    events = detected = anomalies = false_positives = 0
    delays: list[int] = []
    name = ""
    for run in runs:
        spec = parse_item(detector, signal)
        name = spec.detector.name
        watch = Watch(signal, spec.detector, decision=spec.decision())
        opened: list[int] = []
        for step, value in enumerate(run.signals[signal]):  # updates with a step: start_step is an int
            opened += [cast(int, a.start_step) for a in watch.update([value], step=step).opened]
        targets = [e for e in run.events if e.signal == signal and e.kind == kind]
        others = [e for e in run.events if e.signal == signal and e.kind != kind]
        events += len(targets)
        anomalies += len(opened)
        for event in targets:
            hits = [s for s in opened if event.start <= s <= event.end + tolerance]
            if hits:
                detected += 1
                delays.append(min(hits) - event.start)
        for step in opened:
            if not any(e.start <= step <= e.end + tolerance for e in targets + others):
                false_positives += 1
    return DetectorResult(name, signal, kind, events, detected, anomalies, false_positives, tuple(delays))
