"""The metric catalogue: every metric trainhealth exports, declared once.

A metric is declared with an OpenTelemetry-style dotted name, a kind and a
unit (:mod:`~trainhealth._internal.catalog.spec`). Both exported names are derived
there and nowhere else:

* the Prometheus name (``/metrics``) is ``trainhealth_<name with dots as
  underscores>``, then the unit suffix (``_seconds``, ``_bytes``, ``_ratio`` ...),
  then ``_total`` for counters or ``_info`` for metadata;
* the OTLP name is the OpenTelemetry semantic convention's where one covers the
  metric (``hw.gpu.utilization``, see :mod:`~trainhealth._internal.catalog.otel`), else
  ``trainhealth.<name>`` with the UCUM unit. After an OTLP-to-Prometheus
  translation (:attr:`MetricSpec.translated_name`) the ``trainhealth.*`` names
  mostly match the ``/metrics`` ones; the convention's names do not.

Each group of metrics is declared in its own module; this package gathers
them in catalogue order. Exporters, dashboards and alert rules refer to the
constants, never to a retyped string.

>>> TRAIN_STEP_DURATION.prometheus_name
'trainhealth_train_step_duration_seconds'
>>> TRAIN_STEP_DURATION.otel_name, TRAIN_STEP_DURATION.otel_unit
('trainhealth.train.step.duration', 's')
>>> GPU_UTILIZATION.prometheus_name, GPU_UTILIZATION.otel_name, GPU_UTILIZATION.translated_name
('trainhealth_gpu_utilization_ratio', 'hw.gpu.utilization', 'hw_gpu_utilization_ratio')
>>> EXPORTER_ERRORS.prometheus_name
'trainhealth_exporter_errors_total'
>>> by_prometheus_name("trainhealth_rank_info") is RANK_INFO
True
"""

from __future__ import annotations

from trainhealth._internal.catalog import anomalies, checkpoints, collectives, gpu, localization, process, sdc, training
from trainhealth._internal.catalog.anomalies import (
    ANOMALIES,
    ANOMALIES_ACTIVE,
    ANOMALIES_LAST_TIMESTAMP,
    TRAIN_IRREGULARITY,
    TRAIN_SPIKE_SCORE,
)
from trainhealth._internal.catalog.checkpoints import (
    CHECKPOINT_LAST_DURATION,
    CHECKPOINT_LAST_STEP,
    CHECKPOINT_LAST_TIMESTAMP,
    CHECKPOINT_SAVES,
    TRAIN_GOODPUT,
    TRAIN_LOST_TIME,
    TRAIN_RESTARTS,
)
from trainhealth._internal.catalog.collectives import (
    COMM_ABNORMAL_OPS,
    COMM_BYTES,
    COMM_COMPLETED_SEQ,
    COMM_FAILURES,
    COMM_GROUP_MEMBER,
    COMM_HANG_THRESHOLD,
    COMM_INFLIGHT_DURATION,
    COMM_OP_DURATION,
    COMM_OPS,
    COMM_PAUSED,
    COMM_RECORDS_DROPPED,
    COMM_SECONDS_BUCKETS,
    COMM_STARTED_SEQ,
    COMM_STUCK_DURATION,
    COMM_WATCH_TIMESTAMP,
)
from trainhealth._internal.catalog.gpu import (
    EXPORTER_GPU_BACKEND_UP,
    EXPORTER_GPU_SAMPLE_DURATION,
    EXPORTER_GPU_SAMPLE_TIMESTAMP,
    GPU_CLOCK,
    GPU_CLOCK_MAX,
    GPU_CLOCKS_EVENT_ACTIVE,
    GPU_DRAM_ACTIVE,
    GPU_ECC_ERRORS,
    GPU_ENERGY,
    GPU_FAN_SPEED,
    GPU_INFO,
    GPU_LABELS,
    GPU_MEMORY_BUSY,
    GPU_MEMORY_TEMPERATURE,
    GPU_MEMORY_TOTAL,
    GPU_MEMORY_USED,
    GPU_NVLINK_ERRORS,
    GPU_NVLINK_THROUGHPUT,
    GPU_NVLINK_UP,
    GPU_PCIE_REPLAYS,
    GPU_PCIE_THROUGHPUT,
    GPU_PERFORMANCE_STATE,
    GPU_POWER,
    GPU_POWER_LIMIT,
    GPU_RECOVERY_ACTION,
    GPU_REMAPPED_ROWS,
    GPU_RETIRED_PAGES,
    GPU_RETIRED_PAGES_PENDING,
    GPU_ROW_REMAP_FAILURE,
    GPU_ROW_REMAP_PENDING,
    GPU_SM_ACTIVE,
    GPU_STATE,
    GPU_TEMPERATURE,
    GPU_TENSOR_ACTIVE,
    GPU_UP,
    GPU_UTILIZATION,
    GPU_XID_ERRORS,
    GPU_XID_LAST_TIMESTAMP,
)
from trainhealth._internal.catalog.localization import (
    ANALYSIS_CONSECUTIVE_FAILURES,
    ANALYSIS_DETECTABLE_SLOWDOWN,
    ANALYSIS_DURATION,
    ANALYSIS_EVENTS,
    ANALYSIS_IRREGULAR_STEPS,
    ANALYSIS_JOB_SLOWDOWN,
    ANALYSIS_LAST_RUN_TIMESTAMP,
    ANALYSIS_RANK_COMPUTE,
    ANALYSIS_RANK_WAIT,
    ANALYSIS_RANKS,
    ANALYSIS_STALE,
    ANALYSIS_UNCOVERED_RANKS,
    ANALYSIS_VERDICT,
    SUSPECT_SCORE,
    SUSPECT_SINCE_STEP,
    SUSPECT_SLOWDOWN,
)
from trainhealth._internal.catalog.otel import OtelAttribute, OtelInstrument, Semconv, translated_prometheus_name
from trainhealth._internal.catalog.process import BUILD_INFO, EXPORTER_ERRORS, RANK_INFO
from trainhealth._internal.catalog.sdc import (
    MODEL_ACTIVATION_RMS,
    MODEL_ATTENTION_ENTROPY,
    MODEL_ATTENTION_MAX_LOGIT,
    MODEL_OUTPUT_LOG_Z,
    SDC_CHECKS,
    SDC_MISMATCHED_TENSORS,
    SDC_MISMATCHES,
    SDC_SUSPECT,
    SELFTEST_ERROR,
    SELFTEST_PASSED,
    SELFTEST_TIMESTAMP,
    TRAIN_LOCAL_GRAD_NORM,
    TRAIN_LOCAL_GRAD_NORM_PEER_RATIO,
    TRAIN_LOSS_SPIKE_ONSET_STEP,
    TRAIN_LOSS_SPIKE_REWIND_STEP,
    TRAIN_LOSS_SPIKE_UNRECOVERED,
    TRAIN_NONFINITE_FIRST_STEP,
    TRAIN_NONFINITE_ORIGIN,
)
from trainhealth._internal.catalog.spec import IDENTITY_LABELS, PREFIX, MetricKind, MetricSpec, Unit
from trainhealth._internal.catalog.training import (
    STEP_SECONDS_BUCKETS,
    TRAIN_GRAD_NORM,
    TRAIN_LAST_STEP_COMPUTE,
    TRAIN_LAST_STEP_DURATION,
    TRAIN_LAST_STEP_TIMESTAMP,
    TRAIN_LAST_STEP_WAIT,
    TRAIN_LAYER_GRAD_NORM,
    TRAIN_LAYER_PARAM_NORM,
    TRAIN_LAYER_UPDATE_RATIO,
    TRAIN_LEARNING_RATE,
    TRAIN_LOSS,
    TRAIN_MFU,
    TRAIN_NONFINITE_STEPS,
    TRAIN_PARAM_NORM,
    TRAIN_STEP,
    TRAIN_STEP_COMPUTE,
    TRAIN_STEP_DURATION,
    TRAIN_STEP_WAIT,
    TRAIN_STEPS,
    TRAIN_THROUGHPUT,
    TRAIN_TOKENS,
    TRAIN_UPDATE_COSINE,
    TRAIN_UPDATE_RATIO,
)

__all__ = [
    "CATALOG",
    "GPU_LABELS",
    "IDENTITY_LABELS",
    "MetricKind",
    "MetricSpec",
    "OtelAttribute",
    "OtelInstrument",
    "Semconv",
    "Unit",
    "by_otel_name",
    "by_prometheus_name",
    "PREFIX",
    "translated_prometheus_name",
]

#: The declaration modules in catalogue order, which is the order of ``trainhealth metrics`` and docs/metrics.md.
_GROUPS = (process, training, gpu, collectives, anomalies, sdc, checkpoints, localization)

CATALOG: tuple[MetricSpec, ...] = tuple(
    value for group in _GROUPS for value in vars(group).values() if isinstance(value, MetricSpec)
)
__all__ += [name for group in _GROUPS for name, value in vars(group).items() if isinstance(value, MetricSpec)]

_BY_PROMETHEUS_NAME = {spec.prometheus_name: spec for spec in CATALOG}
if len(_BY_PROMETHEUS_NAME) != len(CATALOG):
    raise ValueError("two catalogue entries share a Prometheus name")

_BY_OTEL_NAME: dict[str, tuple[MetricSpec, ...]] = {}
for _spec in CATALOG:
    _BY_OTEL_NAME[_spec.otel_name] = _BY_OTEL_NAME.get(_spec.otel_name, ()) + (_spec,)
for _name, _specs in _BY_OTEL_NAME.items():
    # entries sharing an OTLP name share one instrument, so they must describe it alike
    if len({(s.otel_instrument, s.otel_unit, s.otel_description) for s in _specs}) != 1 or (
        len(_specs) > 1 and any(s.semconv is None for s in _specs)
    ):
        raise ValueError(f"catalogue entries sharing the OTLP name {_name!r} declare it differently")
del _spec, _name, _specs


def by_prometheus_name(name: str) -> MetricSpec:
    """The catalogue entry exported under ``name``; ``KeyError`` when there is none."""
    return _BY_PROMETHEUS_NAME[name]


def by_otel_name(name: str) -> tuple[MetricSpec, ...]:
    """The catalogue entries exported over OTLP as ``name`` (two for ``hw.temperature``); ``KeyError`` when none.

    >>> [spec.prometheus_name for spec in by_otel_name("hw.temperature")]
    ['trainhealth_gpu_temperature_celsius', 'trainhealth_gpu_memory_temperature_celsius']
    """
    return _BY_OTEL_NAME[name]
