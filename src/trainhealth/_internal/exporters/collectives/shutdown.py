"""The trace reaches disk when the job is stopped: on SIGTERM and SIGINT, chained to the handler before ours.

Kubernetes, Slurm and torchrun stop a job with SIGTERM (then SIGKILL after a grace
period); the trace is the evidence of what stopped it. :func:`save_on_signals`
installs, from the main thread, a handler for SIGTERM and SIGINT that saves the
trace and then does what the signal did before: calls the user's handler, ignores
it, or — the default — restores the default action and raises the signal again,
so the process ends by the same signal as without trainhealth.

A Python handler runs on the main thread between bytecodes, so a rank blocked
inside a collective (its peer already gone) would not run it until the
collective times out, and, worse, would no longer die at once as the default
action makes it. So the signal also wakes a watcher thread (through
:func:`signal.set_wakeup_fd`, written by the interpreter's C handler at once):
the watcher saves the trace at once and, when the main thread has not run the
handler within ``grace_s`` and the action before was the default, restores the
default action through libc and raises the signal again. Where another part of
the process owns the wakeup fd (an asyncio loop), the watcher is not installed
and the main-thread handler alone saves the trace.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["SIGNALS", "restore_signals", "save_on_signals"]

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)

_previous: dict[int, Any] = {}
_save: Callable[[], object] | None = None
_handled = threading.Event()  # the main thread has run our handler
_watcher: _Watcher | None = None


def save_on_signals(save: Callable[[], object], grace_s: float = 1.0) -> bool:
    """Run ``save`` on SIGTERM and SIGINT before their previous action; False where it cannot (not the main
    thread). Idempotent; :func:`restore_signals` undoes it."""
    global _save, _watcher
    if threading.current_thread() is not threading.main_thread():
        return False
    _save = save
    for signum in SIGNALS:
        current = signal.getsignal(signum)
        if current is _on_signal:
            continue
        _previous[signum] = current
        signal.signal(signum, _on_signal)
    if _watcher is None:
        _watcher = _Watcher.start(grace_s)
    return True


def restore_signals() -> None:
    """Put back the handlers :func:`save_on_signals` replaced (where ours is still the one installed)."""
    global _save, _watcher
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, previous in list(_previous.items()):
        if signal.getsignal(signum) is _on_signal:
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        del _previous[signum]
    if _watcher is not None:
        _watcher.stop()
        _watcher = None
    _save = None


def _save_now() -> None:
    save = _save
    if save is None:
        return
    try:
        save()
    except Exception:
        log.warning("trainhealth: saving the collective trace on a signal failed", exc_info=True)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _handled.set()
    _save_now()
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:  # the default action: end the process by this signal, as it would have without us
        restore_signals()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


class _Watcher:
    """Woken by the interpreter's C-level signal handler through the wakeup fd; see the module docstring."""

    def __init__(self, read_fd: int, write_fd: int, grace_s: float) -> None:
        self._read, self._write, self._grace = read_fd, write_fd, grace_s
        self._thread = threading.Thread(target=self._run, name="trainhealth-signal-watcher", daemon=True)

    @classmethod
    def start(cls, grace_s: float) -> _Watcher | None:
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        try:
            previous = signal.set_wakeup_fd(write_fd)
        except (ValueError, OSError):
            previous = None
        if previous != -1:  # someone else's wakeup fd (asyncio): leave it to them
            if previous is not None:
                signal.set_wakeup_fd(previous)
            os.close(read_fd)
            os.close(write_fd)
            return None
        watcher = cls(read_fd, write_fd, grace_s)
        watcher._thread.start()
        return watcher

    def stop(self) -> None:
        if signal.set_wakeup_fd(-1) not in (self._write, -1):
            log.debug("trainhealth: the wakeup fd had changed hands")
        os.close(self._write)  # ends the thread's read
        self._thread.join(timeout=2)
        os.close(self._read)

    def _run(self) -> None:
        while True:
            try:
                data = os.read(self._read, 64)
            except OSError:
                return
            if not data:
                return
            for signum in set(data):
                if signum in _previous:
                    self._deliver(signum)

    def _deliver(self, signum: int) -> None:
        _save_now()
        if _handled.wait(self._grace) or _previous.get(signum, signal.SIG_DFL) not in (signal.SIG_DFL, None):
            return  # the main thread ran the handler, or the action before was not the default
        log.warning(
            "trainhealth: signal %d while the main thread is blocked; the trace is saved, ending the "
            "process as the default action would",
            signum,
        )
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal(ctypes.c_int(signum), ctypes.c_void_p(0))  # SIG_DFL, from a thread Python will not let
        os.kill(os.getpid(), signum)
