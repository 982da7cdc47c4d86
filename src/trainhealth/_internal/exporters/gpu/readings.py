"""One function per NVML reading: the calls made, the unit conversions, the catalogue metric.

Each reading takes the NVML module (``pynvml`` or the simulated backend) and a
device handle and returns ``(metric, extra labels, value)`` triples in base
units. A reading is the unit that is remembered as NOT_SUPPORTED: one failed
call skips that reading, and only that reading, on that GPU from then on.

>>> from trainhealth._internal.exporters.gpu.simulated import SimulatedNvml
>>> sim = SimulatedNvml(gpus=1)
>>> sim.nvmlInit()
>>> [(spec.prometheus_name, labels, value) for spec, labels, value in power_limit(sim, sim.nvmlDeviceGetHandleByIndex(0))]
[('trainhealth_gpu_power_limit_watts', (), 700.0)]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml

from trainhealth._internal import catalog
from trainhealth._internal.catalog import MetricSpec

__all__ = ["CLOCKS_EVENT_REASONS", "NVLINK_ERROR_COUNTERS", "READINGS", "Reading", "field_value"]

Triple = tuple[MetricSpec, tuple[str, ...], float]
Reading = Callable[[Any, Any], list[Triple]]

_MHZ = 1e6
_KIB = 1024.0

#: Label value -> NVML clocks-event reason bit (the bits formerly called throttle reasons).
CLOCKS_EVENT_REASONS: dict[str, int] = {
    "gpu_idle": pynvml.nvmlClocksEventReasonGpuIdle,
    "applications_clocks_setting": pynvml.nvmlClocksEventReasonApplicationsClocksSetting,
    "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
    "sw_thermal_slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "hw_power_brake_slowdown": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    "display_clock_setting": pynvml.nvmlClocksEventReasonDisplayClockSetting,
}

#: Label value -> NVML NVLink error counter.
NVLINK_ERROR_COUNTERS: dict[str, int] = {
    "replay": pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
    "recovery": pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
    "crc_flit": pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
    "crc_data": pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
}

_VALUE_MEMBERS = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


def field_value(nvml: Any, handle: Any, field_id: int) -> float:
    """One NVML field value as a number; raises the field's own NVML error when it has one."""
    (value,) = nvml.nvmlDeviceGetFieldValues(handle, [field_id])
    if value.nvmlReturn != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(value.nvmlReturn)
    return float(getattr(value.value, _VALUE_MEMBERS.get(value.valueType, "ullVal")))


def utilization(nvml: Any, handle: Any) -> list[Triple]:
    rates = nvml.nvmlDeviceGetUtilizationRates(handle)
    return [(catalog.GPU_UTILIZATION, (), rates.gpu / 100.0), (catalog.GPU_MEMORY_BUSY, (), rates.memory / 100.0)]


def memory(nvml: Any, handle: Any) -> list[Triple]:
    info = nvml.nvmlDeviceGetMemoryInfo(handle)
    return [(catalog.GPU_MEMORY_USED, (), float(info.used)), (catalog.GPU_MEMORY_TOTAL, (), float(info.total))]


def temperature(nvml: Any, handle: Any) -> list[Triple]:
    return [(catalog.GPU_TEMPERATURE, (), float(nvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)))]


def memory_temperature(nvml: Any, handle: Any) -> list[Triple]:
    return [(catalog.GPU_MEMORY_TEMPERATURE, (), field_value(nvml, handle, pynvml.NVML_FI_DEV_MEMORY_TEMP))]


def power(nvml: Any, handle: Any) -> list[Triple]:
    return [(catalog.GPU_POWER, (), nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)]


def power_limit(nvml: Any, handle: Any) -> list[Triple]:
    return [(catalog.GPU_POWER_LIMIT, (), nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0)]


def energy(nvml: Any, handle: Any) -> list[Triple]:
    return [(catalog.GPU_ENERGY, (), nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0)]


def clocks(nvml: Any, handle: Any) -> list[Triple]:
    return [
        (catalog.GPU_CLOCK, ("sm",), nvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) * _MHZ),
        (catalog.GPU_CLOCK, ("memory",), nvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM) * _MHZ),
    ]


def max_clocks(nvml: Any, handle: Any) -> list[Triple]:
    return [
        (catalog.GPU_CLOCK_MAX, ("sm",), nvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM) * _MHZ),
        (catalog.GPU_CLOCK_MAX, ("memory",), nvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM) * _MHZ),
    ]


def clocks_events(nvml: Any, handle: Any) -> list[Triple]:
    mask = nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    return [
        (catalog.GPU_CLOCKS_EVENT_ACTIVE, (reason,), 1.0 if mask & bit else 0.0)
        for reason, bit in CLOCKS_EVENT_REASONS.items()
    ]


def ecc_errors(nvml: Any, handle: Any) -> list[Triple]:
    out: list[Triple] = []
    for error_name, error_type in (
        ("corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
        ("uncorrected", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
    ):
        for counter_name, counter_type in (
            ("volatile", pynvml.NVML_VOLATILE_ECC),
            ("aggregate", pynvml.NVML_AGGREGATE_ECC),
        ):
            count = nvml.nvmlDeviceGetTotalEccErrors(handle, error_type, counter_type)
            out.append((catalog.GPU_ECC_ERRORS, (error_name, counter_name), float(count)))
    return out


def retired_pages(nvml: Any, handle: Any) -> list[Triple]:
    causes = (
        ("multiple_single_bit", pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
        ("double_bit", pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
    )
    return [
        (catalog.GPU_RETIRED_PAGES, (name,), float(len(nvml.nvmlDeviceGetRetiredPages(handle, cause))))
        for name, cause in causes
    ]


def retired_pages_pending(nvml: Any, handle: Any) -> list[Triple]:
    pending = nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle) == pynvml.NVML_FEATURE_ENABLED
    return [(catalog.GPU_RETIRED_PAGES_PENDING, (), 1.0 if pending else 0.0)]


def remapped_rows(nvml: Any, handle: Any) -> list[Triple]:
    correctable, uncorrectable, pending, failure = nvml.nvmlDeviceGetRemappedRows(handle)
    return [
        (catalog.GPU_REMAPPED_ROWS, ("correctable",), float(correctable)),
        (catalog.GPU_REMAPPED_ROWS, ("uncorrectable",), float(uncorrectable)),
        (catalog.GPU_ROW_REMAP_PENDING, (), 1.0 if pending else 0.0),
        (catalog.GPU_ROW_REMAP_FAILURE, (), 1.0 if failure else 0.0),
    ]


def pcie_replays(nvml: Any, handle: Any) -> list[Triple]:
    return [(catalog.GPU_PCIE_REPLAYS, (), float(nvml.nvmlDeviceGetPcieReplayCounter(handle)))]


def pcie_throughput(nvml: Any, handle: Any) -> list[Triple]:
    # NVML samples each direction over 20 ms and answers in KB/s.
    return [
        (
            catalog.GPU_PCIE_THROUGHPUT,
            ("tx",),
            nvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_TX_BYTES) * _KIB,
        ),
        (
            catalog.GPU_PCIE_THROUGHPUT,
            ("rx",),
            nvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_RX_BYTES) * _KIB,
        ),
    ]


def fan_speed(nvml: Any, handle: Any) -> list[Triple]:
    return [(catalog.GPU_FAN_SPEED, (), nvml.nvmlDeviceGetFanSpeed(handle) / 100.0)]


def performance_state(nvml: Any, handle: Any) -> list[Triple]:
    return [(catalog.GPU_PERFORMANCE_STATE, (), float(nvml.nvmlDeviceGetPerformanceState(handle)))]


def recovery_action(nvml: Any, handle: Any) -> list[Triple]:
    return [(catalog.GPU_RECOVERY_ACTION, (), field_value(nvml, handle, pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION))]


#: Every per-GPU reading but NVLink (which is per link), in sampling order.
READINGS: tuple[tuple[str, Reading], ...] = (
    ("utilization", utilization),
    ("memory", memory),
    ("temperature", temperature),
    ("memory_temperature", memory_temperature),
    ("power", power),
    ("power_limit", power_limit),
    ("energy", energy),
    ("clocks", clocks),
    ("max_clocks", max_clocks),
    ("clocks_events", clocks_events),
    ("ecc_errors", ecc_errors),
    ("retired_pages", retired_pages),
    ("retired_pages_pending", retired_pages_pending),
    ("remapped_rows", remapped_rows),
    ("pcie_replays", pcie_replays),
    ("pcie_throughput", pcie_throughput),
    ("fan_speed", fan_speed),
    ("performance_state", performance_state),
    ("recovery_action", recovery_action),
)
