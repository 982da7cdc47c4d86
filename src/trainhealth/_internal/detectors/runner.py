"""Detectors on a process's own signals, wired to metrics and events.

The Monitor feeds loss, gradient norm, step time and throughput once per step;
the collective logger feeds each (op, group)'s median duration once per flush.
Every anomaly that begins increments ``trainhealth_anomalies_total{detector,signal}``,
sets ``trainhealth_anomalies_last_timestamp_seconds`` and becomes an ``anomaly``
event (a log line, and an OpenTelemetry log record with ``event_name``
``trainhealth.anomaly`` when OTLP is on); ``trainhealth_anomalies_active`` counts
those still in progress. The spike detector also exports the OLMo 2 spike score,
the delta detector the irregularity rate.

>>> from trainhealth._internal.store import MetricStore
>>> from trainhealth._internal import catalog
>>> store = MetricStore()
>>> runner = SignalDetectors(parse_spec("loss=nonfinite"), store=store)
>>> [a.detector for a in runner.observe("loss", float("nan"), step=3)]
['nonfinite']
>>> store.value(catalog.ANOMALIES, ("nonfinite", "loss"))
1.0
"""

from __future__ import annotations

import logging
import threading
import time as _time
from collections.abc import Sequence

from trainhealth._internal import catalog
from trainhealth._internal._gil import yield_gil
from trainhealth._internal.detectors.delta import DeltaIrregularity
from trainhealth._internal.detectors.nonfinite import NonFinite
from trainhealth._internal.detectors.spec import WatchSpec, parse_spec
from trainhealth._internal.detectors.spike import SpikeScore
from trainhealth._internal.detectors.watch import Anomaly, Watch
from trainhealth._internal.events import Event, EventLog, Severity
from trainhealth._internal.store import MetricStore

__all__ = ["SignalDetectors", "parse_spec"]

log = logging.getLogger(__name__)


class SignalDetectors:
    """Per signal (and per series of a signal, like each collective group), the watches of a spec."""

    def __init__(
        self,
        specs: Sequence[WatchSpec],
        *,
        store: MetricStore | None = None,
        events: EventLog | None = None,
        max_series: int = 256,
        warmup: int = 0,
    ) -> None:
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {warmup!r}")
        self._specs: dict[str, list[WatchSpec]] = {}
        self._warmup = warmup
        self._seen: dict[tuple[str, str], int] = {}
        for spec in specs:
            self._specs.setdefault(spec.signal, []).append(spec)
        self._store = store
        self._events = events
        self._max_series = max_series
        self._watches: dict[tuple[str, str], list[Watch]] = {}
        self._lock = threading.Lock()
        if store is not None:  # counters start at 0, so the first anomaly is an increase Prometheus can see
            for spec in specs:
                store.inc(catalog.ANOMALIES, 0.0, (spec.detector.name, spec.signal))

    @property
    def signals(self) -> tuple[str, ...]:
        return tuple(self._specs)

    def _watches_for(self, signal: str, series: str) -> list[Watch] | None:
        key = (signal, series)
        watches = self._watches.get(key)
        if watches is None:
            if sum(1 for s, _ in self._watches if s == signal) >= self._max_series:
                return None
            watches = self._watches[key] = [
                Watch(signal, spec.detector.clone(), decision=spec.decision(), series=(series,), critical=spec.critical)
                for spec in self._specs[signal]
            ]
        return watches

    def observe(
        self, signal: str, value: float, *, step: int | None = None, time: float | None = None, series: str = ""
    ) -> list[Anomaly]:
        """Feed one value of ``signal``; returns the anomalies that began with it.

        The first ``warmup`` values of each signal and series reach only the non-finite check: a
        job's first steps (compilation, allocator and data-loader warm-up, connection set-up) are
        slow and their loss is high for reasons that are not faults, and they would skew every
        baseline; a NaN is a fault from the first step.
        """
        if signal not in self._specs:
            return []
        now = _time.time() if time is None else time
        with self._lock:
            watches = self._watches_for(signal, series)
            if watches is None:
                return []
            seen = self._seen.get((signal, series), 0)
            if seen < self._warmup:
                self._seen[(signal, series)] = seen + 1
                watches = [watch for watch in watches if isinstance(watch.detector, NonFinite)]
            opened, closed = [], []
            for watch in watches:
                update = watch.update([value], step=step, time=now)
                opened += update.opened
                closed += update.closed
                yield_gil()  # each watch is a few hundred microseconds of Python: let a waiting training thread in
            self._export(signal, watches, opened)
        for anomaly in opened:
            self._emit(anomaly, begun=True)
        for anomaly in closed:
            self._emit(anomaly, begun=False)
        return opened

    def active(self) -> list[Anomaly]:
        with self._lock:
            return [anomaly for watches in self._watches.values() for watch in watches for anomaly in watch.active]

    def _export(self, signal: str, watches: list[Watch], opened: list[Anomaly]) -> None:
        store = self._store
        if store is None:
            return
        for anomaly in opened:
            labels = (anomaly.detector, signal)
            store.inc(catalog.ANOMALIES, labels=labels)
            store.set(catalog.ANOMALIES_LAST_TIMESTAMP, anomaly.start_time, labels)
        for watch in watches:
            name = watch.detector.name
            active = sum(
                len(w.active)
                for (s, _), ws in self._watches.items()
                if s == signal
                for w in ws
                if w.detector.name == name
            )
            store.set(catalog.ANOMALIES_ACTIVE, float(active), (name, signal))
            unkeyed = watch.series == ("",) and watch.detector.n_series
            if unkeyed and isinstance(watch.detector, SpikeScore):
                store.set(catalog.TRAIN_SPIKE_SCORE, float(watch.detector.spike_score[0]), (signal,))
            if unkeyed and isinstance(watch.detector, DeltaIrregularity):
                store.set(catalog.TRAIN_IRREGULARITY, float(watch.detector.irregularity_rate[0]), (signal,))

    def _emit(self, anomaly: Anomaly, *, begun: bool) -> None:
        attributes: dict[str, str | int | float] = {
            "detector": anomaly.detector,
            "signal": anomaly.signal,
            "series": anomaly.series,
            "value": anomaly.value,
            "score": anomaly.score,
            "severity": anomaly.severity.value,
        }
        if anomaly.step is not None:
            attributes["step"] = anomaly.step
        if anomaly.expected is not None:
            attributes["expected"] = anomaly.expected
        if begun:
            event = Event("anomaly", anomaly.severity, anomaly.summary(), attributes, time=anomaly.start_time)
        else:
            attributes["start_time"] = anomaly.start_time
            event = Event(
                "anomaly.resolved",
                Severity.INFO,
                "resolved: " + anomaly.summary(),
                attributes,
                time=anomaly.end_time or anomaly.time,
            )
        if self._events is not None:
            self._events.emit(event)
        else:
            log.log(event.severity.log_level, "trainhealth: %s", event.summary)
