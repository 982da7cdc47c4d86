"""Who the others wait for, step after step: GPU candidates from measured compute and arrivals.

A faulty device is one that is waited for *persistently*: the same rank is the
slowest of its peers (busy longest, arriving last at their collectives) in the
steps that got slower, against the noise of this very run. Imbalance is work
that moves: the slowest rank changes from step to step, or a whole stage is
longer on every replica, and nobody is blamed for it.

Three shapes of fault are scored on the rank's busy time relative to its peers
(:mod:`.waits`), each as a z-value with the per-step noise measured from the
window's own step-to-step changes:

* a stretch that began at an onset and lasts to the end of the window (a
  persistent fault; "since step 31"), or came and went (a transient one);
* the whole window, less an allowance for healthy differences between devices
  (PRISM measured up to 14% between GPUs of one fleet);
* single slow steps that keep falling on the same rank (an intermittent fault:
  every k-th step), which a stretch mean would dilute.

A candidate must also be the slowest of its peers in most of the steps of its
stretch, far more often than chance (1 / peers) allows.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from trainhealth._internal.localize.candidates import BLAMABLE_SHAPES
from trainhealth._internal.localize.excursions import binomial_tail, largest_elsewhere
from trainhealth._internal.localize.power import Power, probe_rows, smallest_detected
from trainhealth._internal.localize.stretches import ongoing_stretch
from trainhealth._internal.localize.stretches_scan import (
    Shift,
    burst_factor,
    step_noise,
    strongest_shift,
    whole_level,
)
from trainhealth._internal.localize.waits import Measured, without

__all__ = ["Straggler", "StragglerSettings", "find_stragglers", "peer_counts", "straggler_power", "undecided_pairs"]


#: stragglers looked for in one window (more than a few at once is a job-wide problem, not a device)
_MAX_STRAGGLERS = 4
#: steps from a straggler's onset in which its peers are no standard for each other: the job
#: re-synchronises around the first slow steps (a 3x data-loader stall shifts its peers' step boundaries too)
_ECHO_STEPS = 2


@dataclass(frozen=True)
class StragglerSettings:
    """Thresholds of the measured path (chosen on the real-run lab's calibration seeds, see docs/benchmarks.md)."""

    z: float = 6.0  # z-value that blames a rank
    min_effect: float = math.log(1.05)  # a rank busy less than 5% longer than before is not worth a page
    allowance: float = math.log(1.15)  # a healthy device may stay this much slower than its peers all window
    min_length: int = 3  # steps a persistent or transient fault lasts at least
    min_slowest_share: float = 0.5  # share of its stretch's steps the rank must be the slowest of its peers
    chance: float = 1e-3  # probability of being the slowest that often by chance, below which it counts
    spike_z: float = 4.0  # a single step this many sigmas above the peers is a slow step (intermittent faults)
    min_spikes: int = 4  # an intermittent fault recurs: three slow steps in a window happen to healthy ranks
    spike_dominance: float = 2.0  # its single-step slowness, summed, over that of any other rank
    noise_floor: float = 0.005  # per-step noise never taken below 0.5% (timer resolution, scheduler)
    rarity: float = 1.5  # a slow stretch counts when no other rank reaches 1/rarity of it for as long


@dataclass(frozen=True)
class Straggler:
    """A rank its peers waited for, as measured (:func:`.wording.straggler_sentence` says it in words)."""

    rank: int
    z: float
    effect: float  # log(busy / peers' busy) in the stretch, against the rest of the window
    steps: tuple[int, ...]  # the slow steps (trace step numbers)
    shape: str  # "persistent", "throughout", "intermittent" (faults); "transient", "ordinary" (events)
    slowest_share: float
    others_waited: float  # median seconds per slow step its peers spent waiting for later arrivals


def peer_counts(measured: Measured) -> np.ndarray:
    """Per rank, the number of ranks it is compared with, itself included (1 when it has no peers).

    Groups of different kinds (data-, tensor-parallel) share only the rank itself, so the sizes add up.
    """
    index = {int(r): i for i, r in enumerate(measured.ranks)}
    counts = np.ones(len(measured.ranks), dtype=np.int64)
    for members in measured.groups.values():
        counts[[index[m] for m in members]] += len(members) - 1
    return counts


def find_stragglers(measured: Measured, settings: StragglerSettings) -> tuple[list[Straggler], float]:
    """Ranks the others wait for, strongest first, and the per-step noise they were judged against."""
    sigma = step_noise(measured.relative, settings.noise_floor)
    if measured.relative.shape[1] < settings.min_length or not np.isfinite(measured.relative).any():
        return [], sigma
    chance = 1.0 / np.maximum(peer_counts(measured), 2)
    found: list[Straggler] = []
    view = measured
    for _ in range(_MAX_STRAGGLERS):  # explain away: score again without the stragglers found as a standard
        ranked = sorted(_candidates(view, sigma, chance, {s.rank for s in found}, settings), key=lambda s: -s.z)
        if not ranked:
            break
        if ranked[0].z < settings.z:
            found.append(ranked[0])  # the strongest near miss, for the record (it is not blamed)
            break
        found.append(ranked[0])
        view = _without_echoes(without(measured, frozenset(s.rank for s in found)), found)
    return found, sigma


def _without_echoes(measured: Measured, found: list[Straggler]) -> Measured:
    """``measured`` with the first steps after each found straggler's onset left out for everyone else."""
    onsets = [s.steps[0] for s in found if s.shape in ("persistent", "transient")]
    if not onsets:
        return measured
    columns = np.zeros(len(measured.steps), dtype=bool)
    for onset in onsets:
        at = int(np.searchsorted(measured.steps, onset))
        columns[at : at + _ECHO_STEPS] = True
    relative = measured.relative.copy()
    relative[:, columns] = np.nan
    return replace(measured, relative=relative, slowest=measured.slowest & ~columns[None, :])


def _candidates(
    measured: Measured, sigma: float, chance: np.ndarray, skip: set[int], settings: StragglerSettings
) -> list[Straggler]:
    relative = measured.relative
    stretch_sigma = sigma * burst_factor(relative, sigma, settings.min_length)  # stretches: bursts discounted
    change = strongest_shift(relative, stretch_sigma, settings.min_length, settings.allowance, whole=False)
    level = whole_level(relative, stretch_sigma, settings.allowance)
    spikes_of = _SlowSteps.find(measured, sigma, settings)
    paired = peer_counts(measured) <= 2  # one peer: no majority says which of the two is slow at a given step
    out = []
    for index in np.flatnonzero(np.isfinite(relative).any(axis=1)).tolist():
        if int(measured.ranks[index]) in skip:
            continue
        best = _row_candidate(
            measured, index, change, level, spikes_of, sigma, stretch_sigma, chance[index], paired[index], settings
        )
        if best is not None:
            out.append(best)
    return out


def _row_candidate(
    measured: Measured,
    index: int,
    change: Shift,
    level: Shift,
    spikes_of: _SlowSteps,
    sigma: float,
    stretch_sigma: float,
    chance: float,
    paired: bool,
    settings: StragglerSettings,
) -> Straggler | None:
    """A rank's strongest form: a change with its onset explains more than a level, unless only the level is
    strong enough; a rank with one peer is judged only against its own past (a change), never by its level or
    single steps."""
    use_change = paired or change.z[index] >= min(settings.z, level.z[index])
    candidate = _stretch(measured, index, change if use_change else level, sigma, chance, settings)
    if use_change and not paired and (candidate is None or candidate.shape not in BLAMABLE_SHAPES):
        # a small change, or one that came and went, inside a row slow all window: the level may blame it
        whole = _stretch(measured, index, level, sigma, chance, settings)
        if whole is not None and (candidate is None or (whole.shape in BLAMABLE_SHAPES and whole.z >= settings.z)):
            candidate = whole
    if candidate is not None and candidate.shape == "transient":  # a fault now matters more than one that ended
        row = measured.relative[index : index + 1].copy()
        row[0, np.isin(measured.steps, candidate.steps)] = np.nan  # the episode that ended is no baseline
        now = ongoing_stretch(row, stretch_sigma, settings.min_length, settings.min_length)
        later = _stretch(
            measured,
            index,
            _replaced(change, index, Shift(now.start, now.stop, now.effect, now.z)),
            sigma,
            chance,
            settings,
        )
        separate = int(now.start[0]) >= int(np.searchsorted(measured.steps, candidate.steps[-1])) + 1
        if separate and later is not None and later.shape in BLAMABLE_SHAPES and later.z >= settings.z:
            candidate = later
    spikes = None if paired else spikes_of.straggler(measured, index, sigma, settings)
    return max((c for c in (candidate, spikes) if c is not None), key=lambda c: c.z, default=None)


def straggler_power(measured: Measured, settings: StragglerSettings, steps: int, found: Iterable[int] = ()) -> Power:
    """The smallest slowdown of one rank this window blames in every injection (:mod:`.power`): its busy time
    multiplied in its last ``steps`` steps (an onset inside the window) and in all of them (slow all window,
    against its peers), one rank at a time, judged by :func:`find_stragglers`' rules for a rank against this
    window's own noise. The rank's relative busy time rises by the slowdown (its peers' reference leaves it
    out) and it is the slowest of its peers wherever it then exceeds them all. Ranks in ``found`` (a slow
    stretch of their own in this window: that finding speaks for them) are not tried."""
    relative = measured.relative
    sigma = step_noise(relative, settings.noise_floor)
    stretch_sigma = sigma * burst_factor(relative, sigma, settings.min_length)
    chance = 1.0 / np.maximum(peer_counts(measured), 2)
    paired = peer_counts(measured) <= 2
    kept = ~np.isin(measured.ranks, sorted(set(found)))
    probes = np.flatnonzero(kept)[probe_rows(relative[kept])]
    n_steps = relative.shape[1]
    length = max(2, min(steps, n_steps // 2))
    change = strongest_shift(relative, stretch_sigma, settings.min_length, settings.allowance, whole=False)
    level = whole_level(relative, stretch_sigma, settings.allowance)
    others_max = {int(i): _others_max(measured, int(i)) for i in probes}

    def detectable(last: int) -> float:
        def blamed(slowdown: float) -> np.ndarray:
            out = np.zeros(len(probes), dtype=bool)
            for position, index in enumerate(probes.tolist()):
                probe = _injected(measured, index, math.log(slowdown), last, others_max[index])
                row = probe.relative[index : index + 1]
                found = _row_candidate(
                    probe,
                    index,
                    _replaced(
                        change,
                        index,
                        strongest_shift(row, stretch_sigma, settings.min_length, settings.allowance, whole=False),
                    ),
                    _replaced(level, index, whole_level(row, stretch_sigma, settings.allowance)),
                    _SlowSteps.find(probe, sigma, settings),
                    sigma,
                    stretch_sigma,
                    chance[index],
                    paired[index],
                    settings,
                )
                out[position] = found is not None and found.z >= settings.z and found.shape in BLAMABLE_SHAPES
            return out

        return smallest_detected(blamed) if len(probes) else math.inf

    onset, throughout = detectable(length), detectable(n_steps)
    return Power(max(onset, throughout), length, float(stretch_sigma), onset, throughout, len(probes))


def _others_max(measured: Measured, index: int) -> np.ndarray:
    """Per step, the largest relative busy time of the rank's peers (-inf where it has none)."""
    peers = _peer_rows(measured, index)
    if not len(peers):
        return np.full(measured.relative.shape[1], -np.inf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nan_to_num(np.nanmax(measured.relative[peers], axis=0), nan=-np.inf)


def _injected(measured: Measured, index: int, added: float, last: int, others_max: np.ndarray) -> Measured:
    """``measured`` with ``added`` in the rank's relative busy time over its last ``last`` steps."""
    relative = measured.relative.copy()
    relative[index, relative.shape[1] - last :] += added
    slowest = measured.slowest.copy()
    slowest[index] = np.isfinite(relative[index]) & (relative[index] >= others_max - 1e-12)
    return replace(measured, relative=relative, slowest=slowest)


def _replaced(shift: Shift, index: int, row: Shift) -> Shift:
    """``shift`` with row ``index`` replaced by the one row of ``row``."""
    out = Shift(shift.start.copy(), shift.stop.copy(), shift.effect.copy(), shift.z.copy())
    out.start[index], out.stop[index], out.effect[index], out.z[index] = (
        row.start[0],
        row.stop[0],
        row.effect[0],
        row.z[0],
    )
    return out


def undecided_pairs(measured: Measured, settings: StragglerSettings) -> list[str]:
    """Ranks with a single peer whose busy time differs from it all window by more than the allowance: with two,
    there is no majority to say which one is slow."""
    sigma = step_noise(measured.relative, settings.noise_floor)
    level = whole_level(measured.relative, sigma, settings.allowance)
    paired = peer_counts(measured) <= 2
    out = []
    for index in np.flatnonzero(paired & (level.z >= settings.z)).tolist():
        peers = _peer_rows(measured, index)
        other = int(measured.ranks[peers[0]]) if len(peers) else -1
        out.append(
            f"rank {int(measured.ranks[index])} is busy {math.exp(level.effect[index]):.2f}x as long as its only "
            f"peer, rank {other}, all window: with two ranks there is no majority to say which one is slow "
            f"(run `trainhealth probe`, or compare with a third rank doing the same work)"
        )
    return out


def _stretch(
    measured: Measured, index: int, shift: Shift, sigma: float, chance: float, settings: StragglerSettings
) -> Straggler | None:
    start, stop = int(shift.start[index]), int(shift.stop[index])
    effect, z = float(shift.effect[index]), float(shift.z[index])
    finite = np.flatnonzero(np.isfinite(measured.relative[index]))
    reaches_end = stop > finite[-1]  # nothing measured after the stretch (the last step may have no end)
    whole = start <= finite[0] and reaches_end
    if effect < (settings.allowance if whole else settings.min_effect) or z <= 0:
        return None
    window = slice(start, stop)
    row = measured.relative[index]
    outside = np.r_[row[:start], row[stop:]]
    outside = outside[np.isfinite(outside)]
    inside = row[window][np.isfinite(row[window])]
    # every step of a short stretch, most of a long one: one long step (a GC pause, a page fault) lifts a
    # stretch's mean, not its lowest step or its median
    lowest = float(np.min(inside) if len(inside) < 8 else np.median(inside)) if len(inside) else -np.inf
    typical = lowest - (float(np.median(outside)) if len(outside) else 0.0)
    if typical < (settings.allowance if whole else settings.min_effect):
        return None
    measured_steps = np.isfinite(measured.relative[index, window])
    slowest = measured.slowest[index, window][measured_steps]
    if not len(slowest):
        return None
    share = float(slowest.mean())
    if not _persistently_slowest(int(slowest.sum()), len(slowest), chance, settings):
        return None
    shape = "throughout" if whole else ("persistent" if reaches_end else "transient")
    if shape != "transient" and effect < settings.rarity * largest_elsewhere(measured.relative, index, stop - start):
        shape = "ordinary"  # other ranks of this run went as far for as long: an event, not a faulty device
    steps = tuple(int(s) for s in measured.steps[window][measured_steps])
    return _straggler(measured, index, z, effect, steps, shape, share)


@dataclass(frozen=True)
class _SlowSteps:
    """Single slow steps: far above the rank's own usual standing among its peers (so a healthy rank that is
    always a little slower has none), and the slowest of its peers there."""

    relative: np.ndarray  # relative busy time less the rank's own median
    spiking: np.ndarray  # bool (rank, step)
    excess: np.ndarray  # per rank: the summed relative busy time of its slow steps

    @classmethod
    def find(cls, measured: Measured, sigma: float, settings: StragglerSettings) -> _SlowSteps:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            relative = measured.relative - np.nanmedian(measured.relative, axis=1, keepdims=True)
        spiking = (relative > settings.spike_z * sigma) & (relative >= settings.min_effect) & measured.slowest
        return cls(relative, spiking, np.where(spiking, relative, 0.0).sum(axis=1))

    def straggler(self, measured: Measured, index: int, sigma: float, settings: StragglerSettings) -> Straggler | None:
        """The rank's slow steps as an intermittent fault: at least a few, and far more single-step slowness
        on this rank than on any other (uneven work spreads it over every rank)."""
        own = np.flatnonzero(self.spiking[index])
        others = np.delete(self.excess, index)
        if len(own) < settings.min_spikes or self.excess[index] < settings.spike_dominance * others.max(initial=0.0):
            return None
        effect = float(np.median(self.relative[index, own]))
        z = effect / sigma * math.sqrt(len(own)) / 2.0  # discounted: chosen from the largest values of the row
        steps = tuple(int(s) for s in measured.steps[own])
        return _straggler(measured, index, z, effect, steps, "intermittent", 1.0)


def _straggler(
    measured: Measured, index: int, z: float, effect: float, steps: tuple[int, ...], shape: str, share: float
) -> Straggler:
    rank = int(measured.ranks[index])
    columns = np.isin(measured.steps, steps)
    peers = _peer_rows(measured, index)
    waited = measured.waited[np.ix_(peers, columns)] if len(peers) else np.zeros((0, 0))
    others_waited = float(np.nanmedian(waited)) if waited.size and np.isfinite(waited).any() else 0.0
    return Straggler(rank, z, effect, steps, shape, share, others_waited)


def _peer_rows(measured: Measured, index: int) -> np.ndarray:
    rank = int(measured.ranks[index])
    members = {m for group in measured.groups.values() if rank in group for m in group} - {rank}
    return np.flatnonzero(np.isin(measured.ranks, sorted(members)))


def _persistently_slowest(times: int, steps: int, chance: float, settings: StragglerSettings) -> bool:
    """Slowest of its peers in most steps of the stretch, and more often than chance: in every step of a short
    stretch (a binomial tail needs more steps than a transient fault lasts), else beyond the binomial tail."""
    if steps < 1 or times < settings.min_slowest_share * steps:
        return False
    if steps < 8:
        return times == steps
    return binomial_tail(times, steps, chance) <= settings.chance
