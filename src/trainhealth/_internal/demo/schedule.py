"""The demo's built-in fault schedule, laid out over however many steps the run has.

The demo calibrates its step count from ``--duration``, then places the faults
at fixed fractions of the run so that each has time to be seen: a GPU that
throttles for heat, a straggler rank, a loss spike, and an XID 79 (GPU fallen
off the bus). ``--faults FILE`` replaces it (the injector's YAML or JSON
format, steps absolute; see docs/sdc.md). Either way the schedule is a list of
faults (:class:`~trainhealth._internal.faults.Fault`).

>>> [fault.describe() for fault in default_schedule(1000, ranks=4)]  # doctest: +NORMALIZE_WHITESPACE
['step 100: simulated thermal throttle on GPU 1 on rank 1',
 'steps 300-600: straggler: +0.2 s per step on rank 2',
 'steps 650-654: learning rate x30 (loss spike) on every rank',
 'step 800: simulated xid on GPU 3 (XID 79) on rank 3']
"""

from __future__ import annotations

from trainhealth._internal.faults import Fault
from trainhealth._internal.injectors.schedule_file import load_schedule

__all__ = ["default_schedule"]


def default_schedule(steps: int, ranks: int, step_seconds: float = 0.1) -> list[Fault]:
    """Faults for a run of ``steps`` steps on ``ranks`` ranks (each rank's GPU is its local index)."""
    straggler, hot, lost = min(2, ranks - 1), min(1, ranks - 1), ranks - 1
    return load_schedule(
        [
            {
                "kind": "simulated_gpu",
                "fault": "thermal_throttle",
                "gpu": hot,
                "step": int(0.10 * steps),
                "ranks": [hot],
            },
            {
                "kind": "delay",
                "severity": round(2.0 * step_seconds, 3),
                "step": int(0.30 * steps),
                "until": int(0.60 * steps),
                "ranks": [straggler],
            },
            {"kind": "lr_scale", "severity": 30.0, "step": int(0.65 * steps), "until": int(0.65 * steps) + 4},
            {
                "kind": "simulated_gpu",
                "fault": "xid",
                "xid": 79,
                "gpu": lost,
                "step": int(0.80 * steps),
                "ranks": [lost],
            },
        ]
    )
