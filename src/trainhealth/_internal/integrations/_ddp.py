"""DDP's bucket all-reduces for the integrations, whose trainers wrap the model in DistributedDataParallel themselves.

DDP reduces gradients in buckets without ``torch.distributed.all_reduce``, so the collective
logger records them only through a communication hook
(:func:`trainhealth.comm.instrument_ddp`). Without those records a straggler's peers'
wait inside the buckets counts as their compute. The Trainer and Accelerate create the
DDP wrapper after the integration has its Monitor, so they register the hook on the wrapper
once they meet it: :func:`instrument` on the Trainer's ``model_wrapped``, :func:`ddp_running`
from the module's first forward pass under Accelerate.
"""

from __future__ import annotations

import logging
import sys
from types import FrameType
from typing import Any

from trainhealth._internal.exporters.monitor import Monitor

__all__ = ["ddp_running", "instrument"]

log = logging.getLogger(__name__)


def instrument(monitor: Monitor, model: Any) -> bool:
    """Record ``model``'s bucket all-reduces when it is a DistributedDataParallel and the Monitor logs collectives.

    True when the hook is registered. A model that already has a communication hook keeps it (DDP takes
    one); any failure is counted in ``trainhealth_exporter_errors_total{source="comm"}`` and logged, never raised.
    """
    comm = monitor.comm
    if comm is None or model is None:
        return False
    try:
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(model, DistributedDataParallel):
            return False
        if getattr(model, "_comm_hooks", None):
            log.info(
                "trainhealth: the DDP model has a communication hook already; its bucket all-reduces "
                "are recorded only if that hook is trainhealth.comm.instrument_ddp's"
            )
            return False
        comm.instrument_ddp(model)
        return True
    except Exception as exc:  # noqa: BLE001 - never into the training loop
        monitor.store.record_error("comm", exc)
        return False


def ddp_running(module: Any, depth: int = 12) -> Any:
    """The DistributedDataParallel among the callers whose ``module`` is ``module`` (its forward is running), or None.

    Called from a forward hook of ``module``: DDP's forward calls ``self.module(...)`` a few frames up.
    """
    from torch.nn.parallel import DistributedDataParallel

    frame: FrameType | None = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, DistributedDataParallel) and candidate.module is module:
            return candidate
        frame = frame.f_back
    return None
