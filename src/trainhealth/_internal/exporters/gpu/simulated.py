"""The simulated GPU backend: the NVML calls trainhealth makes, answered for GPUs that do not exist.

For the demo and for tests on machines without GPUs. :class:`SimulatedNvml`
has the same function names, arguments, return types and exceptions as
``pynvml`` (it returns pynvml's own ctypes structures and raises its
``NVMLError`` subclasses), so the sampler runs the same code on both. Faults
are scripted with :meth:`SimulatedNvml.inject`; what each does to the GPU is in
:mod:`~trainhealth._internal.exporters.gpu.simulated_device`. It is only ever used when
chosen explicitly (``gpu_backend="simulated"``), and everything it produces
carries ``backend="simulated"``; its UUIDs and model names say so too.

>>> import pynvml
>>> sim = SimulatedNvml(gpus=2)
>>> sim.nvmlInit()
>>> handle = sim.nvmlDeviceGetHandleByIndex(1)
>>> sim.nvmlDeviceGetUUID(handle), sim.nvmlDeviceGetName(handle)
('GPU-51a1a7ed-0000-4000-8000-000000000001', 'NVIDIA H100 80GB HBM3 (simulated)')
>>> sim.inject(SimulatedFault(SimulatedFaultKind.GPU_LOST, gpu=1))
>>> try:
...     sim.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
... except pynvml.NVMLError_GpuIsLost as error:
...     print(error)
GPU is lost
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

import pynvml

from trainhealth._internal.exporters.gpu.simulated_device import SimulatedFault, SimulatedFaultKind, SimulatedGpuState

__all__ = [
    "DEFAULT_UNSUPPORTED",
    "SimulatedFaultKind",
    "SimulatedFault",
    "SimulatedGpuHandle",
    "SimulatedNvml",
    "SimulatedProfiler",
]

#: What an H100 SXM answers NOT_SUPPORTED to: it has no fan and remaps rows instead of retiring pages.
DEFAULT_UNSUPPORTED = frozenset(
    {
        "nvmlDeviceGetFanSpeed",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRetiredPagesPendingStatus",
    }
)

_MIB = 1 << 20


@dataclass(frozen=True)
class SimulatedGpuHandle:
    """Stands where pynvml returns a ``c_nvmlDevice_t``."""

    index: int


def _nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class SimulatedNvml:
    """``gpus`` simulated H100-class GPUs answering the pynvml calls trainhealth makes.

    ``unsupported`` names pynvml functions that answer NOT_SUPPORTED;
    ``clock`` is the time source (seconds); ``seed`` makes the noise repeatable.
    ``calls`` counts every call by function name.
    """

    driver_version = "570.00 (simulated)"
    model = "NVIDIA H100 80GB HBM3 (simulated)"

    def __init__(
        self,
        gpus: int = 8,
        *,
        unsupported: Iterable[str] = DEFAULT_UNSUPPORTED,
        nvlinks: int = 18,
        seed: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if gpus < 1:
            raise ValueError("gpus must be >= 1")
        self._clock = clock
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._gpus = [SimulatedGpuState(i, nvlinks, clock()) for i in range(gpus)]
        self._unsupported = frozenset(unsupported)
        self._event_sets: list[tuple[queue.SimpleQueue, dict[int, int]]] = []
        self._initialized = 0
        self.calls: Counter[str] = Counter()

    # --- scripting ------------------------------------------------------------------
    def inject(self, fault: SimulatedFault) -> None:
        """Apply ``fault`` now; XIDs are also delivered to registered event sets."""
        with self._lock:
            self._gpu(fault.gpu).apply(fault)
        if fault.kind is SimulatedFaultKind.XID:
            self._deliver_xid(fault.gpu, int(cast(int, fault.xid)))

    def _deliver_xid(self, index: int, xid: int) -> None:
        with self._lock:
            targets = [
                events
                for events, masks in self._event_sets
                if masks.get(index, 0) & pynvml.nvmlEventTypeXidCriticalError
            ]
        for events in targets:
            events.put(
                SimpleNamespace(
                    device=SimulatedGpuHandle(index),
                    eventType=pynvml.nvmlEventTypeXidCriticalError,
                    eventData=xid,
                    gpuInstanceId=0,
                    computeInstanceId=0,
                )
            )

    # --- helpers --------------------------------------------------------------------
    def _gpu(self, index: int) -> SimulatedGpuState:
        if not 0 <= index < len(self._gpus):
            raise ValueError(f"no simulated GPU {index}; there are {len(self._gpus)}")
        return self._gpus[index]

    def _enter(self, name: str) -> None:
        """Count the call; raise what NVML raises before nvmlInit."""
        self.calls[name] += 1
        if not self._initialized:
            raise _nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)

    def _device(self, name: str, handle: Any) -> SimulatedGpuState:
        """Count the call and raise what NVML would for this device: unsupported, GPU lost."""
        self._enter(name)
        if not isinstance(handle, SimulatedGpuHandle):
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._gpus[handle.index]
        if gpu.lost is not None:
            raise _nvml_error(gpu.lost)
        if name in self._unsupported:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _noise(self, scale: float) -> float:
        return self._random.uniform(-scale, scale)

    def _utilization(self, gpu: SimulatedGpuState) -> float:
        return min(1.0, 0.95 * (0.6 if gpu.thermal else 1.0) + self._noise(0.03))

    def _power_mw(self, gpu: SimulatedGpuState) -> int:
        if gpu.power_capped:
            return 700_000 - int(abs(self._noise(2_000)))
        return int(380_000 + 260_000 * self._utilization(gpu) * gpu.clock_factor + self._noise(10_000))

    # --- system ---------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        self._initialized += 1

    def nvmlShutdown(self) -> None:
        self.calls["nvmlShutdown"] += 1
        self._initialized = max(0, self._initialized - 1)

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimulatedGpuHandle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self._gpus):
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return SimulatedGpuHandle(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> SimulatedGpuHandle:
        self._enter("nvmlDeviceGetHandleByUUID")
        for gpu in self._gpus:
            if _uuid(gpu.index) == uuid:
                return SimulatedGpuHandle(gpu.index)
        raise _nvml_error(pynvml.NVML_ERROR_NOT_FOUND)

    # --- identity -------------------------------------------------------------------
    def nvmlDeviceGetIndex(self, handle: SimulatedGpuHandle) -> int:
        return self._device("nvmlDeviceGetIndex", handle).index

    def nvmlDeviceGetUUID(self, handle: SimulatedGpuHandle) -> str:
        return _uuid(self._device("nvmlDeviceGetUUID", handle).index)

    def nvmlDeviceGetName(self, handle: SimulatedGpuHandle) -> str:
        self._device("nvmlDeviceGetName", handle)
        return self.model

    def nvmlDeviceGetPciInfo(self, handle: SimulatedGpuHandle) -> Any:
        gpu = self._device("nvmlDeviceGetPciInfo", handle)
        info = pynvml.nvmlPciInfo_t()
        info.busId = f"00000000:{0x18 + 0x10 * gpu.index:02X}:00.0".encode()
        return info

    # --- sensors --------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, handle: SimulatedGpuHandle) -> Any:
        gpu = self._device("nvmlDeviceGetUtilizationRates", handle)
        rates = pynvml.c_nvmlUtilization_t()
        utilization = self._utilization(gpu)
        rates.gpu = round(100 * utilization)
        rates.memory = round(100 * 0.6 * utilization)
        return rates

    def nvmlDeviceGetMemoryInfo(self, handle: SimulatedGpuHandle, version: Any = None) -> Any:
        self._device("nvmlDeviceGetMemoryInfo", handle)
        memory = pynvml.c_nvmlMemory_t()
        memory.total = 81_559 * _MIB
        memory.used = (62_000 + int(self._noise(500))) * _MIB
        memory.free = memory.total - memory.used
        return memory

    def nvmlDeviceGetTemperature(self, handle: SimulatedGpuHandle, sensor: int) -> int:
        gpu = self._device("nvmlDeviceGetTemperature", handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 91 if gpu.thermal else round(52 + 10 * self._utilization(gpu) + gpu.index * 0.5 + self._noise(1.0))

    def nvmlDeviceGetFieldValues(self, handle: SimulatedGpuHandle, field_ids: list[int]) -> Any:
        gpu = self._device("nvmlDeviceGetFieldValues", handle)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for value, field_id in zip(values, field_ids):
            value.fieldId = field_id
            value.timestamp = int(self._clock() * 1e6)
            value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
            if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP:
                value.nvmlReturn = pynvml.NVML_SUCCESS
                value.value.uiVal = 95 if gpu.thermal else 64 + gpu.index % 3
            elif field_id == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
                value.nvmlReturn = pynvml.NVML_SUCCESS
                value.value.uiVal = gpu.recovery_action
            else:
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetPowerUsage(self, handle: SimulatedGpuHandle) -> int:
        return self._power_mw(self._device("nvmlDeviceGetPowerUsage", handle))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: SimulatedGpuHandle) -> int:
        self._device("nvmlDeviceGetEnforcedPowerLimit", handle)
        return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: SimulatedGpuHandle) -> int:
        gpu = self._device("nvmlDeviceGetTotalEnergyConsumption", handle)
        with self._lock:
            now = self._clock()
            gpu.energy_mj += int(self._power_mw(gpu) * max(0.0, now - gpu.energy_at))
            gpu.energy_at = now
            return gpu.energy_mj

    def _clock_mhz(self, gpu: SimulatedGpuState, clock: int, maximum: bool) -> int:
        if clock == pynvml.NVML_CLOCK_MEM:
            return 2619
        if clock not in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if maximum:
            return 1980
        factor = gpu.clock_factor * (0.6 if gpu.thermal else 1.0) * (0.85 if gpu.power_capped else 1.0)
        return int(1980 * factor)

    def nvmlDeviceGetClockInfo(self, handle: SimulatedGpuHandle, clock: int) -> int:
        return self._clock_mhz(self._device("nvmlDeviceGetClockInfo", handle), clock, maximum=False)

    def nvmlDeviceGetMaxClockInfo(self, handle: SimulatedGpuHandle, clock: int) -> int:
        return self._clock_mhz(self._device("nvmlDeviceGetMaxClockInfo", handle), clock, maximum=True)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: SimulatedGpuHandle) -> int:
        gpu = self._device("nvmlDeviceGetCurrentClocksEventReasons", handle)
        reasons = 0
        if gpu.thermal:
            reasons |= pynvml.nvmlClocksEventReasonHwThermalSlowdown | pynvml.nvmlClocksEventReasonSwThermalSlowdown
        if gpu.power_capped:
            reasons |= pynvml.nvmlClocksEventReasonSwPowerCap
        if gpu.clock_factor < 1.0:
            reasons |= pynvml.nvmlClocksEventReasonHwSlowdown
        return reasons

    def nvmlDeviceGetPerformanceState(self, handle: SimulatedGpuHandle) -> int:
        self._device("nvmlDeviceGetPerformanceState", handle)
        return 0

    def nvmlDeviceGetFanSpeed(self, handle: SimulatedGpuHandle) -> int:
        self._device("nvmlDeviceGetFanSpeed", handle)
        return 45

    # --- memory errors --------------------------------------------------------------
    def nvmlDeviceGetTotalEccErrors(self, handle: SimulatedGpuHandle, error_type: int, counter_type: int) -> int:
        gpu = self._device("nvmlDeviceGetTotalEccErrors", handle)
        return gpu.ecc[(error_type, counter_type)]

    def nvmlDeviceGetRetiredPages(self, handle: SimulatedGpuHandle, cause: int) -> list[int]:
        self._device("nvmlDeviceGetRetiredPages", handle)
        return []

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: SimulatedGpuHandle) -> int:
        self._device("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        return pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, handle: SimulatedGpuHandle) -> tuple[int, int, int, int]:
        gpu = self._device("nvmlDeviceGetRemappedRows", handle)
        return gpu.remapped[0], gpu.remapped[1], gpu.remap_pending, gpu.remap_failure

    # --- interconnect ---------------------------------------------------------------
    def nvmlDeviceGetPcieReplayCounter(self, handle: SimulatedGpuHandle) -> int:
        return self._device("nvmlDeviceGetPcieReplayCounter", handle).pcie_replays

    def nvmlDeviceGetPcieThroughput(self, handle: SimulatedGpuHandle, counter: int) -> int:
        self._device("nvmlDeviceGetPcieThroughput", handle)
        base = 1_200_000 if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else 2_400_000  # KB/s
        return int(base * (1 + self._noise(0.1)))

    def nvmlDeviceGetNvLinkState(self, handle: SimulatedGpuHandle, link: int) -> int:
        gpu = self._device("nvmlDeviceGetNvLinkState", handle)
        if not 0 <= link < len(gpu.nvlink_active):
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.nvlink_active[link]

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: SimulatedGpuHandle, link: int, counter: int) -> int:
        gpu = self._device("nvmlDeviceGetNvLinkErrorCounter", handle)
        try:
            return gpu.nvlink_errors[(link, counter)]
        except KeyError:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT) from None

    # --- events ---------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> Any:
        self._enter("nvmlEventSetCreate")
        event_set: tuple[queue.SimpleQueue, dict[int, int]] = (queue.SimpleQueue(), {})
        with self._lock:
            self._event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(self, handle: SimulatedGpuHandle, event_types: int, event_set: Any) -> None:
        gpu = self._device("nvmlDeviceRegisterEvents", handle)
        with self._lock:
            event_set[1][gpu.index] = event_set[1].get(gpu.index, 0) | event_types

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any:
        self._enter("nvmlEventSetWait")
        try:
            return event_set[0].get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise _nvml_error(pynvml.NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self.calls["nvmlEventSetFree"] += 1
        with self._lock:
            self._event_sets = [s for s in self._event_sets if s is not event_set]

    # --- DCGM-style profiling counters -----------------------------------------------
    def profiling_sample(self, index: int) -> dict[str, float]:
        """What DCGM's profiling fields would read for GPU ``index`` (see :class:`SimulatedProfiler`)."""
        with self._lock:
            gpu = self._gpu(index)
            if gpu.lost is not None:
                return {}
            busy = self._utilization(gpu) * gpu.clock_factor
            return {
                "sm_active": 0.85 * busy,
                "tensor_active": 0.55 * busy,
                "dram_active": 0.40 * busy,
                "pcie_tx": 1.1e9 * busy,
                "pcie_rx": 2.3e9 * busy,
                "nvlink_tx": 120e9 * busy,
                "nvlink_rx": 120e9 * busy,
            }


def _uuid(index: int) -> str:
    """A UUID of the usual shape whose first group reads 'simulated' (51a1a7ed)."""
    return f"GPU-51a1a7ed-0000-4000-8000-{index:012x}"


class SimulatedProfiler:
    """Profiling counters for a :class:`SimulatedNvml`, with the interface of the DCGM profiler."""

    backend = "simulated"

    def __init__(self, nvml: SimulatedNvml) -> None:
        self._nvml = nvml

    def read(self, indices: Iterable[int]) -> dict[int, dict[str, float]]:
        return {index: self._nvml.profiling_sample(index) for index in indices}

    def close(self) -> None:
        pass
