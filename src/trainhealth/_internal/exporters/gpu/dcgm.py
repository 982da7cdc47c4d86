"""DCGM profiling fields: SM active, tensor pipe active, DRAM active, PCIe and NVLink bytes.

These come from DCGM's profiling module, which NVML does not expose. They are
read through DCGM's own Python bindings (``DcgmReader``, shipped with the
datacenter-gpu-manager package, not on PyPI) from a running ``nv-hostengine``.
When either is missing, :class:`DcgmUnavailable` says so in one line and the
rest of the exporter carries on.

Users who also run dcgm-exporter can join its series with trainhealth's on the
GPU UUID: dcgm-exporter's ``UUID`` label equals ``uuid`` on
``trainhealth_gpu_info`` and ``gpu_uuid`` on ``trainhealth_rank_info``
(see docs/dcgm.md).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["BINDING_DIRECTORIES", "DcgmProfiler", "DcgmUnavailable"]

#: Where the datacenter-gpu-manager packages put the Python bindings (DCGM 4, then 3 and older).
BINDING_DIRECTORIES = (
    "/usr/share/datacenter-gpu-manager-4/bindings/python3",
    "/usr/local/dcgm/bindings/python3",
    "/usr/local/dcgm/bindings",
)

#: trainhealth field name -> DCGM field constant name.
_FIELDS = {
    "sm_active": "DCGM_FI_PROF_SM_ACTIVE",
    "tensor_active": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "dram_active": "DCGM_FI_PROF_DRAM_ACTIVE",
    "pcie_tx": "DCGM_FI_PROF_PCIE_TX_BYTES",
    "pcie_rx": "DCGM_FI_PROF_PCIE_RX_BYTES",
    "nvlink_tx": "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "nvlink_rx": "DCGM_FI_PROF_NVLINK_RX_BYTES",
}


class DcgmUnavailable(RuntimeError):
    """DCGM's bindings or host engine are not there; the message says which and what to do."""


def _import_bindings(directory: str | None) -> tuple[ModuleType, ModuleType]:
    candidates = [directory] if directory else list(BINDING_DIRECTORIES)
    for candidate in [None, *candidates]:  # None: already importable
        if candidate is not None:
            if not Path(candidate, "pydcgm.py").is_file():
                continue
            if candidate not in sys.path:
                sys.path.append(candidate)
        try:
            return importlib.import_module("dcgm_fields"), importlib.import_module("DcgmReader")
        except ImportError:
            continue
    where = directory or ", ".join(BINDING_DIRECTORIES)
    raise DcgmUnavailable(
        f"DCGM is not present: its Python bindings (pydcgm, DcgmReader) were not found in {where}; "
        "install NVIDIA's datacenter-gpu-manager package and run nv-hostengine for the profiling fields "
        "(SM, tensor and DRAM activity), or set TRAINHEALTH_DCGM_BINDINGS to the bindings directory"
    )


class DcgmProfiler:
    """Reads the profiling fields of every GPU from ``nv-hostengine`` at ``host``."""

    backend = "dcgm"

    def __init__(self, host: str = "localhost", bindings: str | None = None, interval_s: float = 5.0) -> None:
        dcgm_fields, reader_module = _import_bindings(bindings)
        self._field_ids = {name: getattr(dcgm_fields, constant) for name, constant in _FIELDS.items()}
        self._names = {field_id: name for name, field_id in self._field_ids.items()}
        self._reader = reader_module.DcgmReader(
            hostname=host,
            fieldIds=list(self._field_ids.values()),
            updateFrequency=int(interval_s * 1e6),
            fieldGroupName="trainhealth_profiling",
        )
        self._reader.Init()
        if getattr(self._reader, "m_dcgmHandle", None) is None:
            raise DcgmUnavailable(
                f"DCGM is not present: cannot connect to nv-hostengine at {host}; start it "
                "(nv-hostengine) or set TRAINHEALTH_DCGM_HOST"
            )

    def read(self, indices: Sequence[int]) -> dict[int, dict[str, float]]:
        """Latest profiling values of the GPUs with these indices (DCGM GPU ids follow NVML's order)."""
        latest: dict[int, dict[int, Any]] = self._reader.GetLatestGpuValuesAsFieldIdDict()
        wanted = set(indices)
        return {
            gpu_id: {
                self._names[field_id]: float(value) for field_id, value in fields.items() if field_id in self._names
            }
            for gpu_id, fields in latest.items()
            if gpu_id in wanted
        }

    def close(self) -> None:
        self._reader.Shutdown()
