"""What produces telemetry: the training-loop Monitor and the two sinks it feeds.

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

_HOME = {"LayerGroupStats": "model", "Monitor": "model", "StepStats": "model", "OtelExporter": "otel",
         "BasicAuth": "prometheus", "MetricsServer": "prometheus", "StoreCollector": "prometheus",
         "TLSFiles": "prometheus", "Sinks": "sinks"}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
