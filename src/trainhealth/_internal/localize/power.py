"""What a window could have seen: "healthy" is a finding, stated with its detection power.

A window with nothing to blame is called healthy only when it could have seen
a fault: every rank measured in most of its steps, iterations known (step
markers, numbered steps, or inferred from the collectives' pattern) and noise
low enough that a rank ``max_hidden`` times slower would have been blamed.
The power is measured, not computed from a formula: a slowdown is injected
into copies of up to :data:`PROBES` ranks' rows, one rank at a time, in both
forms a fault takes in a live window (an onset inside the window: its last
``power_steps`` steps; and slow all window, its onset in the history or, with
none, against its peers), and judged by the very rules that blame. The
smallest slowdown blamed in every injection of each form is reported ("a rank
1.12x slower for its last 10 steps, or 1.08x slower all window, is blamed in
every injection into 40 ranks"): a slowdown the window blames in at least 95%
of cases, with the margin a sample of 40 ranks needs. Otherwise the answer is
"insufficient data", with the reason and what to record.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["DETECTED_SHARE", "PROBES", "SLOWDOWNS", "Power", "probe_rows", "smallest_detected", "uncovered_ranks"]

#: share of the window's steps a rank must be measured in to count as covered
_COVERED_SHARE = 0.5
#: share of injections that must be blamed for a slowdown to be stated as detectable: every one, so that the
#: detection rate at the stated slowdown is at least 95% with some margin for the probes being a sample (40 of 40
#: blamed happens with probability 0.95^40 = 13% at a true rate of 95%, and less below it)
DETECTED_SHARE = 1.0
#: the slowdowns tried: 2% apart, from 1% to 3x
SLOWDOWNS = np.exp(np.arange(math.log(1.01), math.log(3.0) + 1e-9, math.log(1.02)))
#: ranks a slowdown is injected into, evenly spread over the job (each alone, in a copy of its rows)
PROBES = 40


@dataclass(frozen=True)
class Power:
    """The smallest slowdown of one rank this window would have blamed: over its last ``steps`` steps (``onset``)
    and all window (``throughout``), the larger of the two as ``slowdown``; ``injections``: the ranks it was
    measured on by injection (:func:`trainhealth._internal.localize.gpus.gpu_power`), 0 where it was computed
    from the noise alone (:func:`detection_power`)."""

    slowdown: float
    steps: int
    noise: float  # one step's standard deviation of the compared quantity (log)
    onset: float | None = None
    throughout: float | None = None
    injections: int = 0

    def sentence(self) -> str:
        noise = f"noise {100 * self.noise:.1f}% per step"
        if self.injections and self.onset is not None and self.throughout is not None:
            return (
                f"a rank {_factor(self.onset)} slower for its last {self.steps} steps, or {_factor(self.throughout)} "
                f"slower all window, is blamed in every injection into {self.injections} ranks ({noise})"
            )
        return (
            f"a rank {_factor(self.slowdown)} slower for its last {self.steps} steps would have been blamed ({noise})"
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "slowdown": _rounded(self.slowdown),
            "steps": self.steps,
            "noise_per_step": round(self.noise, 4),
        }
        if self.injections:
            out |= {
                "onset_in_window": _rounded(self.onset),
                "throughout_window": _rounded(self.throughout),
                "injections": self.injections,
            }
        return out


def _factor(slowdown: float) -> str:
    """``1.12x``, or ``over 3x`` where no slowdown tried was blamed often enough."""
    return f"{slowdown:.2f}x" if math.isfinite(slowdown) else f"over {SLOWDOWNS[-1]:.0f}x"


def _rounded(value: float | None) -> float | None:
    """Rounded for JSON; None for an infinite slowdown (none was detectable)."""
    return None if value is None or not math.isfinite(value) else round(value, 4)


def smallest_detected(blamed: Callable[[float], np.ndarray], slowdowns: np.ndarray = SLOWDOWNS) -> float:
    """The smallest of ``slowdowns`` at which at least :data:`DETECTED_SHARE` of the injections are blamed
    (``blamed(slowdown)``: one bool per injection), found by bisection (more slowdown, more blamed); infinite
    when even the largest is not.

    >>> round(smallest_detected(lambda s: np.arange(20) < 20 * (s - 1.0)), 2)  # blamed in a share s - 1 of 20
    1.98
    """
    low, high = 0, len(slowdowns) - 1
    if np.mean(blamed(float(slowdowns[high]))) < DETECTED_SHARE:
        return math.inf
    while low < high:
        middle = (low + high) // 2
        if np.mean(blamed(float(slowdowns[middle]))) >= DETECTED_SHARE:
            high = middle
        else:
            low = middle + 1
    return float(slowdowns[low])


def probe_rows(measured: np.ndarray) -> np.ndarray:
    """The rows slowdowns are injected into: up to :data:`PROBES`, evenly spread, of those measured (finite) in
    most of the window's steps.

    >>> probe_rows(np.array([[1.0, 1.0], [np.nan, np.nan], [1.0, np.nan]])).tolist()
    [0, 2]
    """
    rows = np.flatnonzero(np.isfinite(measured).mean(axis=1) >= 0.5)
    if len(rows) <= PROBES:
        return rows
    return rows[np.linspace(0, len(rows) - 1, PROBES).round().astype(np.int64)]


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
