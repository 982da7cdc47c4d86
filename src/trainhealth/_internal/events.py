"""Events: things that happened once and need a human (an XID, later an anomaly).

Events are kept in a bounded log and handed to listeners (the log line, the
OpenTelemetry log sink). Attributes are small and typed; free text lives in
``summary``, never in a metric label.

>>> log = EventLog(maxlen=2)
>>> seen = []
>>> log.add_listener(seen.append)
>>> log.emit(Event("gpu.xid", Severity.CRITICAL, "GPU 3: XID 79", {"gpu": 3, "xid": 79}, time=1.0))
>>> [e.attributes["xid"] for e in log.recent()], len(seen)
([79], 1)
"""

from __future__ import annotations

import logging
import threading
import time as _time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum

__all__ = ["Event", "EventLog", "Severity"]

log = logging.getLogger(__name__)


class Severity(str, Enum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def log_level(self) -> int:
        return {Severity.INFO: logging.INFO, Severity.WARNING: logging.WARNING, Severity.CRITICAL: logging.ERROR}[self]


@dataclass(frozen=True)
class Event:
    """One event. ``name`` is dotted (``gpu.xid``); ``summary`` is one line for a human."""

    name: str
    severity: Severity
    summary: str
    attributes: Mapping[str, str | int | float] = field(default_factory=dict)
    time: float = field(default_factory=_time.time)


Listener = Callable[[Event], None]


class EventLog:
    """The last ``maxlen`` events, and the listeners every new one is handed to."""

    def __init__(self, maxlen: int = 1000, logger: logging.Logger | None = log) -> None:
        self._events: deque[Event] = deque(maxlen=maxlen)
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()
        self._logger = logger

    def add_listener(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def emit(self, event: Event) -> None:
        """Record ``event``, log it and hand it to every listener; a failing listener is logged, not raised."""
        with self._lock:
            self._events.append(event)
            listeners = tuple(self._listeners)
        if self._logger is not None:
            self._logger.log(event.severity.log_level, "trainhealth: %s", event.summary)
        for listener in listeners:
            try:
                listener(event)
            except Exception:
                log.debug("trainhealth: event listener failed", exc_info=True)

    def recent(self, name: str | None = None) -> list[Event]:
        """The kept events, oldest first, optionally only those called ``name``."""
        with self._lock:
            return [e for e in self._events if name is None or e.name == name]
