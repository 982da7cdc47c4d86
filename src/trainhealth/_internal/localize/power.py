"""What a window could have seen: "healthy" is a finding, stated with its detection power.

A window with nothing to blame is called healthy only when it could have seen
a fault: every rank measured in most of its steps, iterations known (step
markers, numbered steps, or inferred from the collectives' pattern) and noise
low enough that a rank ``max_hidden`` times slower over its last
``power_steps`` steps would have been blamed, by the same scan, z threshold,
minimum effect and run-level rarity rule (:mod:`.excursions`) that blame. The
smallest such slowdown is computed from this window's own noise and reported
("a rank 1.12x slower for its last 10 steps would have been blamed").
Otherwise the answer is "insufficient data", with the reason and what to record.

>>> import numpy as np
>>> values = np.random.default_rng(0).normal(0.0, 0.02, (8, 40))
>>> power = detection_power(values, sigma=0.02, z=6.0, min_effect=np.log(1.05), rarity=1.5, steps=10)
>>> power.sentence()
'a rank 1.05x slower for its last 10 steps would have been blamed (noise 2.0% per step)'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainhealth._internal.localize.excursions import detectable_effect, largest_elsewhere

__all__ = ["Power", "detection_power", "uncovered_ranks"]

#: share of the window's steps a rank must be measured in to count as covered
_COVERED_SHARE = 0.5


@dataclass(frozen=True)
class Power:
    """The smallest slowdown of one rank over its last ``steps`` steps this window would have blamed."""

    slowdown: float
    steps: int
    noise: float  # one step's standard deviation of the compared quantity (log)

    def sentence(self) -> str:
        return (
            f"a rank {self.slowdown:.2f}x slower for its last {self.steps} steps would have been blamed "
            f"(noise {100 * self.noise:.1f}% per step)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {"slowdown": round(self.slowdown, 4), "steps": self.steps, "noise_per_step": round(self.noise, 4)}


def detection_power(
    values: np.ndarray,
    sigma: float,
    z: float,
    min_effect: float,
    rarity: float,
    steps: int,
    census: np.ndarray | None = None,
) -> Power:
    """The power of a scan over ``values`` (member x step, log relative times) with per-step noise ``sigma``:
    the last ``steps`` steps (at most half the window) against the rest, at threshold ``z``, at least
    ``min_effect``, and ``rarity`` times what members of the run (``census``: their values over a longer
    history; else the window's) reach over that many steps."""
    n_steps = values.shape[1]
    length = max(2, min(steps, n_steps // 2))
    elsewhere = largest_elsewhere(values if census is None else census, np.array([], dtype=np.int64), length)
    effect = detectable_effect(sigma, z, n_steps, length, min_effect, elsewhere, rarity)
    return Power(math.exp(effect), length, sigma)


def uncovered_ranks(ranks: np.ndarray, measured: np.ndarray, expected: set[int] | None = None) -> tuple[int, ...]:
    """Ranks measured in fewer than half of the window's steps (``measured``: rank x step, NaN where not), and
    ranks ``expected`` (group members, or the gaps in 0..the largest rank) without any record.

    >>> uncovered_ranks(np.array([0, 1, 3]), np.array([[1.0, 1.0], [np.nan, np.nan], [1.0, np.nan]]))
    (1, 2)
    """
    share = np.isfinite(measured).mean(axis=1) if measured.shape[1] else np.zeros(len(ranks))
    present = {int(r) for r in ranks}
    if expected is None:
        largest = max(present, default=-1)
        expected = set(range(largest + 1)) if len(present) >= 0.5 * (largest + 1) else present
    missing = (expected - present) | {int(r) for r, s in zip(ranks, share) if s < _COVERED_SHARE}
    return tuple(sorted(missing))
