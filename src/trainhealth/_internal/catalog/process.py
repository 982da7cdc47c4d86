"""The process's own metrics: its identity, its build, and the errors the exporter dropped."""

from __future__ import annotations

from trainhealth._internal.catalog.spec import _C, _I, MetricSpec, Unit

RANK_INFO = MetricSpec(
    "rank",
    _I,
    Unit.DIMENSIONLESS,
    "Identity of a training process; job is the run's own id, job_name the job's logical name (the same for "
    "every run of it); gpu_uuid joins with dcgm-exporter's UUID label",
    labels=("local_rank", "world_size", "gpu_uuid", "pod", "namespace", "job_name"),
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
