"""Recording rules: per-job aggregates, so dashboards over 10,000+ GPUs read a few series instead of all.

Named ``level:metric:operation`` as Prometheus recommends; each reads only
catalogue metrics. Evaluated with the alert rules (same file, own group).

>>> RECORDING_RULES[0].record
'job:trainhealth_train_throughput_tokens_per_second:sum'
"""

from __future__ import annotations

from dataclasses import dataclass

from trainhealth._internal import catalog as c

__all__ = ["RECORDING_RULES", "RecordingRule"]


@dataclass(frozen=True)
class RecordingRule:
    record: str
    expr: str

    def to_rule(self) -> dict[str, str]:
        return {"record": self.record, "expr": self.expr}


def _by_job(spec: c.MetricSpec, operation: str, extra: str = "") -> RecordingRule:
    by = "job" + (f", {extra}" if extra else "")
    level = "job" + (f"_{extra.replace(', ', '_')}" if extra else "")
    return RecordingRule(
        f"{level}:{spec.prometheus_name}:{operation}", f"{operation} by ({by}) ({spec.prometheus_name})"
    )


_XIDS = c.GPU_XID_ERRORS.prometheus_name


def _rise_10m(counter: str) -> str:
    """How much ``counter`` rose in the last 10 minutes, counted exactly and alike in PromQL and MetricsQL: sample
    against sample, or all of it for a counter born inside the 10 minutes (an XID counter appears at 1).

    ``increase()`` differs between the two here: Prometheus gives 0 for a counter that appears at 1 (it has no
    earlier sample) and extrapolates to the window's edges; VictoriaMetrics counts from 0 and does not
    (tests/e2e/test_scale_out.py shows both). A counter reset (an exporter restart) counts 0, not negative.
    """
    return f"clamp_min({counter} - {counter} offset 10m, 0) or ({counter} unless {counter} offset 10m)"


RECORDING_RULES: tuple[RecordingRule, ...] = (
    _by_job(c.TRAIN_THROUGHPUT, "sum"),
    _by_job(c.TRAIN_LOSS, "avg"),
    _by_job(c.TRAIN_GRAD_NORM, "max"),
    _by_job(c.TRAIN_LAST_STEP_DURATION, "max"),
    _by_job(c.TRAIN_IRREGULARITY, "max", "signal"),
    _by_job(c.TRAIN_MFU, "avg"),
    _by_job(c.GPU_UTILIZATION, "avg"),
    _by_job(c.GPU_TEMPERATURE, "max"),
    _by_job(c.GPU_POWER, "sum"),
    _by_job(c.GPU_UP, "min"),
    _by_job(c.GPU_CLOCKS_EVENT_ACTIVE, "sum", "reason"),
    _by_job(c.SDC_SUSPECT, "max"),
    RecordingRule(
        f"job_op:{c.COMM_OP_DURATION.prometheus_name}_bucket:rate2m",
        f"sum by (job, op, le) (rate({c.COMM_OP_DURATION.prometheus_name}_bucket[2m]))",
    ),
    RecordingRule(f"job:{_XIDS}:increase10m", f"sum by (job, xid) ({_rise_10m(_XIDS)})"),
)
