"""The GPU sampler: NVML readings on a background thread into the metric store.

A scrape never calls NVML: it reads what the last pass wrote. Per GPU, a
reading answering NOT_SUPPORTED (or no permission) is remembered and skipped;
a GPU that is lost or needs a reset keeps its series — ``trainhealth_gpu_up`` 0,
``trainhealth_gpu_state`` naming why, its gauges NaN — while the other GPUs
are served as before, and is probed every pass until it answers again.

>>> from trainhealth._internal.exporters.gpu.simulated import SimulatedNvml
>>> from trainhealth._internal.store import MetricStore
>>> from trainhealth._internal import catalog
>>> store = MetricStore()
>>> sampler = GpuSampler(store, SimulatedNvml(gpus=2), backend="simulated")
>>> sampler.start(thread=False)
True
>>> store.value(catalog.GPU_UP, ("1", "simulated")), store.value(catalog.GPU_POWER_LIMIT, ("0", "simulated"))
(1.0, 700.0)
>>> sampler.close()
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from trainhealth._internal import catalog
from trainhealth._internal.catalog import MetricSpec
from trainhealth._internal.events import Event, EventLog, Severity
from trainhealth._internal.exporters.gpu.readings import NVLINK_ERROR_COUNTERS, READINGS, Triple
from trainhealth._internal.knowledge.xid import recovery_action_advice
from trainhealth._internal.store import MetricStore

__all__ = ["GPU_STATES", "GpuSampler", "GpuSelection", "handle_key"]

log = logging.getLogger(__name__)

GPU_STATES = ("ok", "lost", "reset_required", "error")
_LOST_CODES = {pynvml.NVML_ERROR_GPU_IS_LOST: "lost", pynvml.NVML_ERROR_RESET_REQUIRED: "reset_required"}
_SKIP_CODES = {pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NO_PERMISSION, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND}
_NOT_A_LINK = {
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_INVALID_ARGUMENT,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
}


def handle_key(handle: Any) -> Any:
    """A hashable key for an NVML device handle: its address for pynvml's ctypes pointers."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


@dataclass(frozen=True)
class GpuSelection:
    """Which GPUs to watch: all of them, these NVML indices, or these UUIDs."""

    indices: tuple[int, ...] | None = None
    uuids: tuple[str, ...] | None = None

    @classmethod
    def all(cls) -> GpuSelection:
        return cls()


@dataclass
class _Gpu:
    index: int
    handle: Any
    uuid: str
    labels: tuple[str, str]
    state: str = "ok"
    unsupported: set[str] = field(default_factory=set)
    links: tuple[int, ...] | None = None
    gauges: set[tuple[MetricSpec, tuple[str, ...]]] = field(default_factory=set)
    recovery_action: float = 0.0


class GpuSampler:
    """Samples the selected GPUs every ``interval_s`` seconds on a daemon thread.

    ``nvml`` is the ``pynvml`` module or a :class:`~trainhealth._internal.exporters.gpu.simulated.SimulatedNvml`;
    ``backend`` labels every series (``nvml`` or ``simulated``). ``profiler``
    optionally adds DCGM profiling fields. With ``retry_init`` a failed NVML
    initialisation is retried every pass (a node exporter waiting for its
    driver); without it the sampler stays off after one clear message.
    ``on_ready`` is called once with the watched GPUs after discovery.
    """

    def __init__(
        self,
        store: MetricStore,
        nvml: Any,
        *,
        backend: str = "nvml",
        selection: GpuSelection = GpuSelection(),
        interval_s: float = 5.0,
        events: EventLog | None = None,
        profiler: Any = None,
        retry_init: bool = False,
        on_ready: Callable[[list[tuple[int, Any, str]]], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self._store = store
        self._nvml = nvml
        self.backend = backend
        self._selection = selection
        self._interval = interval_s
        self._events = events
        self._profiler = profiler
        self._retry_init = retry_init
        self._on_ready = on_ready
        self._clock = clock
        self._gpus: list[_Gpu] = []
        self._initialized = False
        self._init_reported = False
        self._lock = threading.Lock()  # one pass at a time
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.unavailable_reason: str | None = None

    # --- lifecycle ------------------------------------------------------------------
    def start(self, *, thread: bool = True) -> bool:
        """Initialise NVML, discover the GPUs, sample once, then keep sampling on a thread.

        Returns whether NVML answered. Never raises for a missing driver or library.
        """
        self.sample_once()
        if thread and (self._initialized or self._retry_init):
            self._thread = threading.Thread(target=self._run, name="trainhealth-gpu-sampler", daemon=True)
            self._thread.start()
        return self._initialized

    def close(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._profiler is not None:
            self._profiler.close()
        if self._initialized:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                log.debug("trainhealth: nvmlShutdown failed", exc_info=True)
            self._initialized = False

    def wake(self) -> None:
        """Sample now instead of at the next interval (an XID just arrived)."""
        self._wake.set()

    @property
    def gpus(self) -> list[tuple[int, Any, str]]:
        """``(index, handle, uuid)`` of every watched GPU."""
        return [(gpu.index, gpu.handle, gpu.uuid) for gpu in self._gpus]

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._stopping:
                return
            try:
                self.sample_once()
            except Exception as exc:  # the sampler thread must survive anything
                self._store.record_error("gpu_sampler", exc)

    # --- initialisation -------------------------------------------------------------
    def _initialize(self) -> bool:
        try:
            self._nvml.nvmlInit()
            driver = _text(self._nvml.nvmlSystemGetDriverVersion())
            self._gpus = self._discover(driver)
        except pynvml.NVMLError as exc:
            self.unavailable_reason = str(exc)
            if not self._init_reported:
                self._init_reported = True
                retry = " (retrying every pass)" if self._retry_init else ""
                log.warning(
                    "trainhealth: GPU metrics are off: NVML is not available: %s%s; "
                    "set TRAINHEALTH_GPU_BACKEND=off to silence this",
                    exc,
                    retry,
                )
            return False
        self._initialized = True
        self.unavailable_reason = None
        log.info("trainhealth: sampling %d GPU(s) through %s every %g s", len(self._gpus), self.backend, self._interval)
        if self._on_ready is not None:
            self._on_ready(self.gpus)
        return True

    def _discover(self, driver: str) -> list[_Gpu]:
        nvml = self._nvml
        if self._selection.uuids is not None:
            handles = [nvml.nvmlDeviceGetHandleByUUID(uuid) for uuid in self._selection.uuids]
        else:
            indices = self._selection.indices
            if indices is None:
                indices = tuple(range(nvml.nvmlDeviceGetCount()))
            handles = [nvml.nvmlDeviceGetHandleByIndex(index) for index in indices]
        gpus = []
        writes: list[tuple[MetricSpec, tuple[str, ...], float]] = []
        for handle in handles:
            index = nvml.nvmlDeviceGetIndex(handle)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            labels = (str(index), self.backend)
            bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
            writes.append(
                (catalog.GPU_INFO, labels + (uuid, bus_id, _text(nvml.nvmlDeviceGetName(handle)), driver), 1.0)
            )
            gpus.append(_Gpu(index=index, handle=handle, uuid=uuid, labels=labels))
        self._store.write(writes)
        return gpus

    # --- sampling -------------------------------------------------------------------
    def sample_once(self) -> None:
        """One pass over every watched GPU; writes the store once."""
        with self._lock:
            started = time.perf_counter()
            if not self._initialized and (not self._init_reported or self._retry_init):
                self._initialize()
            self._store.set(catalog.EXPORTER_GPU_BACKEND_UP, 1.0 if self._initialized else 0.0, (self.backend,))
            if not self._initialized:
                return
            writes: list[tuple[MetricSpec, tuple[str, ...], float]] = []
            for gpu in self._gpus:
                writes += self._sample_gpu(gpu)
            if self._profiler is not None:
                writes += self._sample_profiler()
            self._store.write(writes)
            self._store.set(catalog.EXPORTER_GPU_SAMPLE_DURATION, time.perf_counter() - started, (self.backend,))
            self._store.set(catalog.EXPORTER_GPU_SAMPLE_TIMESTAMP, self._clock(), (self.backend,))

    def _sample_gpu(self, gpu: _Gpu) -> list[tuple[MetricSpec, tuple[str, ...], float]]:
        if gpu.state in ("lost", "reset_required") and not self._answers_again(gpu):
            return self._state_writes(gpu)
        triples: list[Triple] = []
        failures = attempts = 0
        for name, reading in READINGS:
            if name in gpu.unsupported:
                continue
            attempts += 1
            try:
                triples += reading(self._nvml, gpu.handle)
            except pynvml.NVMLError as exc:
                if self._handle_error(gpu, name, exc):
                    return self._went_down(gpu, exc)
                failures += exc.value not in _SKIP_CODES
        try:
            triples += self._nvlink(gpu)
        except pynvml.NVMLError as exc:
            if self._handle_error(gpu, "nvlink", exc):
                return self._went_down(gpu, exc)
        new_state = "error" if attempts and failures == attempts else "ok"
        if new_state != gpu.state:
            self._set_state(gpu, new_state, "every NVML reading failed" if new_state == "error" else "")
        writes = [(spec, gpu.labels + extra, value) for spec, extra, value in triples]
        gpu.gauges = {(spec, labels) for spec, labels, _ in writes if spec.kind is catalog.MetricKind.GAUGE}
        self._note_recovery_action(gpu, triples)
        return writes + self._state_writes(gpu)

    def _handle_error(self, gpu: _Gpu, reading: str, exc: pynvml.NVMLError) -> bool:
        """Remember unsupported readings, count other errors; True when the GPU itself is down."""
        if exc.value in _LOST_CODES:
            return True
        if exc.value in _SKIP_CODES:
            gpu.unsupported.add(reading)
            log.debug("trainhealth: GPU %d does not support %s (%s); skipping it from now on", gpu.index, reading, exc)
        else:
            self._store.record_error("nvml", exc)
        return False

    def _nvlink(self, gpu: _Gpu) -> list[Triple]:
        nvml = self._nvml
        if gpu.links is None:
            links = []
            for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
                try:
                    nvml.nvmlDeviceGetNvLinkState(gpu.handle, link)
                except pynvml.NVMLError as exc:
                    if exc.value in _NOT_A_LINK:
                        continue
                    raise
                links.append(link)
            gpu.links = tuple(links)
            if not links:
                gpu.unsupported.add("nvlink")
        triples: list[Triple] = []
        for link in gpu.links:
            label = str(link)
            triples.append((catalog.GPU_NVLINK_UP, (label,), float(nvml.nvmlDeviceGetNvLinkState(gpu.handle, link))))
            for name, counter in NVLINK_ERROR_COUNTERS.items():
                key = f"nvlink_{name}"
                if key in gpu.unsupported:
                    continue
                try:
                    count = nvml.nvmlDeviceGetNvLinkErrorCounter(gpu.handle, link, counter)
                except pynvml.NVMLError as exc:
                    if exc.value in _NOT_A_LINK or exc.value in _SKIP_CODES:
                        gpu.unsupported.add(key)
                        continue
                    raise
                triples.append((catalog.GPU_NVLINK_ERRORS, (label, name), float(count)))
        return triples

    def _sample_profiler(self) -> list[tuple[MetricSpec, tuple[str, ...], float]]:
        try:
            samples = self._profiler.read([gpu.index for gpu in self._gpus if gpu.state == "ok"])
        except Exception as exc:
            self._store.record_error("dcgm", exc)
            return []
        writes = []
        backend = self._profiler.backend
        for index, fields in samples.items():
            labels = (str(index), backend)
            for name, (spec, extra) in _PROFILING_FIELDS.items():
                if name in fields:
                    writes.append((spec, labels + extra, float(fields[name])))
        return writes

    # --- GPU state ------------------------------------------------------------------
    def _answers_again(self, gpu: _Gpu) -> bool:
        """Probe a lost GPU with its handle, then with a fresh one (a reset may change it)."""
        nvml = self._nvml
        handle = gpu.handle
        try:
            nvml.nvmlDeviceGetUUID(handle)
        except pynvml.NVMLError:
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
                nvml.nvmlDeviceGetUUID(handle)
            except pynvml.NVMLError:
                return False
        gpu.handle = handle
        gpu.links = None
        self._set_state(gpu, "ok", "")
        return True

    def _went_down(self, gpu: _Gpu, exc: pynvml.NVMLError) -> list[tuple[MetricSpec, tuple[str, ...], float]]:
        state = _LOST_CODES.get(exc.value, "error")
        if gpu.state != state:
            self._set_state(gpu, state, str(exc))
        nan = float("nan")
        return [(spec, labels, nan) for spec, labels in sorted(gpu.gauges, key=_gauge_order)] + self._state_writes(gpu)

    def _set_state(self, gpu: _Gpu, state: str, reason: str) -> None:
        previous, gpu.state = gpu.state, state
        if state == "ok":
            summary = f"GPU {gpu.index} ({gpu.uuid}) answers again after being {previous.replace('_', ' ')}"
            self._emit("gpu.recovered", Severity.INFO, summary, gpu, state=state)
        else:
            summary = (
                f"GPU {gpu.index} ({gpu.uuid}) is {state.replace('_', ' ')}: {reason}; its series stay "
                f"with trainhealth_gpu_up=0 and the other GPUs are still sampled"
            )
            self._emit("gpu.down", Severity.CRITICAL, summary, gpu, state=state)

    def _state_writes(self, gpu: _Gpu) -> list[tuple[MetricSpec, tuple[str, ...], float]]:
        writes: list[Triple] = [(catalog.GPU_UP, gpu.labels, 1.0 if gpu.state == "ok" else 0.0)]
        writes += [
            (catalog.GPU_STATE, gpu.labels + (state,), 1.0 if gpu.state == state else 0.0) for state in GPU_STATES
        ]
        return writes

    def _note_recovery_action(self, gpu: _Gpu, triples: list[Triple]) -> None:
        for spec, _, value in triples:
            if spec is catalog.GPU_RECOVERY_ACTION and value != gpu.recovery_action:
                gpu.recovery_action = value
                if value:
                    advice = recovery_action_advice(int(value))
                    self._emit(
                        "gpu.recovery_action",
                        Severity.CRITICAL,
                        f"GPU {gpu.index} ({gpu.uuid}): the driver requires recovery: {advice}",
                        gpu,
                        action=advice,
                    )

    def _emit(self, name: str, severity: Severity, summary: str, gpu: _Gpu, **attributes: str) -> None:
        if self._events is None:
            log.log(severity.log_level, "trainhealth: %s", summary)
            return
        self._events.emit(
            Event(
                name,
                severity,
                summary,
                {
                    "gpu": gpu.index,
                    "uuid": gpu.uuid,
                    "backend": self.backend,
                    **attributes,
                },
                time=self._clock(),
            )
        )


_PROFILING_FIELDS: dict[str, tuple[MetricSpec, tuple[str, ...]]] = {
    "sm_active": (catalog.GPU_SM_ACTIVE, ()),
    "tensor_active": (catalog.GPU_TENSOR_ACTIVE, ()),
    "dram_active": (catalog.GPU_DRAM_ACTIVE, ()),
    "pcie_tx": (catalog.GPU_PCIE_THROUGHPUT, ("tx",)),
    "pcie_rx": (catalog.GPU_PCIE_THROUGHPUT, ("rx",)),
    "nvlink_tx": (catalog.GPU_NVLINK_THROUGHPUT, ("tx",)),
    "nvlink_rx": (catalog.GPU_NVLINK_THROUGHPUT, ("rx",)),
}


def _gauge_order(item: tuple[MetricSpec, tuple[str, ...]]) -> tuple[str, tuple[str, ...]]:
    return item[0].name, item[1]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
