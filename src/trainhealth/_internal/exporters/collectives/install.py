"""Collective-operation telemetry for torch.distributed: install once per process.

Usage, in each rank after ``init_process_group``::

    import trainhealth.comm
    trainhealth.comm.install(trace_dir="traces")      # wraps the torch.distributed collectives
    model = trainhealth.comm.instrument_ddp(DistributedDataParallel(model))  # DDP's buckets too
    ...                                               # train
    trainhealth.comm.uninstall()                      # restores torch.distributed, writes the trace

With ``TRAINHEALTH_TRACE_DIR`` set (or ``trace_dir`` given) each rank appends its
records to ``<trace_dir>/rank-<rank>.<n>.jsonl.gz`` (trace format v1, JSON lines in
gzip members) every ``TRAINHEALTH_TRACE_WRITE_INTERVAL`` seconds while it runs, on
:func:`uninstall` and at process exit, so an analyzer can read it live and a crash
loses at most the records since the last append. On SIGTERM and SIGINT the rest is
appended before the signal's previous action runs
(:mod:`~trainhealth._internal.exporters.collectives.shutdown`). Metrics reach Prometheus when a :class:`~trainhealth.Monitor`
runs in the process (``Monitor(..., comm=True)`` installs the logger itself).
Code that imported a collective by name before :func:`install`
(``from torch.distributed import all_reduce``) keeps the unwrapped function.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from pathlib import Path
from typing import Any

from trainhealth._internal._torch import require_torch
from trainhealth._internal.config import Settings
from trainhealth._internal.detectors.runner import SignalDetectors
from trainhealth._internal.exporters.collectives.logger import COMMUNICATION_FUNCTIONS, CollectiveLogger
from trainhealth._internal.exporters.collectives.shutdown import restore_signals, save_on_signals
from trainhealth._internal.exporters.collectives.works import release_works
from trainhealth._internal.exporters.collectives.wrappers import DEPRECATED_ALIASES, runs
from trainhealth._internal.store import MetricStore

__all__ = ["CollectiveLogger", "install", "installed", "instrument_ddp", "uninstall"]

log = logging.getLogger(__name__)

#: seconds the exit waits for stacks and dumps still queued for the disk
EVIDENCE_AT_EXIT_S = 5.0

_lock = threading.Lock()
_installed: CollectiveLogger | None = None
_originals: dict[str, Any] = {}


def installed() -> CollectiveLogger | None:
    """The logger :func:`install` put in place, or ``None``."""
    return _installed


def install(
    trace_dir: str | os.PathLike[str] | None = None,
    *,
    store: MetricStore | None = None,
    settings: Settings | None = None,
    detectors: SignalDetectors | None = None,
) -> CollectiveLogger:
    """Wrap the torch.distributed collectives and start recording; idempotent.

    ``store`` receives the metrics and ``detectors`` the median duration of each
    (op, group) per flush (a Monitor passes its own); ``settings``
    defaults to the ``TRAINHEALTH_*`` environment, with ``trace_dir`` overriding
    ``TRAINHEALTH_TRACE_DIR``.
    """
    global _installed
    require_torch("trainhealth.comm")
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if not dist.is_available():
        raise RuntimeError("trainhealth.comm needs a torch build with torch.distributed")
    settings = settings or Settings.resolve()
    if trace_dir is not None:
        settings = settings.replace(trace_dir=str(trace_dir))
    with _lock:
        if _installed is not None:
            if store is not None and _installed.store is None:
                _installed.store = store
            if detectors is not None and _installed.detectors is None:
                _installed.detectors = detectors
            if settings.comm.trace_dir and _installed.trace_dir is None:
                _installed.trace_dir = Path(settings.comm.trace_dir)
            return _installed
        from trainhealth._internal.identity import Identity, configured_rank

        identity = Identity.from_env(settings=settings)
        logger = CollectiveLogger(  # rank: the launcher's, else torch.distributed's once it is initialised
            rank=configured_rank(settings=settings),
            host=identity.host,
            gpu=identity.local_rank,
            ring_size=settings.comm.ring_size,
            store=store,
            trace_dir=settings.comm.trace_dir,
            flush_interval_s=settings.comm.flush_interval,
            detectors=detectors,
            trace_write_interval_s=settings.comm.trace_write_interval,
            hang_floor_s=settings.comm.hang_floor,
            pause_limit_s=settings.comm.pause_limit,
        )
        logger.hold_works = True  # a synchronous call is in flight until its Work completes, not until it returns
        for name in COMMUNICATION_FUNCTIONS:
            original = getattr(c10d, name, None)
            if original is None:  # a function this torch does not have (all_gather_single before 2.13)
                continue
            runs_instead = DEPRECATED_ALIASES.get(name)
            if runs_instead is not None and hasattr(c10d, runs_instead) and runs(original, runs_instead):
                continue  # it runs the wrapped function, which records the call
            try:
                wrapper = logger.wrap(name, original)
            except (KeyError, TypeError, ValueError):  # something replaced it with a function of another signature
                log.warning("trainhealth: torch.distributed.%s has an unexpected signature; it is not recorded", name)
                continue
            _originals[name] = original
            setattr(c10d, name, wrapper)
            if getattr(dist, name, None) is original:
                setattr(dist, name, wrapper)
        logger.start()
        _installed = logger
        atexit.register(_write_at_exit)
        save_on_signals(_write_on_signal)
        return logger


def uninstall() -> Path | None:
    """Restore torch.distributed, stop the logger and write its trace when it has a trace directory."""
    global _installed
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    with _lock:
        logger, _installed = _installed, None
        for name, original in _originals.items():
            if getattr(dist, name, None) is getattr(c10d, name, None):
                setattr(dist, name, original)
            setattr(c10d, name, original)
        _originals.clear()
        release_works()
    atexit.unregister(_write_at_exit)
    restore_signals()
    if logger is None:
        return None
    logger.stop()
    return _write(logger)


def instrument_ddp(model: Any) -> Any:
    """Record a DistributedDataParallel model's bucket all-reduces (installs the logger if needed)."""
    return (installed() or install()).instrument_ddp(model)


def _write(logger: CollectiveLogger) -> Path | None:
    try:
        return logger.write_trace()
    except Exception:
        log.warning("trainhealth: writing the collective trace failed", exc_info=True)
        return None


def _write_at_exit() -> None:
    logger = _installed
    if logger is not None:
        logger.flush()
        logger.writer.drain(EVIDENCE_AT_EXIT_S)  # stacks and dumps of a failure the last flush found
        _write(logger)


def _write_on_signal() -> None:
    """On SIGTERM / SIGINT (see :mod:`~trainhealth._internal.exporters.collectives.shutdown`): append what is left,
    giving up after 2 s when the trace is held by a write the signal interrupted."""
    logger = _installed
    if logger is not None and logger.trace_dir is not None:
        logger.write_trace(timeout_s=2.0)
        logger.writer.drain(2.0)
