"""The OpenTelemetry sink: a private MeterProvider whose instruments read the store.

Gauges, counters and info metrics are observable instruments whose callbacks
read the :class:`~trainhealth._internal.store.MetricStore`; histograms are synchronous
instruments fed by the store's observation hook, with an explicit bucket View
in seconds that matches the Prometheus buckets. Names, units, instruments and
attributes come from the catalogue (:attr:`MetricSpec.otel_name`,
:meth:`MetricSpec.otel_attributes`): a metric an OpenTelemetry semantic convention
covers goes out under the convention (``hw.gpu.utilization`` with ``hw.id``,
``hw.status`` as a state set), the others as ``trainhealth.<name>``. Events (XIDs, anomalies) become
log records with ``event_name`` ``trainhealth.<name>``. The OTLP/HTTP exporters and the
reader take their settings from the standard variables
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_METRIC_EXPORT_INTERVAL``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME`` ...). The process identity
becomes resource attributes. Nothing global is touched. :meth:`OtelExporter.shutdown`
waits at most ``close_timeout_s`` for the last export, whatever the endpoint does.

>>> from opentelemetry.sdk.metrics.export import InMemoryMetricReader
>>> from trainhealth._internal import catalog
>>> from trainhealth._internal.identity import Identity
>>> from trainhealth._internal.store import MetricStore
>>> store = MetricStore()
>>> store.set(catalog.TRAIN_LOSS, 3.25)
>>> reader = InMemoryMetricReader()
>>> sink = OtelExporter(store, Identity("demo", "node-a", 0, 0, 1), reader=reader)
>>> data = reader.get_metrics_data()
>>> [m.data.data_points[0].value for rm in data.resource_metrics for sm in rm.scope_metrics
...  for m in sm.metrics if m.name == "trainhealth.train.loss"]
[3.25]
>>> sink.shutdown()
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from opentelemetry._logs import SeverityNumber
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

from trainhealth._internal.catalog import CATALOG, MetricSpec, OtelInstrument
from trainhealth._internal.events import Event, EventLog, Severity
from trainhealth._internal.identity import Identity
from trainhealth._internal.store import MetricStore
from trainhealth._version import __version__

__all__ = ["OtelExporter"]

log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "trainhealth"
#: Seconds :meth:`OtelExporter.shutdown` waits for the last export (the ``otel_close_timeout`` setting's default).
DEFAULT_CLOSE_TIMEOUT_S = 1.5
_SEVERITY = {
    Severity.INFO: SeverityNumber.INFO,
    Severity.WARNING: SeverityNumber.WARN,
    Severity.CRITICAL: SeverityNumber.ERROR,
}


class _CountingExporter(MetricExporter):
    """Delegates to an exporter and counts failed exports in the store.

    An export still running when the sink gives up on it (:meth:`abandon_running`) is
    counted then, once: its late failure is not counted again.
    """

    def __init__(self, inner: MetricExporter, store: MetricStore) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self._inner = inner
        self._store = store
        self._lock = threading.Lock()
        self._running = 0
        self._abandoned = 0

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        with self._lock:
            self._running += 1
        error: Exception | None = None
        try:
            result = self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception as exc:
            error, result = exc, MetricExportResult.FAILURE
        with self._lock:
            self._running -= 1
            counted = self._abandoned > 0
            self._abandoned = max(0, self._abandoned - 1)
        if result is not MetricExportResult.SUCCESS and not counted:
            self._store.record_error("otel", error)
        return result

    def abandon_running(self) -> int:
        """Give up on the exports still running (they count as failed now); how many there were."""
        with self._lock:
            dropped = self._running - self._abandoned
            self._abandoned = self._running
        return dropped

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def _resource(identity: Identity) -> Resource:
    resource = Resource.create(identity.resource_attributes)
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
    return resource


def _observations(spec: MetricSpec, series: Iterable[tuple[tuple[str, ...], Any]]) -> list[Observation]:
    """One observation per OTLP attribute set; series that fall together (a state set's states) keep the largest."""
    points: dict[tuple[tuple[str, str], ...], tuple[dict[str, str], float]] = {}
    for labels, value in series:
        attributes = spec.otel_attributes(labels)
        key = tuple(sorted(attributes.items()))
        earlier = points.get(key)
        points[key] = (attributes, value if earlier is None else max(earlier[1], value))
    return [Observation(value, attributes) for attributes, value in points.values()]


class OtelExporter:
    """Exports every catalogue metric of ``store`` through OpenTelemetry.

    ``reader`` defaults to a periodic OTLP/HTTP exporter configured by the OTEL_*
    environment variables; tests pass an ``InMemoryMetricReader``. ``close_timeout_s``
    bounds :meth:`shutdown`.
    """

    def __init__(
        self,
        store: MetricStore,
        identity: Identity,
        *,
        reader: MetricReader | None = None,
        catalog: Sequence[MetricSpec] = CATALOG,
        events: EventLog | None = None,
        log_exporter: LogRecordExporter | None = None,
        close_timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S,
    ) -> None:
        if not 0 < close_timeout_s < float("inf"):
            raise ValueError(f"close_timeout_s must be a positive number of seconds, got {close_timeout_s!r}")
        self._close_timeout_s = close_timeout_s
        self._stopped = False
        self._exporter: _CountingExporter | None = None
        if reader is None:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

            self._exporter = _CountingExporter(OTLPMetricExporter(), store)
            reader = PeriodicExportingMetricReader(self._exporter)
        self._store = store
        views = [
            View(instrument_name=spec.otel_name, aggregation=ExplicitBucketHistogramAggregation(spec.buckets))
            for spec in catalog
            if spec.otel_instrument is OtelInstrument.HISTOGRAM
        ]
        resource = _resource(identity)
        # shut down at exit by this class, within close_timeout_s (the SDK's own handler would wait 30 s)
        self._provider = MeterProvider(metric_readers=[reader], resource=resource, views=views, shutdown_on_exit=False)
        self._logs: LoggerProvider | None = None
        if events is not None:
            if log_exporter is None:
                from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

                log_exporter = OTLPLogExporter()
            self._logs = LoggerProvider(resource=resource, shutdown_on_exit=False)
            self._logs.add_log_record_processor(BatchLogRecordProcessor(log_exporter))
            self._logger = self._logs.get_logger("trainhealth", __version__)
            events.add_listener(self._emit_event)
        meter = self._provider.get_meter("trainhealth", __version__)
        self._histograms: dict[MetricSpec, Any] = {}
        # one instrument per OTLP name: entries sharing a convention (hw.temperature) share its instrument
        by_name: dict[str, list[MetricSpec]] = {}
        for spec in catalog:
            by_name.setdefault(spec.otel_name, []).append(spec)
        for name, specs in by_name.items():
            first = specs[0]
            instrument = first.otel_instrument
            if instrument is OtelInstrument.HISTOGRAM:
                for spec in specs:
                    self._histograms[spec] = meter.create_histogram(
                        name,
                        unit=spec.otel_unit,
                        description=spec.otel_description,
                        explicit_bucket_boundaries_advisory=list(spec.buckets),
                    )
                continue
            create = {
                OtelInstrument.GAUGE: meter.create_observable_gauge,
                OtelInstrument.COUNTER: meter.create_observable_counter,
                OtelInstrument.UP_DOWN_COUNTER: meter.create_observable_up_down_counter,
            }[instrument]
            create(
                name,
                callbacks=[self._callback(spec) for spec in specs],
                unit=first.otel_unit,
                description=first.otel_description,
            )
        store.add_observer(self._record_observation)
        atexit.register(self.shutdown)

    def _callback(self, spec: MetricSpec) -> Any:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            try:
                return _observations(spec, self._store.series(spec))
            except Exception as exc:
                self._store.record_error("otel", exc)
                return []

        return observe

    def _record_observation(self, spec: MetricSpec, value: float, labels: tuple[str, ...]) -> None:
        histogram = self._histograms.get(spec)
        if histogram is not None:
            histogram.record(value, spec.otel_attributes(labels))

    def _emit_event(self, event: Event) -> None:
        """An event as an OpenTelemetry log record named ``trainhealth.<event name>`` (the Events API is gone)."""
        try:
            self._logger.emit(
                timestamp=int(event.time * 1e9),
                body=event.summary,
                attributes=dict(event.attributes),
                event_name=f"trainhealth.{event.name}",
                severity_number=_SEVERITY[event.severity],
                severity_text=event.severity.value.upper(),
            )
        except Exception as exc:
            self._store.record_error("otel", exc)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        try:
            return self._provider.force_flush(timeout_millis)
        except Exception as exc:
            self._store.record_error("otel", exc)
            return False

    def shutdown(self) -> None:
        """Export what is pending and stop, within ``close_timeout_s`` whatever the endpoint does; never raises.

        Metrics and events are pushed side by side, each on a daemon thread; one not done in
        time is abandoned (its export is lost and counted in
        ``trainhealth_exporter_errors_total{source="otel"}``) and ends on the exporter's own timeout.
        """
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.shutdown)
        self._store.remove_observer(self._record_observation)
        deadline = time.monotonic() + self._close_timeout_s
        closing = []
        for name, provider in (("metrics", self._provider), ("events", self._logs)):
            if provider is None:
                continue
            thread = threading.Thread(
                target=self._shutdown_provider, args=(provider,), name=f"trainhealth-otel-close-{name}", daemon=True
            )
            thread.start()
            closing.append((name, thread))
        late = set()
        for name, thread in closing:
            thread.join(max(deadline - time.monotonic(), 0.0))
            if thread.is_alive():
                late.add(name)
        # the SDK's shutdown returns at its own timeout and may leave a slow export running on the reader's thread
        if self._exporter is not None and self._exporter.abandon_running():
            late.add("metrics")
        for name in sorted(late):
            self._store.record_error("otel")
            log.warning(
                "trainhealth: the OTLP endpoint did not take the last %s export within %g s; dropped",
                name,
                self._close_timeout_s,
            )

    def _shutdown_provider(self, provider: MeterProvider | LoggerProvider) -> None:
        try:
            if isinstance(provider, MeterProvider):
                provider.shutdown(timeout_millis=self._close_timeout_s * 1000)
            else:
                provider.shutdown()
        except Exception as exc:
            self._store.record_error("otel", exc)
