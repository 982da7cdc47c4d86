"""A detector on one signal, with its decision step, turning values into anomaly records.

>>> import numpy as np
>>> from trainhealth._internal.detectors.zscore import ZScore
>>> watch = Watch("loss", ZScore(window=50, warmup=10), series=("rank0", "rank1"))
>>> rng = np.random.default_rng(0)
>>> for step in range(40):
...     _ = watch.update(rng.normal(2.0, 0.01, 2), step=step, time=float(step))
>>> update = watch.update([2.0, 5.0], step=40, time=40.0)
>>> [(a.series, a.step, a.severity.value) for a in update.opened]
[('rank1', 40, 'critical')]
"""

from __future__ import annotations

import time as _time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from trainhealth._internal.detectors.base import Detector
from trainhealth._internal.detectors.decision import Decision
from trainhealth._internal.events import Severity

__all__ = ["Anomaly", "Watch", "WatchUpdate"]


@dataclass(frozen=True)
class Anomaly:
    """One anomaly: which detector saw it on which signal and series, when, and how strongly.

    ``value``, ``expected`` and ``score`` are those of the strongest point so far;
    ``end_step`` / ``end_time`` stay ``None`` while the anomaly lasts.
    """

    detector: str
    signal: str
    series: str
    step: int | None
    time: float
    value: float
    expected: float | None
    score: float
    severity: Severity
    start_step: int | None
    start_time: float
    end_step: int | None = None
    end_time: float | None = None

    @property
    def active(self) -> bool:
        return self.end_time is None

    def summary(self) -> str:
        expected = "" if self.expected is None else f", expected {self.expected:.6g}"
        where = f"{self.signal}" + (f" [{self.series}]" if self.series else "")
        at = f"step {self.step}" if self.step is not None else f"t={self.time:.3f}"
        return f"{self.detector} anomaly on {where} at {at}: value {self.value:.6g}{expected}, score {self.score:.3g}"

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "severity": self.severity.value}


@dataclass(frozen=True)
class WatchUpdate:
    opened: list[Anomaly]
    closed: list[Anomaly]
    scores: np.ndarray


class Watch:
    """Runs ``detector`` on ``signal`` (one value per series per update) and reports anomalies."""

    def __init__(
        self,
        signal: str,
        detector: Detector,
        *,
        decision: Decision | None = None,
        series: Sequence[str] | None = None,
        critical: float | None = None,
    ) -> None:
        self.signal = signal
        self.detector = detector
        self.decision = decision or Decision(detector.default_threshold, cooldown=3)
        self.series = tuple(series) if series is not None else None
        self.critical = critical if critical is not None else detector.default_critical
        self._open: dict[int, Anomaly] = {}

    def _key(self, index: int) -> str:
        if self.series is not None:
            return self.series[index]
        return "" if (self.detector.n_series or 1) == 1 else str(index)

    def _severity(self, score: float) -> Severity:
        return Severity.CRITICAL if self.critical is not None and score >= self.critical else Severity.WARNING

    def update(self, values: Any, *, step: int | None = None, time: float | None = None) -> WatchUpdate:
        now = _time.time() if time is None else time
        x = np.asarray(values, dtype=np.float64).reshape(-1)
        scores = self.detector.score(x)
        expected = self.detector.expected()
        decided = self.decision.step(scores)
        self.detector.learn(x, ~decided.flagged)
        opened, closed = [], []
        for index in decided.opened:
            anomaly = Anomaly(
                detector=self.detector.name,
                signal=self.signal,
                series=self._key(int(index)),
                step=step,
                time=now,
                value=float(x[index]),
                expected=_number(expected, index),
                score=float(scores[index]),
                severity=self._severity(float(scores[index])),
                start_step=step,
                start_time=now,
            )
            self._open[int(index)] = anomaly
            opened.append(anomaly)
        for index, anomaly in list(self._open.items()):
            score = float(scores[index])
            if index in decided.closed:
                closed.append(replace(anomaly, end_step=step, end_time=now))
                del self._open[index]
            elif np.isfinite(score) and score > anomaly.score:  # keep the strongest point of the event
                self._open[index] = replace(
                    anomaly,
                    step=step,
                    time=now,
                    value=float(x[index]),
                    expected=_number(expected, index),
                    score=score,
                    severity=max(anomaly.severity, self._severity(score), key=_rank),
                )
        return WatchUpdate(opened, closed, scores)

    @property
    def active(self) -> list[Anomaly]:
        return list(self._open.values())


def _number(values: np.ndarray, index: int) -> float | None:
    if index >= len(values) or not np.isfinite(values[index]):
        return None
    return float(values[index])


def _rank(severity: Severity) -> int:
    return [Severity.INFO, Severity.WARNING, Severity.CRITICAL].index(severity)
