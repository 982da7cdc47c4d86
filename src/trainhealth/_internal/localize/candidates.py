"""What the localizer scores and the thresholds that judge it, with helpers its parts share."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from trainhealth._internal.localize.stretches import Stretch

__all__ = [
    "BLAMABLE_SHAPES",
    "Candidate",
    "Thresholds",
    "best",
    "row_noise",
    "rows_noise",
    "stretch_effect",
]


#: the shapes of slowness that blame a device (a measured intermittent fault is recurrent too)
BLAMABLE_SHAPES = frozenset({"persistent", "throughout", "recurrent", "intermittent"})


@dataclass(frozen=True)
class Thresholds:
    """The localizer's settings; the defaults were chosen on simulator seeds (benchmarks/localization.py)."""

    gpu_z: float = 7.0  # z-score of a rank's slow compute stretch that blames its GPU
    collectives_z: float = 7.0  # the same when compute is derived from collectives alone (noisier)
    link_z: float = 6.0  # z-score of a NIC's, host's or switch's slow transfers that blames it
    compute_allowance: float = 0.10  # log-ratio a healthy GPU may stay above its peers all window (PRISM: 14%)
    transfer_allowance: float = 0.10  # log-ratio a healthy path may stay slow all window
    min_compute_effect: float = 0.015  # log-ratio: slowdowns below 1.5% are not worth a page
    min_transfer_effect: float = 0.04  # log-ratio: transfers 4% slower
    min_length: int = 3  # steps a fault lasts at least; shorter blips (GC pauses) are noise
    min_length_derived: int = 5  # the same for compute derived from collectives (medians of it)
    decay: float = 0.95  # weight of a step per step of age
    irregular: float = 1.1  # delta: a step this many times the window's median step time is irregular
    stage_imbalance: float = 0.10  # slowest peer group above the median one: imbalance between stages
    replica_imbalance: float = 0.03  # spread of a replica's compute from step to step: uneven batches
    explain_share: float = 0.6  # a host or switch explains a NIC when its excess is this share of the NIC's
    explain_z: float = 20.0  # a GPU this clearly slow explains its own slow transfers (its peers waited in them)
    max_suspects: int = 5
    rarity: float = 1.5  # a slow stretch blames only when no other member of the run reaches 1/rarity of it
    recurrent_episodes: int = 3  # episodes of the same member that make a recurrent fault
    recurrent_effect: float = 0.095  # log-ratio: episodes below 10% slower make no recurrent fault worth a page
    false_blame: float = 0.01  # chance of naming a recurrent member in a healthy run
    power_steps: int = 10  # detection power is stated for a member slow in this many last steps
    max_hidden: float = 1.5  # "healthy" needs a member this many times slower (power_steps steps) to be blamed
    straggler_z: float = 6.0  # measured traces (step markers, arrivals): z of a rank's busy time over its peers'
    path_z: float = 6.0  # measured traces: z of a communicator's transfer time over its own usual

    def __post_init__(self) -> None:
        for name in ("gpu_z", "collectives_z", "link_z", "irregular", "straggler_z", "path_z"):
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(f"{name} must be positive and finite")
        if not 0 < self.decay <= 1:
            raise ValueError("decay must be in (0, 1]")
        if not 1 <= self.rarity < math.inf:
            raise ValueError("rarity must be finite and at least 1")
        if not 0 < self.false_blame < 1:
            raise ValueError("false_blame must be in (0, 1)")
        if not 1 < self.max_hidden < math.inf:
            raise ValueError("max_hidden must be finite and above 1")
        if self.recurrent_episodes < 2 or self.power_steps < 2:
            raise ValueError("recurrent_episodes and power_steps must be at least 2")


@dataclass(frozen=True)
class Candidate:
    """A component the timings point at, before the thresholds judge it; ``evidence``: that in words
    (:mod:`.wording`)."""

    kind: str  # gpu, link, host
    component: str  # gpu:rank-N, nic:rank-N, host:NAME, switch:NAME
    ranks: tuple[int, ...]
    host: str | None
    z: float
    evidence: str
    basis: str = "transfers"  # what the z-score comes from: compute (records), derived (from collectives),
    # transfers, measured (busy time from step markers and arrivals), measured-path, probe
    slowdown: float | None = None  # how many times longer it computes / transfers take (measured path)
    since: int | None = None  # the trace step the slowness began (measured path; None: throughout the window)
    shape: str = "persistent"  # persistent, throughout, recurrent: a fault; transient, ordinary: an event
    until: int | None = None  # the last slow step of a stretch that ended (a transient event)

    @property
    def blamable(self) -> bool:
        """A persistent, whole-window or recurrent slowness blames its device; a transient excursion, or one
        that healthy members of the run show too (ordinary), is an event (:mod:`.excursions`)."""
        return self.shape in BLAMABLE_SHAPES

    def strength(self, thresholds: Thresholds) -> float:
        """z over the threshold of its basis: 1 or more blames it."""
        threshold = {
            "compute": thresholds.gpu_z,
            "derived": thresholds.collectives_z,
            "measured": thresholds.straggler_z,
            "measured-path": thresholds.path_z,
            "probe": 1.0,
        }.get(self.basis, thresholds.link_z)
        return self.z / threshold


def row_noise(values: np.ndarray, floor: float = 1e-6) -> float:
    """One cell's standard deviation around its row's median (robust: 1.4826 * MAD), at least ``floor``.

    The floor keeps noiseless input (synthetic traces, a constant timer) from
    turning a trifle into a large z-score.
    """
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # rows without any value
        centered = values - np.nanmedian(values, axis=1, keepdims=True)
    finite = np.abs(centered[np.isfinite(centered)])
    return max(1.4826 * float(np.median(finite)) if len(finite) else 0.0, floor)


def rows_noise(values: np.ndarray, floor: float | np.ndarray = 1e-6) -> np.ndarray:
    """Each row's own :func:`row_noise` (1.4826 * MAD around its median), at least ``floor``; infinite for a row
    without values (nothing in it can stand out)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # rows without values
        own = 1.4826 * np.nanmedian(np.abs(values - np.nanmedian(values, axis=1, keepdims=True)), axis=1)
    return np.maximum(np.nan_to_num(own, nan=np.inf), floor)


def best(stretch: Stretch, whole: Stretch) -> tuple[np.ndarray, Stretch]:
    """The larger z of the two; the stretch is reported unless the level is far stronger."""
    use_level = whole.z > 2.0 * stretch.z
    chosen = Stretch(
        np.where(use_level, whole.start, stretch.start),
        np.where(use_level, whole.stop, stretch.stop),
        np.where(use_level, whole.effect, stretch.effect),
        np.maximum(whole.z, stretch.z),
    )
    return chosen.z, chosen


def stretch_effect(values: np.ndarray, start: int, stop: int) -> float:
    """The median row's mean in steps [start, stop) minus its mean in the other steps (its mean, for all steps)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # rows without values there
        inside = np.nanmean(values[:, start:stop], axis=1)
        outside = (
            np.nanmean(np.delete(values, np.s_[start:stop], axis=1), axis=1) if stop - start < values.shape[1] else 0.0
        )
        difference = inside - outside
    difference = difference[np.isfinite(difference)]
    return float(np.median(difference)) if len(difference) else 0.0
