"""Scoring training-signal detectors on the corpus of real training runs (:mod:`trainhealth_lab.corpus`).

A candidate is a set of detectors on one or more signals (a ``detectors``
setting such as ``"loss=divergence;grad_norm=divergence"``); it detects an event
when any of its detectors opens an event (:class:`~trainhealth._internal.detectors.watch.Watch`)
in the event's window. As in the Monitor, the detectors see each signal from
step ``skip`` (the ``detector_warmup`` setting, 20) on. Per kind of event:

* sharp (learning-rate blow-up, corrupted batch, overflow, bit flips whose effect
  shows in a watched signal, optimizer reset): recall within ``SHARP_STEPS`` (2)
  steps of the cause step, and the median delay of detections in the window;
* divergence: the lead, collapse step minus the first detection at or after the
  cause step (detections before it are false alarms), and the share detected
  before the collapse;
* shift (a bad shard): recall in the window and the median delay;
* false alarms per 1,000 healthy steps: every step of the clean runs and the
  steps before ``healthy_until`` of the others, warm-up, schedule changes and
  checkpoints included (from step ``skip``, as the Monitor sees them).

>>> import pandas as pd
>>> from trainhealth_lab.corpus import CorpusRun
>>> loss = [2.0 + 0.01 * (i % 3) for i in range(100)]
>>> loss[60] = 8.0
>>> signals = pd.DataFrame({"step": range(100), "loss": loss, "grad_norm": 1.0, "lr": 1e-3, "step_time": 0.1})
>>> labels = {"run": "r", "scenario": "corrupted_batch", "kind": "sharp", "cause_step": 60, "window": [60, 80],
...           "collapse_step": None, "healthy_until": 60}
>>> result = score_corpus([CorpusRun("r", labels, signals)], "zscore", "loss=zscore(direction=up)")
>>> result.sharp.detected, result.sharp.events, result.false_alarms, result.healthy_steps
(1, 1, 0, 40)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trainhealth._internal.config import DetectorSettings
from trainhealth._internal.detectors.spec import WatchSpec, parse_spec
from trainhealth._internal.detectors.watch import Watch
from trainhealth_lab.corpus import CorpusRun

__all__ = ["SHARP_STEPS", "CorpusScore", "DivergenceScore", "EventScore", "detections", "observable", "score_corpus"]

#: A sharp event counts as caught when an event opens within this many steps after its cause step.
SHARP_STEPS = 2
#: Bit flips count as events of a signal only where the signal shows them (see :func:`observable`).
_BIT_FLIPS = ("bit_flip_param", "bit_flip_grad")
_REFERENCE_STEPS = 50


@dataclass(frozen=True)
class EventScore:
    """Events of one kind: how many, how many were caught (sharp ones: within :data:`SHARP_STEPS`), and the
    delays of the first detection in each event's window (steps after the cause)."""

    events: int
    detected: int
    delays: tuple[int, ...]

    @property
    def recall(self) -> float:
        return self.detected / self.events if self.events else float("nan")

    @property
    def median_delay(self) -> float:
        return float(np.median(self.delays)) if self.delays else float("nan")


@dataclass(frozen=True)
class DivergenceScore:
    """Divergences: how many, how many caught before the collapse, and the leads (collapse - detection)."""

    events: int
    collapsing: int  # events with a collapse step in the run
    before_collapse: int
    leads: tuple[int, ...]

    @property
    def share_before_collapse(self) -> float:
        return self.before_collapse / self.collapsing if self.collapsing else float("nan")

    @property
    def median_lead(self) -> float:
        """The median lead over the collapsing events, an undetected one counting as a lead of 0."""
        if not self.collapsing:
            return float("nan")
        return float(np.median(list(self.leads) + [0] * (self.collapsing - len(self.leads))))


@dataclass(frozen=True)
class CorpusScore:
    """One candidate on the corpus: sharp events (all, and corrupted batches with overflows), divergences,
    shifts, and false alarms on healthy steps."""

    candidate: str
    sharp: EventScore
    corrupted_or_overflow: EventScore
    divergence: DivergenceScore
    shift: EventScore
    false_alarms: int
    healthy_steps: int

    @property
    def false_alarms_per_1000(self) -> float:
        return 1000.0 * self.false_alarms / self.healthy_steps if self.healthy_steps else float("nan")


def observable(run: CorpusRun, signal: str) -> bool:
    """Whether ``signal`` shows the run's cause within :data:`SHARP_STEPS` steps: a value there is not finite
    or lies outside the range of the 50 steps before the cause."""
    cause = run.labels["cause_step"]
    values = run.signals[signal].to_numpy(dtype=np.float64)
    before = values[max(0, cause - _REFERENCE_STEPS) : cause]
    after = values[cause : cause + SHARP_STEPS + 1]
    before = before[np.isfinite(before)]
    if not len(before):
        return False
    return bool((~np.isfinite(after)).any() or (after > before.max()).any() or (after < before.min()).any())


def detections(runs: Sequence[CorpusRun], specs: Sequence[WatchSpec], *, skip: int) -> list[np.ndarray]:
    """Per run, the sorted steps where any of ``specs`` opened an event; runs of equal length are watched
    together, one series each."""
    opened: list[set[int]] = [set() for _ in runs]
    by_length: dict[int, list[int]] = {}
    for index, run in enumerate(runs):
        by_length.setdefault(len(run.signals), []).append(index)
    for length, members in by_length.items():
        for spec in specs:
            values = np.column_stack([runs[i].signals[spec.signal].to_numpy(dtype=np.float64) for i in members])
            watch = Watch(spec.signal, spec.detector.clone(), decision=spec.decision(), critical=spec.critical)
            for step in range(skip, length):
                for anomaly in watch.update(values[step], step=step, time=float(step)).opened:
                    opened[members[int(anomaly.series or 0)]].add(step)
    return [np.array(sorted(steps), dtype=np.int64) for steps in opened]


def score_corpus(runs: Sequence[CorpusRun], candidate: str, setting: str, *, skip: int | None = None) -> CorpusScore:
    """Score the detectors of ``setting`` (the ``detectors`` grammar) as one set on ``runs``."""
    specs = parse_spec(setting)
    skip = DetectorSettings().warmup_steps if skip is None else skip
    signals = sorted({spec.signal for spec in specs})
    sharp: list[int | None] = []
    key: list[int | None] = []
    shift: list[int | None] = []
    leads: list[int] = []
    divergences = collapsing = before_collapse = false_alarms = healthy_steps = 0
    for run, steps in zip(runs, detections(runs, specs, skip=skip)):
        labels = run.labels
        healthy_until = len(run.signals) if labels["kind"] == "none" else int(labels["healthy_until"])
        healthy_steps += max(0, healthy_until - skip)
        false_alarms += int((steps < healthy_until).sum())
        if labels["kind"] == "none":
            continue
        first, last = labels["window"]
        cause = int(labels["cause_step"])
        caught = steps[(steps >= first) & (steps <= last)]
        delay = int(caught[0]) - cause if len(caught) else None
        if labels["kind"] == "sharp":
            if labels["scenario"] in _BIT_FLIPS and not any(observable(run, signal) for signal in signals):
                continue
            sharp.append(delay)
            if labels["scenario"] in ("corrupted_batch", "overflow"):
                key.append(delay)
        elif labels["kind"] == "shift":
            shift.append(delay)
        elif labels["kind"] == "divergence":
            divergences += 1
            collapse = labels["collapse_step"]
            if collapse is None:
                continue
            collapsing += 1
            early = caught[caught < collapse]
            if len(early):
                before_collapse += 1
                leads.append(int(collapse) - int(early[0]))
    return CorpusScore(
        candidate,
        _events(sharp, SHARP_STEPS),
        _events(key, SHARP_STEPS),
        DivergenceScore(divergences, collapsing, before_collapse, tuple(leads)),
        _events(shift, None),
        false_alarms,
        healthy_steps,
    )


def _events(delays: list[int | None], limit: int | None) -> EventScore:
    """Events with their delays (None: not caught); caught means within ``limit`` steps, or at all."""
    found = tuple(d for d in delays if d is not None)
    return EventScore(len(delays), sum(1 for d in found if limit is None or d <= limit), found)
