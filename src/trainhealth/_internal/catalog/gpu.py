"""GPU hardware metrics: the NVML sampler, the XID watcher, DCGM profiling and the simulated backend.

Over OTLP, the metrics an OpenTelemetry hardware semantic convention covers go out under
its name (``hw.gpu.utilization``, ``hw.power``, ``hw.status`` ...) with ``hw.id="gpu<index>"``
and ``hw.type``; the others stay ``trainhealth.gpu.*``.
"""

from __future__ import annotations

from trainhealth._internal.catalog.otel import OtelAttribute, OtelInstrument, Semconv
from trainhealth._internal.catalog.spec import _C, _G, _I, MetricSpec, Unit

#: Every hardware series carries the GPU index and the backend that produced it:
#: ``nvml``, ``dcgm`` or ``simulated`` — simulated series can never pass for real ones.
GPU_LABELS: tuple[str, ...] = ("gpu", "backend")
_ECC_NOTE = "Needs ECC mode enabled."
_NVLINK_NOTE = "GPUs with NVLink; one series per link that answers."
_DCGM_NOTE = (
    "Only with the DCGM Python bindings and a reachable nv-hostengine (backend=dcgm), or the simulated backend."
)

# OpenTelemetry hardware conventions (docs/hardware/gpu.md, common.md, temperature.md, fan.md of
# open-telemetry/semantic-conventions): hw.id is unique within the host, hw.type names the component.
_HW_ID = OtelAttribute("gpu", "hw.id", "gpu{}")
_HW_PARENT = OtelAttribute("gpu", "hw.parent", "gpu{}")
_HW_GPU = (("hw.type", "gpu"),)
#: trainhealth's GPU states as the convention's hw.state: a GPU lost or waiting for a reset has
#: failed; one whose every NVML reading fails is degraded (it may still compute).
_HW_STATE = OtelAttribute(
    "state",
    "hw.state",
    values=(
        ("ok", "ok"),
        ("lost", "failed"),
        ("reset_required", "failed"),
        ("error", "degraded"),
    ),
)
_G_, _UDC = OtelInstrument.GAUGE, OtelInstrument.UP_DOWN_COUNTER


def _temperature_sensor(where: str) -> Semconv:
    return Semconv(
        "hw.temperature",
        _G_,
        "Cel",
        "Temperature in degrees Celsius.",
        attributes=(OtelAttribute("gpu", "hw.id", f"gpu{{}}_{where}_temperature"), _HW_PARENT),
        constants=(("hw.type", "temperature"), ("hw.sensor_location", f"GPU_{where.upper()}")),
    )


GPU_INFO = MetricSpec(
    "gpu",
    _I,
    Unit.DIMENSIONLESS,
    "Identity of a GPU: UUID (dcgm-exporter's UUID label), PCI bus id, model and driver",
    labels=GPU_LABELS + ("uuid", "pci_bus_id", "model", "driver_version"),
)
GPU_UP = MetricSpec(
    "gpu.up",
    _G,
    Unit.DIMENSIONLESS,
    "1 while the GPU answers NVML; 0 when it is lost, fell off the bus or needs a reset",
    labels=GPU_LABELS,
)
GPU_STATE = MetricSpec(
    "gpu.state",
    _G,
    Unit.DIMENSIONLESS,
    "1 for the GPU's current state (ok, lost, reset_required, error), 0 for the others",
    labels=GPU_LABELS + ("state",),
    semconv=Semconv(
        "hw.status",
        _UDC,
        "1",
        "Operational status: `1` (true) or `0` (false) for each of the possible states.",
        attributes=(_HW_ID, _HW_STATE),
        constants=_HW_GPU,
    ),
)
GPU_UTILIZATION = MetricSpec(
    "gpu.utilization",
    _G,
    Unit.RATIO,
    "Fraction of the last sample period in which a kernel ran",
    labels=GPU_LABELS,
    semconv=Semconv(
        "hw.gpu.utilization",
        _G_,
        "1",
        "Fraction of time spent in a specific task.",
        attributes=(_HW_ID,),
        constants=_HW_GPU + (("hw.gpu.task", "general"),),
    ),
)
GPU_MEMORY_BUSY = MetricSpec(
    "gpu.memory.busy",
    _G,
    Unit.RATIO,
    "Fraction of the last sample period in which device memory was read or written",
    labels=GPU_LABELS,
)
GPU_MEMORY_USED = MetricSpec(
    "gpu.memory.used",
    _G,
    Unit.BYTES,
    "Device memory in use",
    labels=GPU_LABELS,
    semconv=Semconv("hw.gpu.memory.usage", _UDC, "By", "GPU memory used.", attributes=(_HW_ID,), constants=_HW_GPU),
)
GPU_MEMORY_TOTAL = MetricSpec(
    "gpu.memory.total",
    _G,
    Unit.BYTES,
    "Device memory installed",
    labels=GPU_LABELS,
    semconv=Semconv(
        "hw.gpu.memory.limit", _UDC, "By", "Size of the GPU memory.", attributes=(_HW_ID,), constants=_HW_GPU
    ),
)
GPU_TEMPERATURE = MetricSpec(
    "gpu.temperature",
    _G,
    Unit.CELSIUS,
    "GPU die temperature",
    labels=GPU_LABELS,
    semconv=_temperature_sensor("die"),
)
GPU_MEMORY_TEMPERATURE = MetricSpec(
    "gpu.memory.temperature",
    _G,
    Unit.CELSIUS,
    "HBM temperature",
    labels=GPU_LABELS,
    availability="GPUs with HBM that report NVML_FI_DEV_MEMORY_TEMP.",
    semconv=_temperature_sensor("memory"),
)
GPU_POWER = MetricSpec(
    "gpu.power",
    _G,
    Unit.WATTS,
    "Power draw",
    labels=GPU_LABELS,
    semconv=Semconv(
        "hw.power", _G_, "W", "Instantaneous power consumed by the component.", attributes=(_HW_ID,), constants=_HW_GPU
    ),
)
GPU_POWER_LIMIT = MetricSpec("gpu.power_limit", _G, Unit.WATTS, "Enforced power limit", labels=GPU_LABELS)
GPU_ENERGY = MetricSpec(
    "gpu.energy",
    _C,
    Unit.JOULES,
    "Energy consumed since the driver was loaded",
    labels=GPU_LABELS,
    availability="Volta and newer.",
    semconv=Semconv(
        "hw.energy",
        OtelInstrument.COUNTER,
        "J",
        "Energy consumed by the component.",
        attributes=(_HW_ID,),
        constants=_HW_GPU,
    ),
)
GPU_CLOCK = MetricSpec(
    "gpu.clock",
    _G,
    Unit.HERTZ,
    "Current clock frequency (clock = sm or memory)",
    labels=GPU_LABELS + ("clock",),
)
GPU_CLOCK_MAX = MetricSpec(
    "gpu.clock.max",
    _G,
    Unit.HERTZ,
    "Maximum clock frequency (clock = sm or memory)",
    labels=GPU_LABELS + ("clock",),
)
GPU_CLOCKS_EVENT_ACTIVE = MetricSpec(
    "gpu.clocks_event.active",
    _G,
    Unit.DIMENSIONLESS,
    "1 while this clocks-event (throttle) reason holds the clocks down, else 0",
    labels=GPU_LABELS + ("reason",),
)
GPU_ECC_ERRORS = MetricSpec(
    "gpu.ecc.errors",
    _C,
    Unit.ERRORS,
    "ECC errors (error_type corrected or uncorrected; counter_type volatile since reset, or aggregate lifetime)",
    labels=GPU_LABELS + ("error_type", "counter_type"),
    availability=_ECC_NOTE,
    semconv=Semconv(
        "hw.errors",
        OtelInstrument.COUNTER,
        "{error}",
        "Number of errors encountered by the component.",
        attributes=(_HW_ID, OtelAttribute("error_type", "error.type")),
        constants=_HW_GPU,
    ),
)
GPU_RETIRED_PAGES = MetricSpec(
    "gpu.retired_pages",
    _G,
    Unit.DIMENSIONLESS,
    "Memory pages retired (cause multiple_single_bit or double_bit)",
    labels=GPU_LABELS + ("cause",),
    availability="Before Ampere; newer GPUs remap rows instead. " + _ECC_NOTE,
)
GPU_RETIRED_PAGES_PENDING = MetricSpec(
    "gpu.retired_pages.pending",
    _G,
    Unit.DIMENSIONLESS,
    "1 when a page retirement waits for the next reset",
    labels=GPU_LABELS,
    availability="Before Ampere. " + _ECC_NOTE,
)
GPU_REMAPPED_ROWS = MetricSpec(
    "gpu.remapped_rows",
    _G,
    Unit.DIMENSIONLESS,
    "Memory rows remapped (error_type correctable or uncorrectable)",
    labels=GPU_LABELS + ("error_type",),
    availability="Ampere and newer. " + _ECC_NOTE,
)
GPU_ROW_REMAP_PENDING = MetricSpec(
    "gpu.row_remap.pending",
    _G,
    Unit.DIMENSIONLESS,
    "1 when a row remap waits for the next GPU reset",
    labels=GPU_LABELS,
    availability="Ampere and newer. " + _ECC_NOTE,
)
GPU_ROW_REMAP_FAILURE = MetricSpec(
    "gpu.row_remap.failure",
    _G,
    Unit.DIMENSIONLESS,
    "1 when a row remap failed: the GPU needs service",
    labels=GPU_LABELS,
    availability="Ampere and newer. " + _ECC_NOTE,
)
GPU_PCIE_REPLAYS = MetricSpec(
    "gpu.pcie.replays",
    _C,
    Unit.EVENTS,
    "PCIe link replays (retransmissions)",
    labels=GPU_LABELS,
)
GPU_PCIE_THROUGHPUT = MetricSpec(
    "gpu.pcie.throughput",
    _G,
    Unit.BYTES_PER_SECOND,
    "PCIe traffic (direction tx or rx)",
    labels=GPU_LABELS + ("direction",),
    availability="Not on every GPU; with backend=dcgm it comes from DCGM's profiling counters.",
)
GPU_NVLINK_UP = MetricSpec(
    "gpu.nvlink.up",
    _G,
    Unit.DIMENSIONLESS,
    "1 while the NVLink link is active",
    labels=GPU_LABELS + ("link",),
    availability=_NVLINK_NOTE,
)
GPU_NVLINK_ERRORS = MetricSpec(
    "gpu.nvlink.errors",
    _C,
    Unit.ERRORS,
    "NVLink errors per link (error_type replay, recovery, crc_flit or crc_data)",
    labels=GPU_LABELS + ("link", "error_type"),
    availability=_NVLINK_NOTE,
)
GPU_NVLINK_THROUGHPUT = MetricSpec(
    "gpu.nvlink.throughput",
    _G,
    Unit.BYTES_PER_SECOND,
    "NVLink traffic (direction tx or rx)",
    labels=GPU_LABELS + ("direction",),
    availability=_DCGM_NOTE,
)
GPU_FAN_SPEED = MetricSpec(
    "gpu.fan_speed",
    _G,
    Unit.RATIO,
    "Fan speed as a fraction of its maximum",
    labels=GPU_LABELS,
    availability="Absent on passively cooled GPUs (most data-centre boards).",
    semconv=Semconv(
        "hw.fan.speed_ratio",
        _G_,
        "1",
        "Fan speed expressed as a fraction of its maximum speed.",
        attributes=(OtelAttribute("gpu", "hw.id", "gpu{}_fan"), _HW_PARENT),
        constants=(("hw.type", "fan"),),
    ),
)
GPU_PERFORMANCE_STATE = MetricSpec(
    "gpu.performance_state",
    _G,
    Unit.DIMENSIONLESS,
    "Performance state: 0 (P0, fastest) to 15 (slowest)",
    labels=GPU_LABELS,
)
GPU_RECOVERY_ACTION = MetricSpec(
    "gpu.recovery_action",
    _G,
    Unit.DIMENSIONLESS,
    "Recovery the driver requires: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset, "
    "5 recover IMEX domain, 6 bus reset, 7 system reboot",
    labels=GPU_LABELS,
    availability="Drivers that report NVML_FI_DEV_GET_GPU_RECOVERY_ACTION.",
)
GPU_XID_ERRORS = MetricSpec(
    "gpu.xid.errors",
    _C,
    Unit.ERRORS,
    "XID errors reported by the driver, every occurrence counted (repeats included)",
    labels=GPU_LABELS + ("xid",),
    availability="Appears with the first XID of a kind on that GPU.",
)
GPU_XID_LAST_TIMESTAMP = MetricSpec(
    "gpu.xid.last.timestamp",
    _G,
    Unit.SECONDS,
    "Unix time of the last XID of this kind on the GPU",
    labels=GPU_LABELS + ("xid",),
    availability="Appears with the first XID of a kind on that GPU.",
)
GPU_SM_ACTIVE = MetricSpec(
    "gpu.sm.active",
    _G,
    Unit.RATIO,
    "Fraction of cycles an SM had at least one warp resident (DCGM profiling)",
    labels=GPU_LABELS,
    availability=_DCGM_NOTE,
)
GPU_TENSOR_ACTIVE = MetricSpec(
    "gpu.tensor_pipe.active",
    _G,
    Unit.RATIO,
    "Fraction of cycles the tensor pipes were busy (DCGM profiling)",
    labels=GPU_LABELS,
    availability=_DCGM_NOTE,
)
GPU_DRAM_ACTIVE = MetricSpec(
    "gpu.dram.active",
    _G,
    Unit.RATIO,
    "Fraction of cycles device memory was transferring data (DCGM profiling)",
    labels=GPU_LABELS,
    availability=_DCGM_NOTE,
)
EXPORTER_GPU_BACKEND_UP = MetricSpec(
    "exporter.gpu_backend.up",
    _G,
    Unit.DIMENSIONLESS,
    "1 while the GPU backend (NVML, DCGM or the simulation) is initialised and sampling",
    labels=("backend",),
)
EXPORTER_GPU_SAMPLE_DURATION = MetricSpec(
    "exporter.gpu_sample.duration",
    _G,
    Unit.SECONDS,
    "Wall time of the last sampling pass over the GPUs",
    labels=("backend",),
)
EXPORTER_GPU_SAMPLE_TIMESTAMP = MetricSpec(
    "exporter.gpu_sample.timestamp",
    _G,
    Unit.SECONDS,
    "Unix time the last sampling pass finished; an old value means the sampler is stuck",
    labels=("backend",),
)
