"""Device timing of NCCL collectives through the process group's completion hook.

On NCCL a collective call returns once the kernel is enqueued, so wall time
around the call says nothing about the collective. ``ProcessGroup.
_register_on_completion_hook`` (private, NCCL only) calls back on the
watchdog thread with each work's op type, sequence number, start time and
CUDA-event duration, so nothing on the training thread waits for the GPU.
Groups timed this way are recorded from the hook instead of the wrappers.
Records of NCCL sends and receives carry the process group's id and NCCL's
sequence number rather than the per-direction groups of the CPU path.

Not yet run on hardware (no GPU machine was lent to the session that wrote it);
on gloo the completion hook does not exist and nothing here is used.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["OP_TYPES", "time_on_device"]

log = logging.getLogger(__name__)

#: torch's OpType names -> trace format v1 ops.
OP_TYPES = {
    "ALLREDUCE": "all_reduce",
    "ALLREDUCE_COALESCED": "all_reduce",
    "COALESCED": "all_reduce",
    "ALLGATHER": "all_gather",
    "_ALLGATHER_BASE": "all_gather",
    "ALLGATHER_COALESCED": "all_gather",
    "REDUCE_SCATTER": "reduce_scatter",
    "_REDUCE_SCATTER_BASE": "reduce_scatter",
    "REDUCE_SCATTER_TENSOR_COALESCED": "reduce_scatter",
    "ALLTOALL": "all_to_all",
    "ALLTOALL_BASE": "all_to_all",
    "BROADCAST": "broadcast",
    "REDUCE": "reduce",
    "BARRIER": "barrier",
    "SEND": "send",
    "RECV": "recv",
    "RECVANYSOURCE": "recv",
}


def time_on_device(logger: Any, group: Any, group_id: str) -> bool:
    """Attach the completion hook when ``group`` runs on NCCL; True when the hook now records it."""
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        backend = group._get_backend(torch.device("cuda"))
        if "NCCL" not in type(backend).__name__:
            return False
        group._enable_collectives_timing()
        group._register_on_completion_hook(lambda info: _completed(logger, group_id, info))
    except Exception:  # private API: any change in it must only cost the device timing
        log.debug("trainhealth: no NCCL completion hook for group %s", group_id, exc_info=True)
        return False
    log.info("trainhealth: timing group %s with NCCL's completion hook", group_id)
    return True


def _completed(logger: Any, group_id: str, info: Any) -> None:
    try:
        op = OP_TYPES.get(getattr(info.op_type, "name", str(info.op_type)).upper())
        if op is None:
            return
        # time_started is a steady-clock time point: CLOCK_MONOTONIC, the clock of time.perf_counter on Linux
        logger.add_device_record(
            op, group_id, int(info.seq), info.time_started.total_seconds(), info.active_duration.total_seconds()
        )
    except Exception:
        log.debug("trainhealth: recording an NCCL completion failed", exc_info=True)
