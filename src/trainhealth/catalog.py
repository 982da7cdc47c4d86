"""The metric catalogue: every metric trainhealth exports, declared once.

A metric is declared with an OpenTelemetry-style dotted name, a kind and a
unit. Both exported names are derived here and nowhere else:

* the OpenTelemetry instrument name is ``trainhealth.<name>`` with the UCUM unit;
* the Prometheus name is ``trainhealth_<name with dots as underscores>``, then
  the unit suffix (``_seconds``, ``_bytes``, ``_ratio`` ...), then ``_total`` for
  counters or ``_info`` for metadata — the same translation the OpenTelemetry
  Collector's Prometheus exporter applies, so both paths give one name.

Exporters, dashboards and alert rules refer to the constants below, never to a
retyped string.

>>> TRAIN_STEP_DURATION.prometheus_name
'trainhealth_train_step_duration_seconds'
>>> TRAIN_STEP_DURATION.otel_name, TRAIN_STEP_DURATION.otel_unit
('trainhealth.train.step.duration', 's')
>>> EXPORTER_ERRORS.prometheus_name
'trainhealth_exporter_errors_total'
>>> by_prometheus_name("trainhealth_rank_info") is RANK_INFO
True
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

__all__ = [
    "CATALOG",
    "GPU_LABELS",
    "IDENTITY_LABELS",
    "MetricKind",
    "MetricSpec",
    "Unit",
    "by_prometheus_name",
    "PREFIX",
]

PREFIX = "trainhealth"

#: Labels every trainhealth series carries, added by the exporters from the
#: process identity (see :mod:`trainhealth.identity`). All three are bounded:
#: one value per job, per node, per rank.
IDENTITY_LABELS: tuple[str, ...] = ("job", "host", "rank")

#: Label names that would make cardinality unbounded or collide with
#: Prometheus' own; a declaration using one fails at import.
_FORBIDDEN_LABELS = frozenset(
    {"step", "iteration", "tensor", "param", "parameter", "message", "text", "le", "quantile", "instance"}
)
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
_LABEL_RE = re.compile(r"^[a-z][a-z0-9_]*$")


class MetricKind(Enum):
    """How a metric aggregates; decides the Prometheus type and the OpenTelemetry instrument."""

    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"
    INFO = "info"

    @property
    def otel_instrument(self) -> str:
        return _OTEL_INSTRUMENTS[self]


_OTEL_INSTRUMENTS = {
    MetricKind.GAUGE: "ObservableGauge",
    MetricKind.COUNTER: "ObservableCounter",
    MetricKind.HISTOGRAM: "Histogram",
    MetricKind.INFO: "ObservableGauge",
}


class Unit(Enum):
    """The one OpenTelemetry (UCUM) <-> Prometheus unit table.

    Values are ``(ucum, prometheus_suffix)``; an empty suffix adds nothing to
    the Prometheus name (curly-brace annotations are not units).
    """

    SECONDS = ("s", "seconds")
    BYTES = ("By", "bytes")
    CELSIUS = ("Cel", "celsius")
    WATTS = ("W", "watts")
    JOULES = ("J", "joules")
    HERTZ = ("Hz", "hertz")
    RATIO = ("1", "ratio")
    BYTES_PER_SECOND = ("By/s", "bytes_per_second")
    TOKENS_PER_SECOND = ("{token}/s", "tokens_per_second")
    DIMENSIONLESS = ("1", "")
    STEPS = ("{step}", "")
    TOKENS = ("{token}", "")
    ERRORS = ("{error}", "")
    EVENTS = ("{event}", "")
    OPERATIONS = ("{operation}", "")
    RECORDS = ("{record}", "")

    @property
    def ucum(self) -> str:
        return self.value[0]

    @property
    def prometheus_suffix(self) -> str:
        return self.value[1]


@dataclass(frozen=True, eq=False)
class MetricSpec:
    """One exported metric. Invalid declarations raise ``ValueError`` at import.

    Each metric is declared once, so specs compare and hash by identity, which
    keeps the store's per-sample lookups cheap.
    """

    name: str
    kind: MetricKind
    unit: Unit
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    #: When the metric may be missing from an endpoint, and why.
    availability: str = ""
    #: The identity labels of the exporting process it carries: all of them, except for metrics whose
    #: own ``rank`` and ``host`` labels name someone else (the analyzer's suspects).
    identity: tuple[str, ...] = IDENTITY_LABELS
    _prometheus_name: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError(f"metric {self.name!r}: name must be lowercase dotted words")
        if self.kind is MetricKind.COUNTER and self.name.endswith("total"):
            raise ValueError(f"metric {self.name!r}: counters get '_total' from the catalogue")
        if self.kind is MetricKind.INFO and self.unit is not Unit.DIMENSIONLESS:
            raise ValueError(f"metric {self.name!r}: info metrics have no unit")
        if not self.help or not (self.help[0].isupper() or self.help[0].isdigit()) or self.help.endswith("."):
            raise ValueError(f"metric {self.name!r}: help is a capitalised phrase without a final period")
        if not set(self.identity) <= set(IDENTITY_LABELS) or "job" not in self.identity:
            raise ValueError(f"metric {self.name!r}: identity labels must include job and come from {IDENTITY_LABELS}")
        for label in self.labels:
            if not _LABEL_RE.match(label) or label in _FORBIDDEN_LABELS or label in self.identity:
                raise ValueError(f"metric {self.name!r}: label {label!r} is not allowed")
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"metric {self.name!r}: duplicate label")
        if (self.kind is MetricKind.HISTOGRAM) != bool(self.buckets):
            raise ValueError(f"metric {self.name!r}: histograms, and only histograms, have buckets")
        if list(self.buckets) != sorted(set(self.buckets)):
            raise ValueError(f"metric {self.name!r}: buckets must increase strictly")
        object.__setattr__(self, "_prometheus_name", _prometheus_name(self))

    @property
    def prometheus_name(self) -> str:
        return self._prometheus_name

    @property
    def prometheus_type(self) -> str:
        return self.kind.value

    @property
    def otel_name(self) -> str:
        return f"{PREFIX}.{self.name}"

    @property
    def otel_unit(self) -> str:
        return self.unit.ucum

    @property
    def all_labels(self) -> tuple[str, ...]:
        """Identity labels followed by the metric's own labels, as exported to Prometheus."""
        return self.identity + self.labels

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.prometheus_name,
            "type": self.prometheus_type,
            "unit": self.unit.prometheus_suffix,
            "help": self.help,
            "labels": list(self.all_labels),
            "otel_name": self.otel_name,
            "otel_unit": self.otel_unit,
            "otel_instrument": self.kind.otel_instrument,
            "buckets": list(self.buckets),
            "availability": self.availability,
        }


def _prometheus_name(spec: MetricSpec) -> str:
    name = f"{PREFIX}_{spec.name.replace('.', '_')}"
    suffix = spec.unit.prometheus_suffix
    if suffix and not name.endswith(f"_{suffix}"):
        name = f"{name}_{suffix}"
    if spec.kind is MetricKind.COUNTER:
        name += "_total"
    elif spec.kind is MetricKind.INFO:
        name += "_info"
    return name


# Step times run from ~10 ms (small models) to minutes (huge ones, or a stall).
STEP_SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

_G, _C, _H, _I = MetricKind.GAUGE, MetricKind.COUNTER, MetricKind.HISTOGRAM, MetricKind.INFO

# --- identity and the exporter itself -------------------------------------------------
RANK_INFO = MetricSpec(
    "rank", _I, Unit.DIMENSIONLESS,
    "Identity of a training process; gpu_uuid joins with dcgm-exporter's UUID label",
    labels=("local_rank", "world_size", "gpu_uuid", "pod", "namespace"),
)
BUILD_INFO = MetricSpec(
    "build", _I, Unit.DIMENSIONLESS,
    "Versions of trainhealth and of the libraries it reads from",
    labels=("version", "python_version", "torch_version"),
)
EXPORTER_ERRORS = MetricSpec(
    "exporter.errors", _C, Unit.ERRORS,
    "Errors caught on the training or scrape path and dropped, by where they happened",
    labels=("source",),
)

# --- training loop (Monitor) -------------------------------------------------------------
TRAIN_LOSS = MetricSpec("train.loss", _G, Unit.DIMENSIONLESS, "Training loss of the last reported step")
TRAIN_STEP = MetricSpec(
    "train.step", _G, Unit.DIMENSIONLESS,
    "Training iteration of the last reported step (as given by the training loop)",
)
TRAIN_STEPS = MetricSpec("train.steps", _C, Unit.STEPS, "Training steps reported since the process started")
TRAIN_LAST_STEP_TIMESTAMP = MetricSpec(
    "train.last_step.timestamp", _G, Unit.SECONDS, "Unix time at which the last step was reported",
)
TRAIN_STEP_DURATION = MetricSpec(
    "train.step.duration", _H, Unit.SECONDS,
    "Wall time between consecutive reported steps",
    buckets=STEP_SECONDS_BUCKETS,
)
TRAIN_LAST_STEP_DURATION = MetricSpec(
    "train.last_step.duration", _G, Unit.SECONDS, "Wall time of the last reported step",
)
_STEP_SPLIT = ("Only with the collective logger (comm=True or trainhealth.comm installed) and a Monitor "
               "reporting steps; updated by the logger's flush thread.")
TRAIN_STEP_WAIT = MetricSpec(
    "train.step.wait", _C, Unit.SECONDS,
    "Seconds of this rank's steps spent blocked in collectives, summed over steps (its rate over the rate of "
    "trainhealth_train_steps_total is the wait per step); the straggler is the rank that waits least",
    availability=_STEP_SPLIT,
)
TRAIN_STEP_COMPUTE = MetricSpec(
    "train.step.compute", _C, Unit.SECONDS,
    "Seconds of this rank's steps spent outside collectives (step wall time minus wait), summed over steps",
    availability=_STEP_SPLIT,
)
TRAIN_LAST_STEP_WAIT = MetricSpec(
    "train.last_step.wait", _G, Unit.SECONDS, "Seconds the last accounted step spent blocked in collectives",
    availability=_STEP_SPLIT,
)
TRAIN_LAST_STEP_COMPUTE = MetricSpec(
    "train.last_step.compute", _G, Unit.SECONDS, "Seconds the last accounted step spent outside collectives",
    availability=_STEP_SPLIT,
)
TRAIN_TOKENS = MetricSpec("train.tokens", _C, Unit.TOKENS, "Tokens processed by this rank")
TRAIN_THROUGHPUT = MetricSpec(
    "train.throughput", _G, Unit.TOKENS_PER_SECOND, "Tokens per second processed by this rank in the last step",
)
TRAIN_MFU = MetricSpec(
    "train.mfu", _G, Unit.RATIO,
    "Model FLOPs utilisation of the last step: achieved over peak FLOP/s",
    availability="Only when flops_per_token and peak_flops are set.",
)
TRAIN_GRAD_NORM = MetricSpec(
    "train.grad_norm", _G, Unit.DIMENSIONLESS,
    "Total L2 norm of the gradients: the pre-clipping norm the loop passes, else as the optimizer receives them",
)
TRAIN_PARAM_NORM = MetricSpec(
    "train.param_norm", _G, Unit.DIMENSIONLESS, "Total L2 norm of the parameters after the last update",
    availability="Updated every stats_every steps.",
)
TRAIN_UPDATE_RATIO = MetricSpec(
    "train.update_ratio", _G, Unit.RATIO,
    "Norm of the last optimizer update over the norm of the parameters it updated",
    availability="Needs an optimizer; updated every stats_every steps.",
)
TRAIN_UPDATE_COSINE = MetricSpec(
    "train.update_cosine", _G, Unit.DIMENSIONLESS,
    "Cosine similarity of two consecutive optimizer updates",
    availability="Needs an optimizer; updated every stats_every steps.",
)
TRAIN_LAYER_GRAD_NORM = MetricSpec(
    "train.layer.grad_norm", _G, Unit.DIMENSIONLESS,
    "L2 norm of one layer group's gradients as the optimizer receives them",
    labels=("layer_group",),
    availability="Updated every stats_every steps.",
)
TRAIN_LAYER_PARAM_NORM = MetricSpec(
    "train.layer.param_norm", _G, Unit.DIMENSIONLESS,
    "L2 norm of the parameters of one layer group",
    labels=("layer_group",),
    availability="Updated every stats_every steps.",
)
TRAIN_LAYER_UPDATE_RATIO = MetricSpec(
    "train.layer.update_ratio", _G, Unit.RATIO,
    "Update-to-parameter norm ratio of one layer group",
    labels=("layer_group",),
    availability="Needs an optimizer; updated every stats_every steps.",
)
TRAIN_LEARNING_RATE = MetricSpec(
    "train.learning_rate", _G, Unit.DIMENSIONLESS, "Learning rate of one optimizer parameter group",
    labels=("param_group",),
    availability="Needs an optimizer.",
)
TRAIN_NONFINITE_STEPS = MetricSpec(
    "train.nonfinite_steps", _C, Unit.STEPS,
    "Steps whose loss or gradient norm was NaN or infinite, by signal",
    labels=("signal",),
)

# --- GPU hardware (NVML sampler, XID watcher, DCGM profiling, simulated backend) ---------
#: Every hardware series carries the GPU index and the backend that produced it:
#: ``nvml``, ``dcgm`` or ``simulated`` — simulated series can never pass for real ones.
GPU_LABELS: tuple[str, ...] = ("gpu", "backend")
_ECC_NOTE = "Needs ECC mode enabled."
_NVLINK_NOTE = "GPUs with NVLink; one series per link that answers."
_DCGM_NOTE = "Only with the DCGM Python bindings and a reachable nv-hostengine (backend=dcgm), or the simulated backend."

GPU_INFO = MetricSpec(
    "gpu", _I, Unit.DIMENSIONLESS,
    "Identity of a GPU: UUID (dcgm-exporter's UUID label), PCI bus id, model and driver",
    labels=GPU_LABELS + ("uuid", "pci_bus_id", "model", "driver_version"),
)
GPU_UP = MetricSpec(
    "gpu.up", _G, Unit.DIMENSIONLESS,
    "1 while the GPU answers NVML; 0 when it is lost, fell off the bus or needs a reset",
    labels=GPU_LABELS,
)
GPU_STATE = MetricSpec(
    "gpu.state", _G, Unit.DIMENSIONLESS,
    "1 for the GPU's current state (ok, lost, reset_required, error), 0 for the others",
    labels=GPU_LABELS + ("state",),
)
GPU_UTILIZATION = MetricSpec(
    "gpu.utilization", _G, Unit.RATIO, "Fraction of the last sample period in which a kernel ran",
    labels=GPU_LABELS,
)
GPU_MEMORY_BUSY = MetricSpec(
    "gpu.memory.busy", _G, Unit.RATIO,
    "Fraction of the last sample period in which device memory was read or written",
    labels=GPU_LABELS,
)
GPU_MEMORY_USED = MetricSpec("gpu.memory.used", _G, Unit.BYTES, "Device memory in use", labels=GPU_LABELS)
GPU_MEMORY_TOTAL = MetricSpec("gpu.memory.total", _G, Unit.BYTES, "Device memory installed", labels=GPU_LABELS)
GPU_TEMPERATURE = MetricSpec("gpu.temperature", _G, Unit.CELSIUS, "GPU die temperature", labels=GPU_LABELS)
GPU_MEMORY_TEMPERATURE = MetricSpec(
    "gpu.memory.temperature", _G, Unit.CELSIUS, "HBM temperature", labels=GPU_LABELS,
    availability="GPUs with HBM that report NVML_FI_DEV_MEMORY_TEMP.",
)
GPU_POWER = MetricSpec("gpu.power", _G, Unit.WATTS, "Power draw", labels=GPU_LABELS)
GPU_POWER_LIMIT = MetricSpec("gpu.power_limit", _G, Unit.WATTS, "Enforced power limit", labels=GPU_LABELS)
GPU_ENERGY = MetricSpec(
    "gpu.energy", _C, Unit.JOULES, "Energy consumed since the driver was loaded", labels=GPU_LABELS,
    availability="Volta and newer.",
)
GPU_CLOCK = MetricSpec(
    "gpu.clock", _G, Unit.HERTZ, "Current clock frequency (clock = sm or memory)", labels=GPU_LABELS + ("clock",),
)
GPU_CLOCK_MAX = MetricSpec(
    "gpu.clock.max", _G, Unit.HERTZ, "Maximum clock frequency (clock = sm or memory)", labels=GPU_LABELS + ("clock",),
)
GPU_CLOCKS_EVENT_ACTIVE = MetricSpec(
    "gpu.clocks_event.active", _G, Unit.DIMENSIONLESS,
    "1 while this clocks-event (throttle) reason holds the clocks down, else 0",
    labels=GPU_LABELS + ("reason",),
)
GPU_ECC_ERRORS = MetricSpec(
    "gpu.ecc.errors", _C, Unit.ERRORS,
    "ECC errors (error_type corrected or uncorrected; counter_type volatile since reset, or aggregate lifetime)",
    labels=GPU_LABELS + ("error_type", "counter_type"), availability=_ECC_NOTE,
)
GPU_RETIRED_PAGES = MetricSpec(
    "gpu.retired_pages", _G, Unit.DIMENSIONLESS,
    "Memory pages retired (cause multiple_single_bit or double_bit)",
    labels=GPU_LABELS + ("cause",), availability="Before Ampere; newer GPUs remap rows instead. " + _ECC_NOTE,
)
GPU_RETIRED_PAGES_PENDING = MetricSpec(
    "gpu.retired_pages.pending", _G, Unit.DIMENSIONLESS,
    "1 when a page retirement waits for the next reset", labels=GPU_LABELS,
    availability="Before Ampere. " + _ECC_NOTE,
)
GPU_REMAPPED_ROWS = MetricSpec(
    "gpu.remapped_rows", _G, Unit.DIMENSIONLESS,
    "Memory rows remapped (error_type correctable or uncorrectable)",
    labels=GPU_LABELS + ("error_type",), availability="Ampere and newer. " + _ECC_NOTE,
)
GPU_ROW_REMAP_PENDING = MetricSpec(
    "gpu.row_remap.pending", _G, Unit.DIMENSIONLESS, "1 when a row remap waits for the next GPU reset",
    labels=GPU_LABELS, availability="Ampere and newer. " + _ECC_NOTE,
)
GPU_ROW_REMAP_FAILURE = MetricSpec(
    "gpu.row_remap.failure", _G, Unit.DIMENSIONLESS, "1 when a row remap failed: the GPU needs service",
    labels=GPU_LABELS, availability="Ampere and newer. " + _ECC_NOTE,
)
GPU_PCIE_REPLAYS = MetricSpec(
    "gpu.pcie.replays", _C, Unit.EVENTS, "PCIe link replays (retransmissions)", labels=GPU_LABELS,
)
GPU_PCIE_THROUGHPUT = MetricSpec(
    "gpu.pcie.throughput", _G, Unit.BYTES_PER_SECOND, "PCIe traffic (direction tx or rx)",
    labels=GPU_LABELS + ("direction",),
    availability="Not on every GPU; with backend=dcgm it comes from DCGM's profiling counters.",
)
GPU_NVLINK_UP = MetricSpec(
    "gpu.nvlink.up", _G, Unit.DIMENSIONLESS, "1 while the NVLink link is active", labels=GPU_LABELS + ("link",),
    availability=_NVLINK_NOTE,
)
GPU_NVLINK_ERRORS = MetricSpec(
    "gpu.nvlink.errors", _C, Unit.ERRORS,
    "NVLink errors per link (error_type replay, recovery, crc_flit or crc_data)",
    labels=GPU_LABELS + ("link", "error_type"), availability=_NVLINK_NOTE,
)
GPU_NVLINK_THROUGHPUT = MetricSpec(
    "gpu.nvlink.throughput", _G, Unit.BYTES_PER_SECOND, "NVLink traffic (direction tx or rx)",
    labels=GPU_LABELS + ("direction",), availability=_DCGM_NOTE,
)
GPU_FAN_SPEED = MetricSpec(
    "gpu.fan_speed", _G, Unit.RATIO, "Fan speed as a fraction of its maximum", labels=GPU_LABELS,
    availability="Absent on passively cooled GPUs (most data-centre boards).",
)
GPU_PERFORMANCE_STATE = MetricSpec(
    "gpu.performance_state", _G, Unit.DIMENSIONLESS, "Performance state: 0 (P0, fastest) to 15 (slowest)",
    labels=GPU_LABELS,
)
GPU_RECOVERY_ACTION = MetricSpec(
    "gpu.recovery_action", _G, Unit.DIMENSIONLESS,
    "Recovery the driver requires: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset, "
    "5 recover IMEX domain, 6 bus reset, 7 system reboot",
    labels=GPU_LABELS, availability="Drivers that report NVML_FI_DEV_GET_GPU_RECOVERY_ACTION.",
)
GPU_XID_ERRORS = MetricSpec(
    "gpu.xid.errors", _C, Unit.ERRORS,
    "XID errors reported by the driver, every occurrence counted (repeats included)",
    labels=GPU_LABELS + ("xid",), availability="Appears with the first XID of a kind on that GPU.",
)
GPU_XID_LAST_TIMESTAMP = MetricSpec(
    "gpu.xid.last.timestamp", _G, Unit.SECONDS, "Unix time of the last XID of this kind on the GPU",
    labels=GPU_LABELS + ("xid",), availability="Appears with the first XID of a kind on that GPU.",
)
GPU_SM_ACTIVE = MetricSpec(
    "gpu.sm.active", _G, Unit.RATIO, "Fraction of cycles an SM had at least one warp resident (DCGM profiling)",
    labels=GPU_LABELS, availability=_DCGM_NOTE,
)
GPU_TENSOR_ACTIVE = MetricSpec(
    "gpu.tensor_pipe.active", _G, Unit.RATIO, "Fraction of cycles the tensor pipes were busy (DCGM profiling)",
    labels=GPU_LABELS, availability=_DCGM_NOTE,
)
GPU_DRAM_ACTIVE = MetricSpec(
    "gpu.dram.active", _G, Unit.RATIO, "Fraction of cycles device memory was transferring data (DCGM profiling)",
    labels=GPU_LABELS, availability=_DCGM_NOTE,
)
EXPORTER_GPU_BACKEND_UP = MetricSpec(
    "exporter.gpu_backend.up", _G, Unit.DIMENSIONLESS,
    "1 while the GPU backend (NVML, DCGM or the simulation) is initialised and sampling",
    labels=("backend",),
)
EXPORTER_GPU_SAMPLE_DURATION = MetricSpec(
    "exporter.gpu_sample.duration", _G, Unit.SECONDS, "Wall time of the last sampling pass over the GPUs",
    labels=("backend",),
)
EXPORTER_GPU_SAMPLE_TIMESTAMP = MetricSpec(
    "exporter.gpu_sample.timestamp", _G, Unit.SECONDS,
    "Unix time the last sampling pass finished; an old value means the sampler is stuck",
    labels=("backend",),
)

# --- collective operations (trainhealth.comm) --------------------------------------------
# Collectives last from microseconds (a small all-reduce on NVLink) to minutes (a stall).
COMM_SECONDS_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1,
                        0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
COMM_OP_DURATION = MetricSpec(
    "comm.op.duration", _H, Unit.SECONDS,
    "Elapsed time of collective operations on this rank, waiting for the other ranks included",
    labels=("op", "group"), buckets=COMM_SECONDS_BUCKETS,
)
COMM_OPS = MetricSpec("comm.ops", _C, Unit.OPERATIONS, "Collective operations completed by this rank", labels=("op", "group"))
COMM_BYTES = MetricSpec("comm.bytes", _C, Unit.BYTES, "Bytes this rank sent into collective operations", labels=("op", "group"))
COMM_INFLIGHT_DURATION = MetricSpec(
    "comm.inflight.duration", _G, Unit.SECONDS,
    "How long this rank has been inside the collective it is waiting in; 0 when it is in none",
    labels=("op", "group"),
)
COMM_STARTED_SEQ = MetricSpec(
    "comm.started_seq", _G, Unit.DIMENSIONLESS,
    "Sequence number of the last collective this rank entered in the group; a rank below its peers' lags",
    labels=("group",),
)
COMM_COMPLETED_SEQ = MetricSpec(
    "comm.completed_seq", _G, Unit.DIMENSIONLESS,
    "Sequence number of the last collective this rank completed in the group",
    labels=("group",),
)
COMM_ABNORMAL_OPS = MetricSpec(
    "comm.abnormal_ops", _C, Unit.OPERATIONS,
    "Collectives far slower than their recent baseline on this rank (the records kept for shipping)",
    labels=("op", "group"),
)
COMM_RECORDS_DROPPED = MetricSpec(
    "comm.records_dropped", _C, Unit.RECORDS,
    "Operation records overwritten in the ring buffer before a trace was written",
)

# --- anomalies (trainhealth.detectors) --------------------------------------------------
ANOMALIES = MetricSpec(
    "anomalies", _C, Unit.EVENTS, "Anomalies detected on this process's signals, by detector and signal",
    labels=("detector", "signal"),
)
ANOMALIES_ACTIVE = MetricSpec(
    "anomalies.active", _G, Unit.DIMENSIONLESS, "Anomalies still in progress (series currently anomalous)",
    labels=("detector", "signal"),
)
ANOMALIES_LAST_TIMESTAMP = MetricSpec(
    "anomalies.last.timestamp", _G, Unit.SECONDS, "Unix time the last anomaly of this detector and signal began",
    labels=("detector", "signal"),
)
TRAIN_SPIKE_SCORE = MetricSpec(
    "train.spike_score", _G, Unit.RATIO,
    "OLMo 2 spike score: fraction of steps at least 7 sigma from the mean of the previous 1000 values",
    labels=("signal",), availability="After 1,000 steps (the spike detector's window) on a watched signal.",
)
TRAIN_IRREGULARITY = MetricSpec(
    "train.irregularity", _G, Unit.RATIO,
    "Share of the last 100 steps that took delta (1.5) times longer than the recent average (Holmes)",
    labels=("signal",), availability="When the delta detector watches step_time.",
)

# --- silent data corruption and instability (trainhealth.sdc, model signals) ---------------
SDC_SUSPECT = MetricSpec(
    "sdc.suspect", _G, Unit.DIMENSIONLESS,
    "1 while the last check found this rank computing different numbers from its peers, else 0; check is "
    "fingerprint (parameters differ from the other replicas) or grad_norm (local gradient norm far from the peers')",
    labels=("check",), availability="With torch.distributed initialised, from the first check step.",
)
SDC_CHECKS = MetricSpec(
    "sdc.checks", _C, Unit.EVENTS, "Cross-replica checks this rank took part in, by check",
    labels=("check",), availability="With torch.distributed initialised.",
)
SDC_MISMATCHES = MetricSpec(
    "sdc.mismatches", _C, Unit.EVENTS, "Cross-replica checks that found this rank in the minority, by check",
    labels=("check",), availability="With torch.distributed initialised.",
)
SDC_MISMATCHED_TENSORS = MetricSpec(
    "sdc.mismatched_tensors", _G, Unit.DIMENSIONLESS,
    "Parameter tensors whose fingerprint differed from the other replicas' at the last check (names in the "
    "sdc_suspect event)",
    availability="With torch.distributed initialised.",
)
TRAIN_LOCAL_GRAD_NORM = MetricSpec(
    "train.local_grad_norm", _G, Unit.DIMENSIONLESS,
    "This rank's gradient norm before the data-parallel all-reduce, on check steps",
    availability="With torch.distributed initialised; every grad_check_every steps.",
)
TRAIN_LOCAL_GRAD_NORM_PEER_RATIO = MetricSpec(
    "train.local_grad_norm.peer_ratio", _G, Unit.RATIO,
    "This rank's local gradient norm over the median of the other ranks'",
    availability="With torch.distributed initialised; every grad_check_every steps.",
)
TRAIN_NONFINITE_ORIGIN = MetricSpec(
    "train.nonfinite_origin", _C, Unit.STEPS,
    "Steps whose first non-finite activation (in forward order) came out of this block on this rank",
    labels=("block",), availability="With model signals on, after a non-finite value.",
)
TRAIN_NONFINITE_FIRST_STEP = MetricSpec(
    "train.nonfinite_origin.first_step", _G, Unit.DIMENSIONLESS,
    "Step at which this rank first produced a non-finite activation; the rank with the lowest value is the origin",
    availability="With model signals on, after a non-finite value.",
)
TRAIN_LOSS_SPIKE_UNRECOVERED = MetricSpec(
    "train.loss_spike.unrecovered", _G, Unit.DIMENSIONLESS,
    "1 when the last loss spike had not recovered 50 steps after it began, 0 when it had",
    availability="After a loss spike has been followed for 50 steps.",
)
TRAIN_LOSS_SPIKE_ONSET_STEP = MetricSpec(
    "train.loss_spike.onset_step", _G, Unit.DIMENSIONLESS, "Step at which the last followed loss spike began",
    availability="After a loss spike has been followed for 50 steps.",
)
TRAIN_LOSS_SPIKE_REWIND_STEP = MetricSpec(
    "train.loss_spike.rewind_step", _G, Unit.DIMENSIONLESS,
    "Step of the last checkpoint saved before the last unrecovered loss spike began: where to rewind to",
    availability="After an unrecovered loss spike, when Monitor.checkpoint_saved() reported an earlier checkpoint.",
)
MODEL_ATTENTION_MAX_LOGIT = MetricSpec(
    "model.attention.max_logit", _G, Unit.DIMENSIONLESS,
    "Largest attention logit q.k/sqrt(d) on a sampled slice (an upper bound for rotary q_proj/k_proj attention)",
    labels=("layer",), availability="With model signals on; every stats_every steps.",
)
MODEL_ATTENTION_ENTROPY = MetricSpec(
    "model.attention.entropy", _G, Unit.DIMENSIONLESS,
    "Mean entropy (nats) of the attention probabilities on a sampled slice; collapse towards 0 precedes "
    "instability", labels=("layer",),
    availability="With model signals on, for torch.nn.MultiheadAttention layers; every stats_every steps.",
)
MODEL_OUTPUT_LOG_Z = MetricSpec(
    "model.output.log_z", _G, Unit.DIMENSIONLESS,
    "Mean log-sum-exp of the output logits on a sampled slice (what z-loss keeps near 0)",
    availability="With model signals on and an output head found; every stats_every steps.",
)
MODEL_ACTIVATION_RMS = MetricSpec(
    "model.activation.rms", _G, Unit.DIMENSIONLESS, "Root mean square of a block's output activations",
    labels=("block",), availability="With model signals on; every stats_every steps.",
)
SELFTEST_PASSED = MetricSpec(
    "selftest.passed", _G, Unit.DIMENSIONLESS,
    "1 when the last self-test check on this device matched the golden reference, else 0",
    labels=("device", "check"), identity=("job", "host"),
    availability="From trainhealth selftest --metrics-file or Monitor.selftest().",
)
SELFTEST_ERROR = MetricSpec(
    "selftest.error", _G, Unit.DIMENSIONLESS,
    "Largest relative error of the last self-test check against the golden reference",
    labels=("device", "check"), identity=("job", "host"),
    availability="From trainhealth selftest --metrics-file or Monitor.selftest().",
)
SELFTEST_TIMESTAMP = MetricSpec(
    "selftest.timestamp", _G, Unit.SECONDS, "Unix time of the last self-test on this host",
    identity=("job", "host"), availability="From trainhealth selftest --metrics-file or Monitor.selftest().",
)

# --- checkpoints and goodput (Monitor.checkpoint_saved) -------------------------------------
CHECKPOINT_LAST_STEP = MetricSpec(
    "checkpoint.last.step", _G, Unit.DIMENSIONLESS, "Training step of the last checkpoint saved",
    availability="After the first Monitor.checkpoint_saved().",
)
CHECKPOINT_LAST_TIMESTAMP = MetricSpec(
    "checkpoint.last.timestamp", _G, Unit.SECONDS, "Unix time the last checkpoint was saved",
    availability="After the first Monitor.checkpoint_saved().",
)
CHECKPOINT_LAST_DURATION = MetricSpec(
    "checkpoint.last.duration", _G, Unit.SECONDS, "Time the last checkpoint took to save",
    availability="When Monitor.checkpoint_saved() is given a duration.",
)
CHECKPOINT_SAVES = MetricSpec(
    "checkpoint.saves", _C, Unit.EVENTS, "Checkpoints saved since the process started",
)
TRAIN_GOODPUT = MetricSpec(
    "train.goodput", _G, Unit.RATIO,
    "Share of the wall time since the process started that moved training forward (not startup, stalls or "
    "redone steps)",
)
TRAIN_LOST_TIME = MetricSpec(
    "train.lost_time", _C, Unit.SECONDS,
    "Wall time that did not move training forward, by reason: startup, stall, redone",
    labels=("reason",),
)
TRAIN_RESTARTS = MetricSpec(
    "train.restarts", _G, Unit.DIMENSIONLESS,
    "Times this job's workers were restarted (TORCHELASTIC_RESTART_COUNT, or the restarts setting)",
)

# --- localization (trainhealth analyze) ---------------------------------------------------
SUSPECT_SCORE = MetricSpec(
    "suspect.score", _G, Unit.DIMENSIONLESS,
    "Localization score of a suspect component, 0 to 1 (0.5 and more blames it); rank, host and gpu name "
    "the suspect (empty for a switch), kind is gpu, nic, host or switch",
    labels=("rank", "host", "gpu", "kind", "component"), identity=("job",),
    availability="From trainhealth analyze, while it names suspects.",
)
SUSPECT_SLOWDOWN = MetricSpec(
    "suspect.slowdown", _G, Unit.DIMENSIONLESS,
    "How many times as long the suspect computes as its peers (a GPU), or its transfers take as usual (a link), "
    "where the localizer measured it; labels as trainhealth_suspect_score",
    labels=("rank", "host", "gpu", "kind", "component"), identity=("job",),
    availability="From trainhealth analyze, while it names suspects measured from step markers and arrivals.",
)
SUSPECT_SINCE_STEP = MetricSpec(
    "suspect.since_step", _G, Unit.STEPS,
    "The training step at which the suspect's slowness began (the change point); absent when it was slow "
    "throughout the window",
    labels=("rank", "host", "gpu", "kind", "component"), identity=("job",),
    availability="From trainhealth analyze, while it names suspects with an onset.",
)
ANALYSIS_RANK_COMPUTE = MetricSpec(
    "analysis.rank.compute", _G, Unit.SECONDS,
    "Median seconds per step each rank of the analysed window spent computing (step time less the time blocked "
    "in collectives); the straggler computes longest",
    labels=("rank",), identity=("job",),
    availability="From trainhealth analyze over trace files with step markers or inferred iterations.",
)
ANALYSIS_RANK_WAIT = MetricSpec(
    "analysis.rank.wait", _G, Unit.SECONDS,
    "Median seconds per step each rank of the analysed window waited in collectives for later arrivals; the "
    "straggler waits least",
    labels=("rank",), identity=("job",),
    availability="From trainhealth analyze over trace files with step markers or inferred iterations.",
)
ANALYSIS_VERDICT = MetricSpec(
    "analysis.verdict", _G, Unit.DIMENSIONLESS,
    "1 for the verdict of the last localization (healthy, compute, communication, imbalance, insufficient_data), "
    "0 for the others",
    labels=("verdict",), availability="From trainhealth analyze.",
)
ANALYSIS_IRREGULAR_STEPS = MetricSpec(
    "analysis.irregular_steps", _G, Unit.STEPS,
    "Steps of the analysed window that took delta times the window's median step time",
    availability="From trainhealth analyze.",
)
ANALYSIS_RANKS = MetricSpec(
    "analysis.ranks", _G, Unit.DIMENSIONLESS, "Ranks seen in the analysed window",
    availability="From trainhealth analyze.",
)
ANALYSIS_DURATION = MetricSpec(
    "analysis.duration", _G, Unit.SECONDS, "Wall time of the last localization, reading its input included",
    availability="From trainhealth analyze.",
)
ANALYSIS_LAST_RUN_TIMESTAMP = MetricSpec(
    "analysis.last_run.timestamp", _G, Unit.SECONDS,
    "Unix time the last localization finished; an old value means the analyzer is stuck or has no input",
    availability="From trainhealth analyze.",
)

CATALOG: tuple[MetricSpec, ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, MetricSpec)
)
__all__ += [name for name, value in list(globals().items()) if isinstance(value, MetricSpec)]

_BY_PROMETHEUS_NAME = {spec.prometheus_name: spec for spec in CATALOG}
if len(_BY_PROMETHEUS_NAME) != len(CATALOG):
    raise ValueError("two catalogue entries share a Prometheus name")


def by_prometheus_name(name: str) -> MetricSpec:
    """The catalogue entry exported under ``name``; ``KeyError`` when there is none."""
    return _BY_PROMETHEUS_NAME[name]
