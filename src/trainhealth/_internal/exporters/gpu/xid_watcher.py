"""XID errors as a stream: every occurrence counted, with meaning and action.

dcgm-exporter exports the last XID as a gauge, which misses repeats and never
resets. Here a thread waits on ``nvmlEventSetWait`` for XID critical-error
events; each one increments ``trainhealth_gpu_xid_errors_total{gpu,xid}``,
sets ``trainhealth_gpu_xid_last_timestamp_seconds`` and emits a ``gpu.xid``
event carrying the catalogue meaning and recommended action.

>>> from trainhealth._internal.events import EventLog
>>> from trainhealth._internal.exporters.gpu.simulated import SimulatedFaultKind, SimulatedFault, SimulatedNvml
>>> from trainhealth._internal.store import MetricStore
>>> sim, store, events = SimulatedNvml(gpus=2), MetricStore(), EventLog(logger=None)
>>> sim.nvmlInit()
>>> watcher = XidWatcher(store, sim, [(1, sim.nvmlDeviceGetHandleByIndex(1), "GPU-x")], backend="simulated", events=events)
>>> watcher.start()
True
>>> sim.inject(SimulatedFault(SimulatedFaultKind.XID, gpu=1, xid=13))
>>> watcher.wait_for(1, timeout_s=5)
True
>>> events.recent("gpu.xid")[0].attributes["action"]
'restart the application (usually an application bug)'
>>> watcher.close()
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pynvml

from trainhealth._internal import catalog
from trainhealth._internal.events import Event, EventLog
from trainhealth._internal.exporters.gpu.sampler import handle_key
from trainhealth._internal.knowledge.xid import describe_xid
from trainhealth._internal.store import MetricStore

__all__ = ["XidWatcher"]

log = logging.getLogger(__name__)


class XidWatcher:
    """Waits for XID events of the given GPUs on a daemon thread.

    ``gpus`` holds ``(index, handle, uuid)`` triples; ``on_xid`` is called with
    ``(index, xid)`` after each event is recorded (the sampler uses it to
    re-sample at once, so a GPU that fell off the bus shows up within a pass).
    """

    def __init__(
        self,
        store: MetricStore,
        nvml: Any,
        gpus: Sequence[tuple[int, Any, str]],
        *,
        backend: str = "nvml",
        events: EventLog | None = None,
        on_xid: Callable[[int, int], None] | None = None,
        wait_ms: int = 500,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._nvml = nvml
        self._gpus = {handle_key(handle): (index, uuid) for index, handle, uuid in gpus}
        self._handles = [(index, handle) for index, handle, _ in gpus]
        self._backend = backend
        self._events = events
        self._on_xid = on_xid
        self._wait_ms = wait_ms
        self._clock = clock
        self._event_set: Any = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen = 0
        self._seen_changed = threading.Condition()

    def start(self) -> bool:
        """Register every GPU for XID events; False (after one log line) when none can be."""
        try:
            self._event_set = self._nvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.info("trainhealth: XID events are not available (%s); XIDs will not be counted", exc)
            return False
        registered = []
        for index, handle in self._handles:
            try:
                self._nvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._event_set)
                registered.append(index)
            except pynvml.NVMLError as exc:
                log.info("trainhealth: GPU %d cannot report XID events (%s)", index, exc)
        if not registered:
            self._free()
            return False
        self._thread = threading.Thread(target=self._run, name="trainhealth-xid-watcher", daemon=True)
        self._thread.start()
        return True

    def close(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=self._wait_ms / 1000 + 5)
            self._thread = None
        self._free()

    def wait_for(self, count: int, timeout_s: float) -> bool:
        """Block until ``count`` XIDs have been recorded in total (for tests and the demo)."""
        with self._seen_changed:
            return self._seen_changed.wait_for(lambda: self._seen >= count, timeout=timeout_s)

    def _free(self) -> None:
        if self._event_set is not None:
            try:
                self._nvml.nvmlEventSetFree(self._event_set)
            except pynvml.NVMLError:
                log.debug("trainhealth: nvmlEventSetFree failed", exc_info=True)
            self._event_set = None

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                data = self._nvml.nvmlEventSetWait(self._event_set, self._wait_ms)
            except pynvml.NVMLError_Timeout:
                continue
            except pynvml.NVMLError as exc:
                self._store.record_error("xid_watcher", exc)
                self._stopping.wait(1.0)  # do not spin on a persistent error
                continue
            try:
                if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                    self._record(data.device, int(data.eventData))
            except Exception as exc:
                self._store.record_error("xid_watcher", exc)

    def _record(self, device: Any, xid: int) -> None:
        index, uuid = self._gpus.get(handle_key(device), (None, ""))
        if index is None:
            index = self._nvml.nvmlDeviceGetIndex(device)
        now = self._clock()
        labels = (str(index), self._backend, str(xid))
        self._store.inc(catalog.GPU_XID_ERRORS, labels=labels)
        self._store.set(catalog.GPU_XID_LAST_TIMESTAMP, now, labels)
        info = describe_xid(xid)
        if self._events is not None:
            summary = f"GPU {index} ({uuid}): XID {xid}, {info.meaning}; action: {info.action.value}"
            self._events.emit(
                Event(
                    "gpu.xid",
                    info.severity,
                    summary,
                    {
                        "gpu": index,
                        "uuid": uuid,
                        "xid": xid,
                        "backend": self._backend,
                        "meaning": info.meaning,
                        "action": info.action.value,
                    },
                    time=now,
                )
            )
        with self._seen_changed:
            self._seen += 1
            self._seen_changed.notify_all()
        if self._on_xid is not None:
            self._on_xid(index, xid)
