"""The process's own metrics: its identity, its build, and the errors the exporter dropped."""

from __future__ import annotations

from trainhealth._internal.catalog.spec import _C, _I, MetricSpec, Unit

RANK_INFO = MetricSpec(
    "rank",
    _I,
    Unit.DIMENSIONLESS,
    "Identity of a training process; gpu_uuid joins with dcgm-exporter's UUID label",
    labels=("local_rank", "world_size", "gpu_uuid", "pod", "namespace"),
)
BUILD_INFO = MetricSpec(
    "build",
    _I,
    Unit.DIMENSIONLESS,
    "Versions of trainhealth and of the libraries it reads from",
    labels=("version", "python_version", "torch_version"),
)
EXPORTER_ERRORS = MetricSpec(
    "exporter.errors",
    _C,
    Unit.ERRORS,
    "Errors caught on the training or scrape path and dropped, by where they happened",
    labels=("source",),
)
