"""What collects telemetry, one wing per source: ``training`` (what the loop reports), ``gpu`` (NVML, DCGM,
the simulated backend, XIDs), ``collectives`` (the collective logger); the Monitor (``exporters.monitor``)
ties the three to the sinks, with its per-step path in ``exporters.steps``, the collective-trace markers in
``exporters.markers`` and its assembly helpers in ``exporters.wiring``.

Names load on first use (PEP 562), so importing one exporter does not import the others.
"""

from __future__ import annotations

from trainhealth._extras import lazy_attributes

__all__ = [
    "BasicAuth",
    "LayerGroupStats",
    "MetricsServer",
    "Monitor",
    "OtelExporter",
    "Sinks",
    "StepStats",
    "StoreCollector",
    "TLSFiles",
]

_HOME = {
    "LayerGroupStats": "exporters.step_records",
    "Monitor": "exporters.monitor",
    "StepStats": "exporters.step_records",
    "OtelExporter": "sinks.otel",
    "BasicAuth": "sinks.prometheus",
    "MetricsServer": "sinks.prometheus",
    "StoreCollector": "sinks.prometheus",
    "TLSFiles": "sinks.prometheus",
    "Sinks": "sinks.service",
}


__getattr__ = lazy_attributes(__name__, {name: f"trainhealth.{home}" for name, home in _HOME.items()})
