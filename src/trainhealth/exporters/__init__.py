"""What produces telemetry: the training-loop Monitor and the two sinks it feeds."""

from trainhealth.exporters.model import LayerGroupStats, Monitor, StepStats
from trainhealth.exporters.otel import OtelExporter
from trainhealth.exporters.prometheus import BasicAuth, MetricsServer, StoreCollector, TLSFiles
from trainhealth.exporters.sinks import Sinks

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
