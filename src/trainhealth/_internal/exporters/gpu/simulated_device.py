"""One simulated GPU's mutable state, and what each scripted fault does to it.

The state behind :class:`~trainhealth._internal.exporters.gpu.simulated.SimulatedNvml`:
faults are declared as :class:`SimulatedFault` and applied with
:meth:`SimulatedGpuState.apply`, which changes the counters and flags the
simulated NVML calls then read.

>>> gpu = SimulatedGpuState(0, nvlinks=2, now=0.0)
>>> gpu.apply(SimulatedFault(SimulatedFaultKind.XID, gpu=0, xid=48))
>>> gpu.remapped, gpu.remap_pending
([0, 1], 1)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import cast

import pynvml

__all__ = ["SimulatedFault", "SimulatedFaultKind", "SimulatedGpuState"]


class SimulatedFaultKind(str, Enum):
    XID = "xid"
    ECC_UNCORRECTABLE = "ecc_uncorrectable"
    ECC_CORRECTABLE = "ecc_correctable"
    ROW_REMAP_FAILURE = "row_remap_failure"
    THERMAL_THROTTLE = "thermal_throttle"
    POWER_THROTTLE = "power_throttle"
    SLOW_CLOCKS = "slow_clocks"
    GPU_LOST = "gpu_lost"
    RESET_REQUIRED = "reset_required"
    RECOVER = "recover"
    PCIE_REPLAYS = "pcie_replays"
    NVLINK_CRC = "nvlink_crc"
    NVLINK_DOWN = "nvlink_down"


@dataclass(frozen=True)
class SimulatedFault:
    """One scripted fault on simulated GPU ``gpu``.

    ``xid`` for XID faults; ``count`` for counted errors; ``link`` for NVLink
    faults; ``active=False`` ends a throttle or slow-clock condition;
    ``factor`` is the clock fraction left by ``SLOW_CLOCKS``.
    """

    kind: SimulatedFaultKind
    gpu: int
    xid: int | None = None
    count: int = 1
    link: int = 0
    active: bool = True
    factor: float = 0.5

    def __post_init__(self) -> None:
        if self.kind is SimulatedFaultKind.XID and self.xid is None:
            raise ValueError("an XID fault needs xid")
        if self.count < 1:
            raise ValueError("count must be >= 1")
        if not 0 < self.factor <= 1:
            raise ValueError("factor must be in (0, 1]")


class SimulatedGpuState:
    """The mutable state of one simulated GPU; the caller holds the lock that guards it."""

    def __init__(self, index: int, nvlinks: int, now: float) -> None:
        self.index = index
        self.lost: int | None = None  # NVML error code while the GPU does not answer
        self.thermal = False
        self.power_capped = False
        self.clock_factor = 1.0
        self.ecc = {(e, c): 0 for e in (0, 1) for c in (0, 1)}  # (error type, counter type) -> count
        self.remapped = [0, 0]  # correctable, uncorrectable
        self.remap_pending = 0
        self.remap_failure = 0
        self.pcie_replays = 0
        self.nvlink_active = [1] * nvlinks
        self.nvlink_errors = {(link, kind): 0 for link in range(nvlinks) for kind in range(4)}
        self.recovery_action = 0
        self.energy_mj = 0
        self.energy_at = now

    def apply(self, fault: SimulatedFault) -> None:
        """Change the state as ``fault`` would; delivering an XID event is the backend's part."""
        kind = fault.kind
        if kind is SimulatedFaultKind.XID:
            self._xid_side_effects(int(cast(int, fault.xid)))
        elif kind is SimulatedFaultKind.ECC_UNCORRECTABLE:
            self._count_ecc(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, fault.count)
        elif kind is SimulatedFaultKind.ECC_CORRECTABLE:
            self._count_ecc(pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, fault.count)
        elif kind is SimulatedFaultKind.ROW_REMAP_FAILURE:
            self.remap_failure = 1
        elif kind is SimulatedFaultKind.THERMAL_THROTTLE:
            self.thermal = fault.active
        elif kind is SimulatedFaultKind.POWER_THROTTLE:
            self.power_capped = fault.active
        elif kind is SimulatedFaultKind.SLOW_CLOCKS:
            self.clock_factor = fault.factor if fault.active else 1.0
        elif kind is SimulatedFaultKind.GPU_LOST:
            self.lost = pynvml.NVML_ERROR_GPU_IS_LOST
        elif kind is SimulatedFaultKind.RESET_REQUIRED:
            self.lost = pynvml.NVML_ERROR_RESET_REQUIRED
        elif kind is SimulatedFaultKind.RECOVER:
            self._reset()
        elif kind is SimulatedFaultKind.PCIE_REPLAYS:
            self.pcie_replays += fault.count
        elif kind is SimulatedFaultKind.NVLINK_CRC:
            self.nvlink_errors[(fault.link, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT)] += fault.count
            self.nvlink_errors[(fault.link, pynvml.NVML_NVLINK_ERROR_DL_REPLAY)] += fault.count
        elif kind is SimulatedFaultKind.NVLINK_DOWN:
            self.nvlink_active[fault.link] = 0 if fault.active else 1

    def _count_ecc(self, error_type: int, count: int) -> None:
        for counter_type in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC):
            self.ecc[(error_type, counter_type)] += count

    def _xid_side_effects(self, xid: int) -> None:
        """What the hardware behind each XID also shows in the counters."""
        uncorrected = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        if xid == 48:
            self._count_ecc(uncorrected, 1)
            self.remapped[1] += 1
            self.remap_pending = 1
        elif xid == 63:
            self.remapped[0] += 1
            self.remap_pending = 1
        elif xid == 64:
            self.remap_failure = 1
        elif xid == 74:
            self.nvlink_errors[(0, pynvml.NVML_NVLINK_ERROR_DL_REPLAY)] += 1
        elif xid == 79:
            self.lost = pynvml.NVML_ERROR_GPU_IS_LOST
        elif xid == 92:
            self._count_ecc(pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, 100)
        elif xid == 94:
            self._count_ecc(uncorrected, 1)
        elif xid == 95:
            self._count_ecc(uncorrected, 1)
            self.lost = pynvml.NVML_ERROR_RESET_REQUIRED
            self.recovery_action = 1
        elif xid == 154:
            self.recovery_action = self.recovery_action or 1

    def _reset(self) -> None:
        """A GPU reset: it answers again, volatile counters and pending remaps clear."""
        self.lost = None
        self.remap_pending = 0
        self.recovery_action = 0
        for error_type in (0, 1):
            self.ecc[(error_type, pynvml.NVML_VOLATILE_ECC)] = 0
