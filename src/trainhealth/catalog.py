"""The metric catalogue: every metric trainhealth exports, with its Prometheus and OpenTelemetry names.

>>> from trainhealth.catalog import CATALOG, by_prometheus_name
>>> spec = by_prometheus_name("trainhealth_train_loss")
>>> spec.kind.name, spec in CATALOG
('GAUGE', True)
"""

from trainhealth._internal.catalog import CATALOG, by_otel_name, by_prometheus_name
from trainhealth._internal.catalog.spec import MetricKind, MetricSpec, Unit

__all__ = ["CATALOG", "MetricKind", "MetricSpec", "Unit", "by_otel_name", "by_prometheus_name"]
