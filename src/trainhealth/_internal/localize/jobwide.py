"""Job-wide slowdowns: every rank slower at once, which no single device explains.

When storage stalls, the network is congested by another job, or a host
service takes every CPU, all ranks slow down together. The localizer compares
ranks with each other and with their own usual, with what they share taken
out, so such a slowdown blames nobody; it must still be said. Per rank and
step, the log of its step seconds less the rank's own median; per step, the
median of that over the ranks is the job's change and the share of ranks above
half of it says whether it is everyone's. The strongest stretch of at least
three steps whose change stands out from the job's step-to-step noise and
reaches :data:`MIN_FACTOR` is reported.

>>> seconds = np.ones((8, 60)) + np.random.default_rng(0).normal(0, 0.01, (8, 60))
>>> seconds[:, 40:50] *= 1.5
>>> found = job_wide_slowdown(seconds, np.arange(60))
>>> round(found.factor, 1), found.first_step, found.last_step, found.share
(1.5, 40, 49, 1.0)
>>> found.sentence()
'every rank 1.50x slower in steps 40-49: not one device; look at shared causes (storage, network, another job on the hosts)'
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainhealth._internal.localize.stretches_scan import step_noise, strongest_shift

__all__ = ["MIN_FACTOR", "JobWide", "job_wide_slowdown"]

#: a job-wide slowdown smaller than this is within what a healthy job's steps vary by (checkpoints, data)
MIN_FACTOR = 1.2
#: share of the ranks that must be slower by at least half the job's change
_EVERYONE = 0.8
#: z-value of the stretch against the job's step-to-step noise
_Z = 6.0
_MIN_STEPS = 3


@dataclass(frozen=True)
class JobWide:
    """A stretch of steps in which (nearly) every rank was ``factor`` times as slow as its usual."""

    factor: float
    first_step: int
    last_step: int
    share: float  # of the ranks slower by at least half of it
    ongoing: bool  # it lasts to the window's last step

    def sentence(self) -> str:
        who = "every rank" if self.share >= 0.995 else f"{self.share:.0%} of the ranks"
        return (
            f"{who} {self.factor:.2f}x slower in steps {self.first_step}-{self.last_step}"
            f"{' (still)' if self.ongoing else ''}: not one device; look at shared causes (storage, network, "
            f"another job on the hosts)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "slowdown": round(self.factor, 4),
            "steps": [self.first_step, self.last_step],
            "share_of_ranks": round(self.share, 4),
            "ongoing": self.ongoing,
            "text": self.sentence(),
        }


def job_wide_slowdown(seconds: np.ndarray, steps: np.ndarray) -> JobWide | None:
    """The strongest job-wide slowdown in ``seconds`` (rank x step, NaN where not measured), or None."""
    if seconds.shape[0] < 2 or seconds.shape[1] < 2 * _MIN_STEPS:
        return None
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # ranks or steps without a measurement
        logs = np.log(np.where(seconds > 0, seconds, np.nan))
        own = logs - np.nanmedian(logs, axis=1, keepdims=True)
        job = np.nanmedian(own, axis=0)
    if np.isfinite(job).sum() < 2 * _MIN_STEPS:
        return None
    sigma = step_noise(job[None, :], floor=0.005)
    found = strongest_shift(job[None, :], sigma, _MIN_STEPS, math.log(MIN_FACTOR), whole=False)
    start, stop, effect, z = int(found.start[0]), int(found.stop[0]), float(found.effect[0]), float(found.z[0])
    if z < _Z or effect < math.log(MIN_FACTOR):
        return None
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        per_rank = np.nanmedian(own[:, start:stop], axis=1) - np.nanmedian(np.delete(own, np.s_[start:stop], 1), 1)
    measured = np.isfinite(per_rank)
    share = float((per_rank[measured] >= 0.5 * effect).mean()) if measured.any() else 0.0
    if share < _EVERYONE:
        return None
    last = np.flatnonzero(np.isfinite(job))[-1]
    return JobWide(math.exp(effect), int(steps[start]), int(steps[stop - 1]), share, stop > last)
