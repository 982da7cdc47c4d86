"""What collects telemetry, one wing per source: ``training`` (what the loop reports), ``gpu`` (NVML, DCGM,
the simulated backend, XIDs), ``collectives`` (the collective logger); the Monitor (``exporters.monitor``)
ties the three to the sinks.

Names load on first use (PEP 562), so importing one exporter does not import the others.
"""

from __future__ import annotations

import importlib
from typing import Any

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

_HOME = {"LayerGroupStats": "exporters.monitor", "Monitor": "exporters.monitor", "StepStats": "exporters.monitor",
         "OtelExporter": "sinks.otel", "BasicAuth": "sinks.prometheus", "MetricsServer": "sinks.prometheus",
         "StoreCollector": "sinks.prometheus", "TLSFiles": "sinks.prometheus", "Sinks": "sinks.service"}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"trainhealth.{_HOME[name]}"), name)
