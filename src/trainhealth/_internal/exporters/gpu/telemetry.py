"""GPU telemetry for one process, assembled from settings: backend, GPU choice, XIDs, DCGM.

Used by the Monitor (``role="rank"``: the rank's own GPU, no retries, no DCGM
unless asked) and by ``trainhealth export`` (``role="node"``: every GPU, NVML
initialisation retried until the driver is up, DCGM when present). The
simulated backend is used only when ``gpu_backend="simulated"`` is set; a
missing driver turns GPU metrics off with one message, never into a simulation.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, Literal

from trainhealth._internal.config import GpuSettings, Settings
from trainhealth._internal.events import EventLog
from trainhealth._internal.exporters.gpu.dcgm import DcgmProfiler, DcgmUnavailable
from trainhealth._internal.exporters.gpu.sampler import GpuSampler, GpuSelection
from trainhealth._internal.exporters.gpu.simulated import SimulatedNvml, SimulatedProfiler
from trainhealth._internal.exporters.gpu.xid_watcher import XidWatcher
from trainhealth._internal.identity import Identity
from trainhealth._internal.store import MetricStore

__all__ = ["GpuTelemetry", "own_gpu_selection"]

log = logging.getLogger(__name__)

Role = Literal["rank", "node"]


def own_gpu_selection(identity: Identity, env: Mapping[str, str], device_count: int | None = None) -> GpuSelection:
    """The GPU a rank trains on: by UUID when known, else its ``CUDA_VISIBLE_DEVICES`` entry, else ``local_rank``.

    >>> ident = Identity("j", "h", 5, 1, 8)
    >>> own_gpu_selection(ident, {"CUDA_VISIBLE_DEVICES": "4,5"})
    GpuSelection(indices=(5,), uuids=None)
    >>> own_gpu_selection(ident.with_gpu_uuid("GPU-abc"), {})
    GpuSelection(indices=None, uuids=('GPU-abc',))
    """
    if identity.gpu_uuid:
        return GpuSelection(uuids=(identity.gpu_uuid,))
    visible = [entry.strip() for entry in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if entry.strip()]
    if identity.local_rank < len(visible):
        entry = visible[identity.local_rank]
        if entry.isdigit():
            return GpuSelection(indices=(int(entry),))
        if entry.startswith("GPU-"):
            return GpuSelection(uuids=(entry,))
    index = identity.local_rank if device_count is None else identity.local_rank % device_count
    return GpuSelection(indices=(index,))


def _selection(
    gpu: GpuSettings, identity: Identity, env: Mapping[str, str], role: Role, simulated_count: int | None
) -> GpuSelection:
    spec = gpu.gpus.strip() or ("own" if role == "rank" else "all")
    if spec == "all":
        return GpuSelection.all()
    if spec == "own":
        if simulated_count is not None:  # simulated GPUs have their own UUIDs: choose by position
            return GpuSelection(indices=(identity.local_rank % simulated_count,))
        return own_gpu_selection(identity, env)
    return GpuSelection(indices=tuple(int(part) for part in spec.split(",")))


class GpuTelemetry:
    """The running sampler and XID watcher of one process. Build with :meth:`start`."""

    sampler: GpuSampler

    def __init__(self, store: MetricStore, events: EventLog, nvml: Any) -> None:
        self._store = store
        self._events = events
        self.nvml = nvml
        self.watcher: XidWatcher | None = None

    @classmethod
    def start(
        cls,
        store: MetricStore,
        events: EventLog,
        settings: Settings,
        identity: Identity,
        *,
        role: Role,
        env: Mapping[str, str] | None = None,
    ) -> GpuTelemetry | None:
        """Start sampling as ``settings`` says; ``None`` when ``gpu_backend`` is off."""
        env = os.environ if env is None else env
        gpu = settings.gpu
        if gpu.backend == "off":
            return None
        simulated = gpu.backend == "simulated"
        if simulated:
            nvml: Any = SimulatedNvml(gpus=gpu.simulated_gpus)
        else:
            import pynvml

            nvml = pynvml
        wants_dcgm = gpu.dcgm if gpu.dcgm is not None else role == "node"
        profiler: SimulatedProfiler | DcgmProfiler | None = None
        if wants_dcgm:
            if simulated:
                profiler = SimulatedProfiler(nvml)
            else:
                try:
                    profiler = DcgmProfiler(gpu.dcgm_host, gpu.dcgm_bindings, gpu.sample_interval)
                except DcgmUnavailable as exc:
                    log.warning("trainhealth: %s", exc)
                except Exception as exc:  # DCGM's bindings raise their own error types
                    log.warning("trainhealth: DCGM profiling fields are off: %s", exc)
        telemetry = cls(store, events, nvml)
        telemetry.sampler = GpuSampler(
            store,
            nvml,
            backend="simulated" if simulated else "nvml",
            selection=_selection(gpu, identity, env, role, gpu.simulated_gpus if simulated else None),
            interval_s=gpu.sample_interval,
            events=events,
            profiler=profiler,
            retry_init=role == "node",
            on_ready=telemetry._watch_xids,
        )
        telemetry.sampler.start()
        return telemetry

    def _watch_xids(self, gpus: list[tuple[int, Any, str]]) -> None:
        watcher = XidWatcher(
            self._store,
            self.nvml,
            gpus,
            backend=self.sampler.backend,
            events=self._events,
            on_xid=lambda index, xid: self.sampler.wake(),
        )
        if watcher.start():
            self.watcher = watcher

    @property
    def simulator(self) -> SimulatedNvml | None:
        """The simulated backend, for scripting faults; ``None`` on real hardware."""
        return self.nvml if isinstance(self.nvml, SimulatedNvml) else None

    @property
    def gpu_uuids(self) -> list[str]:
        return [uuid for _, _, uuid in self.sampler.gpus]

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.close()
            self.watcher = None
        self.sampler.close()
