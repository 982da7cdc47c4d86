"""The OpenTelemetry sink: a private MeterProvider whose instruments read the store.

Gauges, counters and info metrics are observable instruments whose callbacks
read the :class:`~trainhealth.store.MetricStore`; histograms are synchronous
instruments fed by the store's observation hook, with an explicit bucket View
in seconds that matches the Prometheus buckets. Events (XIDs, anomalies) become
log records with ``event_name`` ``trainhealth.<name>``. The OTLP/HTTP exporters and the
reader take their settings from the standard variables
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_METRIC_EXPORT_INTERVAL``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME`` ...). The process identity
becomes resource attributes. Nothing global is touched. :meth:`OtelExporter.shutdown`
waits at most ``close_timeout_s`` for the last export, whatever the endpoint does.

>>> from opentelemetry.sdk.metrics.export import InMemoryMetricReader
>>> from trainhealth import catalog
>>> from trainhealth.identity import Identity
>>> from trainhealth.store import MetricStore
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

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry._logs import SeverityNumber
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExporter
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

from trainhealth._version import __version__
from trainhealth.catalog import CATALOG, MetricKind, MetricSpec
from trainhealth.events import Event, EventLog, Severity
from trainhealth.identity import Identity
from trainhealth.store import MetricStore

__all__ = ["OtelExporter"]

log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "trainhealth"
#: Seconds :meth:`OtelExporter.shutdown` waits for the last export (the ``otel_close_timeout`` setting's default).
DEFAULT_CLOSE_TIMEOUT_S = 1.5
_SEVERITY = {Severity.INFO: SeverityNumber.INFO, Severity.WARNING: SeverityNumber.WARN,
             Severity.CRITICAL: SeverityNumber.ERROR}


class _CountingExporter(MetricExporter):
    """Delegates to an exporter and counts failed exports in the store."""

    def __init__(self, inner: MetricExporter, store: MetricStore) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self._inner = inner
        self._store = store

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        try:
            result = self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception as exc:
            self._store.record_error("otel", exc)
            return MetricExportResult.FAILURE
        if result is not MetricExportResult.SUCCESS:
            self._store.record_error("otel")
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def _resource(identity: Identity) -> Resource:
    resource = Resource.create(identity.resource_attributes)
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
    return resource


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
        if reader is None:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

            reader = PeriodicExportingMetricReader(_CountingExporter(OTLPMetricExporter(), store))
        self._store = store
        views = [
            View(instrument_name=spec.otel_name, aggregation=ExplicitBucketHistogramAggregation(spec.buckets))
            for spec in catalog
            if spec.kind is MetricKind.HISTOGRAM
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
        for spec in catalog:
            if spec.kind is MetricKind.HISTOGRAM:
                self._histograms[spec] = meter.create_histogram(
                    spec.otel_name, unit=spec.otel_unit, description=spec.help,
                    explicit_bucket_boundaries_advisory=list(spec.buckets),
                )
            elif spec.kind is MetricKind.COUNTER:
                meter.create_observable_counter(
                    spec.otel_name, callbacks=[self._callback(spec)], unit=spec.otel_unit, description=spec.help
                )
            else:
                meter.create_observable_gauge(
                    spec.otel_name, callbacks=[self._callback(spec)], unit=spec.otel_unit, description=spec.help
                )
        store.add_observer(self._record_observation)
        atexit.register(self.shutdown)

    def _callback(self, spec: MetricSpec) -> Any:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            try:
                series = self._store.series(spec)
            except Exception as exc:
                self._store.record_error("otel", exc)
                return []
            return [
                Observation(value, dict(zip(spec.labels, labels)))  # type: ignore[arg-type]
                for labels, value in series
            ]

        return observe

    def _record_observation(self, spec: MetricSpec, value: float, labels: tuple[str, ...]) -> None:
        histogram = self._histograms.get(spec)
        if histogram is not None:
            histogram.record(value, dict(zip(spec.labels, labels)))

    def _emit_event(self, event: Event) -> None:
        """An event as an OpenTelemetry log record named ``trainhealth.<event name>`` (the Events API is gone)."""
        try:
            self._logger.emit(
                timestamp=int(event.time * 1e9), body=event.summary, attributes=dict(event.attributes),
                event_name=f"trainhealth.{event.name}", severity_number=_SEVERITY[event.severity],
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
            thread = threading.Thread(target=self._shutdown_provider, args=(provider,),
                                      name=f"trainhealth-otel-close-{name}", daemon=True)
            thread.start()
            closing.append((name, thread))
        for name, thread in closing:
            thread.join(max(deadline - time.monotonic(), 0.0))
            if thread.is_alive():
                self._store.record_error("otel")
                log.warning("trainhealth: the OTLP endpoint did not take the last %s export within %g s; dropped",
                            name, self._close_timeout_s)

    def _shutdown_provider(self, provider: MeterProvider | LoggerProvider) -> None:
        try:
            if isinstance(provider, MeterProvider):
                provider.shutdown(timeout_millis=self._close_timeout_s * 1000)
            else:
                provider.shutdown()
        except Exception as exc:
            self._store.record_error("otel", exc)
