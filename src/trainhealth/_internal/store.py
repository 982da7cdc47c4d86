"""In-memory telemetry state: latest values, counters and histograms, per label set.

Producers (the Monitor, samplers) write here; the sinks (Prometheus collector,
OpenTelemetry callbacks) read a :meth:`MetricStore.snapshot`, so both export the
same numbers and a scrape never calls into the producers. Memory is bounded:
each metric keeps at most ``max_series`` label sets.

>>> from trainhealth._internal import catalog
>>> store = MetricStore()
>>> store.set(catalog.TRAIN_LOSS, 2.5)
>>> store.inc(catalog.TRAIN_STEPS)
>>> store.inc(catalog.TRAIN_STEPS)
>>> store.value(catalog.TRAIN_LOSS), store.value(catalog.TRAIN_STEPS)
(2.5, 2.0)
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from trainhealth._internal.catalog import EXPORTER_ERRORS, MetricKind, MetricSpec

__all__ = ["Family", "HistogramValue", "MetricStore", "Observer"]

log = logging.getLogger(__name__)

Labels = tuple[str, ...]
#: Called with every histogram observation: (spec, value, labels).
Observer = Callable[[MetricSpec, float, Labels], None]


@dataclass(frozen=True)
class HistogramValue:
    """A histogram's state: per-bucket counts (last one is +Inf), total count and sum."""

    bucket_counts: tuple[int, ...]
    count: int
    sum: float

    def cumulative(self) -> tuple[int, ...]:
        total, out = 0, []
        for count in self.bucket_counts:
            total += count
            out.append(total)
        return tuple(out)


@dataclass(frozen=True)
class Family:
    """All series of one metric at snapshot time."""

    spec: MetricSpec
    samples: tuple[tuple[Labels, float | HistogramValue], ...]


class _Histogram:
    __slots__ = ("counts", "count", "sum")

    def __init__(self, n_buckets: int) -> None:
        self.counts = [0] * (n_buckets + 1)
        self.count = 0
        self.sum = 0.0

    def frozen(self) -> HistogramValue:
        return HistogramValue(tuple(self.counts), self.count, self.sum)


class MetricStore:
    """Thread-safe latest-value store keyed by catalogue metric and label values."""

    def __init__(self, max_series: int = 1000) -> None:
        if max_series < 1:
            raise ValueError("max_series must be >= 1")
        self._max_series = max_series
        self._lock = threading.Lock()
        self._series: dict[MetricSpec, dict[Labels, float | _Histogram]] = {}
        self._observers: list[Observer] = []
        self._logged_errors: set[tuple[str, str]] = set()
        self._version = 0

    # --- writing --------------------------------------------------------------------
    def set(self, spec: MetricSpec, value: float, labels: Labels = ()) -> None:
        """Set a gauge (or an info metric's value) for one label set."""
        self._expect(spec, MetricKind.GAUGE, MetricKind.INFO)
        value = float(value)
        with self._lock:
            series = self._series_of(spec, labels)
            if series is not None:
                series[labels] = value

    def inc(self, spec: MetricSpec, amount: float = 1.0, labels: Labels = ()) -> None:
        """Add ``amount`` (>= 0) to a counter."""
        self._expect(spec, MetricKind.COUNTER)
        amount = float(amount)
        if not amount >= 0:
            raise ValueError(f"{spec.prometheus_name}: counters only go up, got {amount}")
        with self._lock:
            series = self._series_of(spec, labels)
            if series is not None:
                series[labels] = series.get(labels, 0.0) + amount  # type: ignore[operator]

    def observe(self, spec: MetricSpec, value: float, labels: Labels = ()) -> None:
        """Add one observation to a histogram; non-finite values are not observed."""
        self._expect(spec, MetricKind.HISTOGRAM)
        value = float(value)
        if not math.isfinite(value):
            return
        with self._lock:
            histogram = self._histogram(spec, labels)
            if histogram is None:
                return
            histogram.counts[bisect.bisect_left(spec.buckets, value)] += 1
            histogram.count += 1
            histogram.sum += value
            observers = tuple(self._observers)
        for observer in observers:
            try:
                observer(spec, value, labels)
            except Exception as exc:
                self.record_error("observer", exc)

    def _histogram(self, spec: MetricSpec, labels: Labels) -> _Histogram | None:
        """The histogram of ``labels`` (made at its first observation), or None past the series limit; under the lock."""
        series = self._series_of(spec, labels)
        if series is None:
            return None
        histogram = series.get(labels)
        if not isinstance(histogram, _Histogram):
            histogram = series[labels] = _Histogram(len(spec.buckets))
        return histogram

    def write(self, values: Iterable[tuple[MetricSpec, Labels, float]]) -> None:
        """Set many gauges under one lock; counters are set to the absolute total read from a
        monotonic source (NVML's ECC or energy counters), so a source reset shows as a counter reset."""
        batch = [(spec, labels, float(value)) for spec, labels, value in values]
        for spec, _, _ in batch:
            self._expect(spec, MetricKind.GAUGE, MetricKind.COUNTER, MetricKind.INFO)
        with self._lock:
            for spec, labels, value in batch:
                series = self._series_of(spec, labels)
                if series is not None:
                    series[labels] = value

    def observe_many(self, spec: MetricSpec, values: Sequence[float] | np.ndarray, labels: Labels = ()) -> None:
        """Add many observations to one histogram series under one lock (non-finite ones are skipped)."""
        self._expect(spec, MetricKind.HISTOGRAM)
        array = np.asarray(values, dtype=np.float64)
        array = array[np.isfinite(array)]
        if not len(array):
            return
        # bisect_left per value, vectorised: the first bucket whose upper bound is >= the value
        counts = np.bincount(np.searchsorted(spec.buckets, array, side="left"), minlength=len(spec.buckets) + 1)
        with self._lock:
            histogram = self._histogram(spec, labels)
            if histogram is None:
                return
            histogram.counts = [a + int(b) for a, b in zip(histogram.counts, counts)]
            histogram.count += len(array)
            histogram.sum += float(array.sum())
            observers = tuple(self._observers)
        finite = array.tolist() if observers else []
        for observer in observers:
            for value in finite:
                try:
                    observer(spec, value, labels)
                except Exception as exc:
                    self.record_error("observer", exc)
                    break

    def set_info(self, spec: MetricSpec, labels: Labels) -> None:
        """Replace an info metric's single series with ``labels`` (value 1)."""
        self._expect(spec, MetricKind.INFO)
        self._check_labels(spec, labels)
        with self._lock:
            self._series[spec] = {labels: 1.0}
            self._version += 1

    def remove(self, spec: MetricSpec, labels: Labels) -> None:
        with self._lock:
            self._series.get(spec, {}).pop(labels, None)
            self._version += 1

    def record_error(self, source: str, exc: BaseException | None = None) -> None:
        """Count an error caught on the training or scrape path; log its first occurrence."""
        try:
            with self._lock:
                series = self._series_of(EXPORTER_ERRORS, (source,))
                if series is not None:
                    series[(source,)] = series.get((source,), 0.0) + 1.0  # type: ignore[operator]
                key = (source, type(exc).__name__)
                first = key not in self._logged_errors
                self._logged_errors.add(key)
            if first:
                log.warning(
                    "trainhealth: error in %s (counted in trainhealth_exporter_errors_total; "
                    "later ones of this kind are logged at debug level)",
                    source,
                    exc_info=exc,
                )
            else:
                log.debug("trainhealth: error in %s", source, exc_info=exc)
        except Exception:  # never let error accounting itself raise
            pass

    def add_observer(self, observer: Observer) -> None:
        with self._lock:
            self._observers.append(observer)

    def remove_observer(self, observer: Observer) -> None:
        with self._lock:
            if observer in self._observers:
                self._observers.remove(observer)

    # --- reading --------------------------------------------------------------------
    @property
    def version(self) -> int:
        """Changes whenever any series is written; equal versions mean equal snapshots."""
        return self._version

    def snapshot(self) -> tuple[Family, ...]:
        """An immutable copy of every series, for one scrape or one export."""
        with self._lock:
            return tuple(
                Family(spec, tuple((labels, _freeze(value)) for labels, value in series.items()))
                for spec, series in self._series.items()
                if series
            )

    def series(self, spec: MetricSpec) -> tuple[tuple[Labels, float | HistogramValue], ...]:
        """A copy of every series of one metric."""
        with self._lock:
            return tuple((labels, _freeze(value)) for labels, value in self._series.get(spec, {}).items())

    def value(self, spec: MetricSpec, labels: Labels = ()) -> float | HistogramValue | None:
        """The current value of one series, or ``None`` when it has none."""
        with self._lock:
            value = self._series.get(spec, {}).get(labels)
            return None if value is None else _freeze(value)

    # --- internals ------------------------------------------------------------------
    def _expect(self, spec: MetricSpec, *kinds: MetricKind) -> None:
        if spec.kind not in kinds:
            raise TypeError(f"{spec.prometheus_name} is a {spec.kind.value}")

    def _check_labels(self, spec: MetricSpec, labels: Labels) -> None:
        if len(labels) != len(spec.labels):
            raise ValueError(f"{spec.prometheus_name} takes labels {spec.labels}, got {labels!r}")

    def _series_of(self, spec: MetricSpec, labels: Labels) -> dict[Labels, float | _Histogram] | None:
        """The series dict of ``spec`` if ``labels`` may be written (caller holds the lock)."""
        self._check_labels(spec, labels)
        self._version += 1
        series = self._series.setdefault(spec, {})
        if labels in series or len(series) < self._max_series:
            return series
        errors = self._series.setdefault(EXPORTER_ERRORS, {})
        errors[("series_limit",)] = errors.get(("series_limit",), 0.0) + 1.0  # type: ignore[operator]
        if (spec.prometheus_name, "series_limit") not in self._logged_errors:
            self._logged_errors.add((spec.prometheus_name, "series_limit"))
            log.warning(
                "trainhealth: %s reached its limit of %d series; new label sets are dropped",
                spec.prometheus_name,
                self._max_series,
            )
        return None


def _freeze(value: float | _Histogram) -> float | HistogramValue:
    return value.frozen() if isinstance(value, _Histogram) else value
