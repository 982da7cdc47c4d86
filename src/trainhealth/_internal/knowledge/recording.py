"""Recording rules: each per-rank quantity read from the raw series once per evaluation, where it is needed.

Three kinds, named ``level:metric:operation`` as Prometheus recommends, each reading only catalogue metrics:

- **per job** (the ``trainhealth-per-job`` group, once a minute): aggregates a job-wide panel over 10,000+ GPUs
  reads as one series instead of 10,000; **per rank** (``trainhealth-per-rank``), what a panel would
  otherwise compute from every rank's histogram buckets; and **per block** (``trainhealth-per-block``, every 3
  minutes), the model signals of every block over the ranks, trends over hours;
- **per group, for the hang pages** (first in the ``trainhealth-training`` group, so its alerts read them at
  the same evaluation on Prometheus): each process group's furthest sequence number, longest wait, and whether
  it is hung; HungCollective and RankMissing compare ranks with these instead of each computing them again;
- **per job, for TrainingStalled** (the last step's time and duration, first in ``trainhealth-training-sustained``);
- **per rank, for the sustained alerts** (first in a ``-sustained`` group, once a minute): what a rule over
  every GPU's NVLink or PCIe counters computes, also what the panels read at All.

>>> RECORDING_RULES[0].record
'job:trainhealth_train_throughput_tokens_per_second:sum'
>>> [r.record for r in RECORDING_RULES if r.wing == "training"][:2]
['job_group:trainhealth_comm_started_seq:max', 'job_group:trainhealth_comm_inflight_duration_seconds:max']
"""

from __future__ import annotations

from dataclasses import dataclass

from trainhealth._internal import catalog as c
from trainhealth._internal.knowledge.limits import HANG_FLOOR_S, HUNG_COLLECTIVE_S, PAUSE_HOLD_S
from trainhealth._internal.knowledge.promql import counted

__all__ = [
    "ACTIVATION_RMS_BY_BLOCK",
    "ENTROPY_BY_LAYER",
    "MAX_LOGIT_BY_LAYER",
    "ANOMALIES_5M",
    "GROUP_HUNG",
    "GROUP_STARTED_MAX",
    "LAST_STEP_DURATION_MAX",
    "LAST_STEP_MAX",
    "NVLINK_ERRORS_10M",
    "OP_LATENCY_BUCKETS",
    "PCIE_REPLAYS_RATE",
    "PER_BLOCK",
    "PER_JOB",
    "PER_RANK",
    "RANK_MEDIAN_LATENCY",
    "RECORDING_RULES",
    "THROUGHPUT_SUM",
    "RecordingRule",
]

PER_JOB = "per-job"
PER_RANK = "per-rank"
PER_BLOCK = "per-block"


@dataclass(frozen=True)
class RecordingRule:
    """One recording rule; ``wing`` is the rule group it runs in (``per-job``, or the alert wing whose rules read
    it, first in that wing's group, or its sustained group when ``sustained``)."""

    record: str
    expr: str
    wing: str = PER_JOB
    sustained: bool = False

    def to_rule(self) -> dict[str, str]:
        return {"record": self.record, "expr": self.expr}


def _by_job(
    spec: c.MetricSpec, operation: str, extra: str = "", wing: str = PER_JOB, sustained: bool = False
) -> RecordingRule:
    by = "job" + (f", {extra}" if extra else "")
    level = "job" + (f"_{extra.replace(', ', '_')}" if extra else "")
    return RecordingRule(
        f"{level}:{spec.prometheus_name}:{operation}",
        f"{operation} by ({by}) ({spec.prometheus_name})",
        wing,
        sustained=sustained,
    )


def _rise(counter: str, window: str) -> str:
    """How much ``counter`` rose in ``window``, counted exactly and alike in PromQL and MetricsQL: sample against
    sample, or all of it for a counter born inside the window (an XID counter appears at 1).

    ``increase()`` differs between the two here: Prometheus gives 0 for a counter that appears at 1 (it has no
    earlier sample) and extrapolates to the window's edges; VictoriaMetrics counts from 0 and does not
    (tests/e2e/test_scale_out.py shows both). A counter reset (an exporter restart) counts 0, not negative.
    Two samples a series instead of every sample in the window: the cheap form over 500,000 NVLink counters.
    """
    return f"clamp_min({counter} - {counter} offset {window}, 0) or ({counter} unless {counter} offset {window})"


_XIDS = c.GPU_XID_ERRORS.prometheus_name
_STARTED = c.COMM_STARTED_SEQ.prometheus_name
_INFLIGHT = c.COMM_INFLIGHT_DURATION.prometheus_name
_THRESHOLD = c.COMM_HANG_THRESHOLD.prometheus_name
_NVLINK = c.GPU_NVLINK_ERRORS.prometheus_name
_PCIE = c.GPU_PCIE_REPLAYS.prometheus_name
#: the spikes LossSpike and GradNormSpike count (a non-finite value is NonFiniteTraining's)
_SPIKES = c.ANOMALIES.prometheus_name + '{signal=~"loss|grad_norm",detector!="nonfinite"}'

THROUGHPUT_SUM = f"job:{c.TRAIN_THROUGHPUT.prometheus_name}:sum"
LAST_STEP_MAX = f"job:{c.TRAIN_LAST_STEP_TIMESTAMP.prometheus_name}:max"
LAST_STEP_DURATION_MAX = f"job:{c.TRAIN_LAST_STEP_DURATION.prometheus_name}:max"
ANOMALIES_5M = f"job_signal:{c.ANOMALIES.prometheus_name}:counted5m"
GROUP_STARTED_MAX = f"job_group:{_STARTED}:max"
_GROUP_INFLIGHT_MAX = f"job_group:{_INFLIGHT}:max"
_JOB_THRESHOLD_MAX = f"job:{_THRESHOLD}:max"
_JOB_PAUSED = f"job:{c.COMM_PAUSED.prometheus_name}:held"
#: per job and group, the longest wait of a member, present while it is a hang: past the job's hang threshold
#: and no rank of the job in an announced pause (Monitor.pause) or the PAUSE_HOLD_S after one
GROUP_HUNG = f"job_group:{_INFLIGHT}:hung"
NVLINK_ERRORS_10M = f"job_host_gpu_link:{_NVLINK}:rise10m"
#: per job and block, over the ranks: the largest attention logit, the lowest attention entropy, the largest
#: activation RMS (the model-signal panels at All: 32 blocks x 10,000 ranks)
MAX_LOGIT_BY_LAYER = f"job_layer:{c.MODEL_ATTENTION_MAX_LOGIT.prometheus_name}:max"
ENTROPY_BY_LAYER = f"job_layer:{c.MODEL_ATTENTION_ENTROPY.prometheus_name}:min"
ACTIVATION_RMS_BY_BLOCK = f"job_block:{c.MODEL_ACTIVATION_RMS.prometheus_name}:max"
#: each rank's median collective latency over 2 minutes, every operation and group together
RANK_MEDIAN_LATENCY = f"job_host_rank:{c.COMM_OP_DURATION.prometheus_name}:median2m"
#: per job and operation, the collective-latency buckets' rate: the job's quantiles by operation
OP_LATENCY_BUCKETS = f"job_op:{c.COMM_OP_DURATION.prometheus_name}_bucket:rate2m"
PCIE_REPLAYS_RATE = f"gpu:{_PCIE}:rate10m"

_HANG_RULES = (
    RecordingRule(GROUP_STARTED_MAX, f"max by (job, group) ({_STARTED})", "training"),
    RecordingRule(_GROUP_INFLIGHT_MAX, f"max by (job, group) ({_INFLIGHT})", "training"),
    RecordingRule(_JOB_THRESHOLD_MAX, f"max by (job) ({_THRESHOLD})", "training"),
    RecordingRule(
        _JOB_PAUSED,
        f"max by (job) (max_over_time({c.COMM_PAUSED.prometheus_name}[{PAUSE_HOLD_S}s]) unless on (job, rank) "
        f'{c.COMM_STUCK_DURATION.prometheus_name}{{state="in_pause"}})',
        "training",
    ),
    RecordingRule(
        GROUP_HUNG,
        f"{_GROUP_INFLIGHT_MAX} > on (job) group_left() (clamp_min({_JOB_THRESHOLD_MAX}, {HANG_FLOOR_S}) "
        f"or max by (job) ({GROUP_STARTED_MAX}) * 0 + {HUNG_COLLECTIVE_S}) unless on (job) ({_JOB_PAUSED} > 0)",
        "training",
    ),
)

RECORDING_RULES: tuple[RecordingRule, ...] = (
    _by_job(c.TRAIN_THROUGHPUT, "sum"),
    _by_job(c.TRAIN_LOSS, "avg"),
    _by_job(c.TRAIN_GRAD_NORM, "max"),
    _by_job(c.TRAIN_IRREGULARITY, "max", "signal"),
    _by_job(c.TRAIN_MFU, "avg"),
    _by_job(c.GPU_UTILIZATION, "avg"),
    _by_job(c.GPU_TEMPERATURE, "max"),
    _by_job(c.GPU_POWER, "sum"),
    _by_job(c.GPU_UP, "min"),
    _by_job(c.GPU_CLOCKS_EVENT_ACTIVE, "sum", "reason"),
    _by_job(c.SDC_SUSPECT, "max"),
    RecordingRule(f"job:{_XIDS}:increase10m", f"sum by (job, xid) ({_rise(_XIDS, '10m')})"),
    RecordingRule(OP_LATENCY_BUCKETS, f"sum by (job, op, le) (rate({c.COMM_OP_DURATION.prometheus_name}_bucket[2m]))"),
    # --- per block, every 3 minutes: the model-signal panels, trends over hours (blocks x ranks series) ---
    RecordingRule(
        MAX_LOGIT_BY_LAYER, f"max by (job, layer) ({c.MODEL_ATTENTION_MAX_LOGIT.prometheus_name})", PER_BLOCK
    ),
    RecordingRule(ENTROPY_BY_LAYER, f"min by (job, layer) ({c.MODEL_ATTENTION_ENTROPY.prometheus_name})", PER_BLOCK),
    RecordingRule(
        ACTIVATION_RMS_BY_BLOCK, f"max by (job, block) ({c.MODEL_ACTIVATION_RMS.prometheus_name})", PER_BLOCK
    ),
    # --- per rank, once a minute: what a panel at All would otherwise read from every rank's buckets ---
    RecordingRule(
        RANK_MEDIAN_LATENCY,
        f"histogram_quantile(0.5, sum by (job, host, rank, le) (rate({c.COMM_OP_DURATION.prometheus_name}_bucket[2m])))",
        PER_RANK,
    ),
    # --- read by the training wing's alerts, at their own evaluation ---
    *_HANG_RULES,
    _by_job(c.TRAIN_LAST_STEP_TIMESTAMP, "max", wing="training", sustained=True),  # TrainingStalled, once a minute
    _by_job(c.TRAIN_LAST_STEP_DURATION, "max", wing="training", sustained=True),
    RecordingRule(
        ANOMALIES_5M,
        f"max by (job, signal) ({counted(_SPIKES, '5m')})",
        "training",
        sustained=True,
    ),
    # --- per rank, once a minute: the sustained hardware alerts and the panels at All ---
    RecordingRule(
        NVLINK_ERRORS_10M, f"sum by (job, host, gpu, link) ({_rise(_NVLINK, '10m')}) > 0", "hardware", sustained=True
    ),
    RecordingRule(PCIE_REPLAYS_RATE, f"rate({_PCIE}[10m])", "hardware", sustained=True),
)
