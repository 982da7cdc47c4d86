"""The steps a live analyzer reads: the window judged, the history before it, and each rank's usual level.

``trainhealth analyze --last 20 --history 200`` judges a running job's last 20
steps against the 200 steps before their end. A fault older than that history
has no visible change in it: the rank is just slow, and against its peers alone
it reads like a healthy GPU that is always a little slower (PRISM measured up
to 14% between healthy GPUs of one fleet). So the history also holds a
**reference**: the run's first steps after warm-up, where each rank showed its
usual level. A rank slower now than in the reference has changed, however long
ago, and is named for as long as the fault lasts. A fault present from the
run's first steps has no usual level to compare with: only its peers can say.

>>> import numpy as np
>>> steps = live_steps(np.arange(1000), last=20, history=200)
>>> len(steps), int(steps[0]), int(steps[REFERENCE_STEPS - 1]), int(steps[REFERENCE_STEPS]), int(steps[-1])
(300, 10, 109, 800, 999)
>>> len(live_steps(np.arange(1000), last=20, history=0))  # the window alone: no history, no reference
20
"""

from __future__ import annotations

import numpy as np

__all__ = ["REFERENCE_SKIP", "REFERENCE_STEPS", "live_steps", "usual_before"]

#: a run's first steps (allocations, caches filling, DDP building buckets) are no rank's usual level
REFERENCE_SKIP = 10
#: steps of each rank's usual level, from the run's start: enough to measure a level to a few percent
REFERENCE_STEPS = 100


def live_steps(steps: np.ndarray, last: int, history: int) -> np.ndarray:
    """The step numbers to read from a run with ``steps``: the last ``max(last, history)`` and, when ``history``
    exceeds ``last`` and the run has steps before it, up to :data:`REFERENCE_STEPS` of the run's first steps
    after :data:`REFERENCE_SKIP` (fewer skipped in a short run), in order."""
    ordered = np.unique(steps)
    recent = ordered[-max(last, history, 1) :]
    before = ordered[: len(ordered) - len(recent)]
    if history <= last or not len(before):
        return recent
    skip = min(REFERENCE_SKIP, len(before) // 2)
    return np.concatenate([before[skip : skip + REFERENCE_STEPS], recent])


def usual_before(read: np.ndarray, last: int, history: int) -> int | None:
    """The first step of the history in the steps :func:`live_steps` gave (``read``), when a reference comes
    before it: steps numbered below it are each rank's usual level; None without a reference.

    >>> usual_before(live_steps(np.arange(1000), 20, 200), 20, 200), usual_before(np.arange(150), 20, 200)
    (800, None)
    """
    ordered = np.unique(read)
    reference = len(ordered) - max(last, history, 1) if history > last else 0
    return int(ordered[reference]) if reference > 0 else None
