"""The names docs/metrics.md gives the OTLP metrics after translation, against OpenTelemetry's own translator.

Every catalogue metric is recorded with the OpenTelemetry SDK through the OTLP sink and read by
``opentelemetry-exporter-prometheus`` (its ``PrometheusMetricReader`` into a fresh prometheus_client
registry). Its names must be the documented ones, but for the one rule where this Python exporter
and the Go translation of the Collector and Prometheus differ: it adds no ``_ratio`` to gauges with
unit ``1``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from prometheus_client import CollectorRegistry

from trainhealth._internal.catalog import CATALOG, MetricKind, MetricSpec, OtelInstrument, translated_prometheus_name
from trainhealth._internal.identity import Identity
from trainhealth._internal.sinks.otel import OtelExporter
from trainhealth._internal.store import MetricStore

ROOT = Path(__file__).resolve().parents[2]
IDENTITY = Identity("job-a", "node-x", 0, 0, 1)
LABEL_VALUES = {"state": "ok", "error_type": "corrected", "counter_type": "volatile", "backend": "nvml"}


def _documented() -> dict[str, list[str]]:
    """/metrics name -> [OTLP name, instrument, OTLP unit, name after translation], from docs/metrics.md."""
    text = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    section = text[text.index("## Names over OTLP") :]
    section = section[: section.index("\n\n", section.index("|"))]
    rows = {}
    for line in section.splitlines()[4:]:  # title, blank, header, rule
        cells = [cell.strip().strip("`") for cell in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:5]
    return rows


DOCUMENTED = _documented()


def _python_exporter_name(spec: MetricSpec) -> tuple[str, str, float]:
    """(exposed name, Prometheus type, value) of ``spec`` after the Python Prometheus exporter's translation."""
    registry = CollectorRegistry()
    reader = PrometheusMetricReader(disable_target_info=True, registry=registry)
    store = MetricStore()
    sink = OtelExporter(store, IDENTITY, reader=reader, catalog=[spec])
    try:
        labels = tuple(LABEL_VALUES.get(label, "0") for label in spec.labels)
        if spec.kind is MetricKind.HISTOGRAM:
            store.observe(spec, 0.5, labels)  # after the sink: histograms are fed by the observation hook
        elif spec.kind is MetricKind.COUNTER:
            store.inc(spec, 2.0, labels)
        elif spec.kind is MetricKind.INFO:
            store.set_info(spec, labels)
        else:
            store.set(spec, 0.25, labels)
        (family,) = registry.collect()
    finally:
        sink.shutdown()
    (sample,) = [s for s in family.samples if s.name.endswith(("_total", "_count")) or family.type == "gauge"]
    exposed = family.name + "_total" if family.type == "counter" else family.name
    return exposed, family.type, sample.value


@pytest.fixture(scope="module")
def python_names() -> dict[MetricSpec, tuple[str, str, float]]:
    return {spec: _python_exporter_name(spec) for spec in CATALOG}


def test_the_documented_table_covers_every_metric():
    assert sorted(DOCUMENTED) == sorted(spec.prometheus_name for spec in CATALOG)


@pytest.mark.parametrize("spec", CATALOG, ids=lambda spec: spec.prometheus_name)
def test_documented_names_match_opentelemetrys_prometheus_translation(spec: MetricSpec, python_names):
    otel_name, instrument, unit, translated = DOCUMENTED[spec.prometheus_name]
    assert (otel_name, instrument, unit.replace("—", "")) == (
        spec.otel_name,
        spec.otel_instrument.value,
        spec.otel_unit,
    )
    exposed, prometheus_type, value = python_names[spec]
    if unit == "1" and instrument == OtelInstrument.GAUGE.value:
        # the one difference: Go adds _ratio to gauges with unit 1 (unless the name ends in it), Python does not
        assert translated.endswith("_ratio")
        assert exposed in (translated, translated.removesuffix("_ratio"))
        assert exposed == translated_prometheus_name(otel_name, unit, OtelInstrument.GAUGE, ratio=False)
    else:
        assert exposed == translated
    expected_type = {OtelInstrument.COUNTER: "counter", OtelInstrument.HISTOGRAM: "histogram"}
    assert prometheus_type == expected_type.get(spec.otel_instrument, "gauge")
    assert value == {MetricKind.COUNTER: 2.0, MetricKind.HISTOGRAM: 1.0, MetricKind.INFO: 1.0}.get(spec.kind, 0.25)


def test_the_ratio_rule_is_the_only_difference_and_it_is_counted(python_names):
    differs = [spec for spec in CATALOG if python_names[spec][0] != DOCUMENTED[spec.prometheus_name][3]]
    assert differs and all(spec.otel_unit == "1" for spec in differs)
    text = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert f"its names for {len(differs)} gauges with unit `1` lack that suffix" in text
