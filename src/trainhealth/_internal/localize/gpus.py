"""GPU candidates: whose compute is slow against its peers and its own past (Holmes's straggler rule).

A collective ends for all members at once, so the member that arrived last
waited least: its operations look normal while its peers' look prolonged, and
it spends longer outside collectives. A fault takes one of three forms in the
window judged, each scored as a z-value:

* a **change inside the window**: a stretch of steps in which the rank computes
  longer than in its own other steps;
* a **change in the history** that lasts through the window: with ``history``
  (the steps the job ran before the window, ``trainhealth analyze --history``),
  the rank has computed longer than its own usual since an onset before the
  window (a fault named for as long as it lasts, not only in the window it began);
* a **level**: longer than its peers all window, beyond the allowance for
  healthy differences between GPUs, once what its whole replica shares in each
  step (a longer micro-batch, uneven work) is taken out.

A rank whose peers or tensor-parallel mates changed alike is not blamed (the
work changed), nor one that changed exactly when a far slower GPU did (the
waiting propagated to it). :func:`gpu_power` measures what the window could
have blamed by the same rules: copies of ranks' rows with a slowdown injected,
in each form, judged as the ranks are.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from trainhealth._internal.localize.candidates import (
    BLAMABLE_SHAPES,
    Candidate,
    Thresholds,
    best,
    row_noise,
    rows_noise,
    stretch_effect,
)
from trainhealth._internal.localize.excursions import RunCensus, recurrent_members, shape_of
from trainhealth._internal.localize.power import Power, probe_rows, smallest_detected
from trainhealth._internal.localize.stretches import (
    Stretch,
    level,
    ongoing_stretch,
    strongest_robust_stretch,
    strongest_stretch,
)
from trainhealth._internal.localize.timings import Timings
from trainhealth._internal.localize.wording import Basis, gpu_sentence, recurrent_gpu_sentence

__all__ = ["gpu_candidates", "gpu_power"]


def gpu_candidates(timings: Timings, thresholds: Thresholds, history: Timings | None = None) -> list[Candidate]:
    """GPUs slow in ``timings``'s window, judged against the run (``history``: the same ranks over more steps,
    ending with the window; the window itself without one): how far the others go, and recurrence."""
    judge = _Judge(timings, thresholds, history)
    rows = judge.rows()
    scored = judge.score(rows)
    z = scored.z
    out: list[Candidate] = []
    stronger: list[tuple[int, int, float]] = []  # (start, stop, effect) of the window stretches taken
    for index in np.argsort(-z):
        if z[index] < 0.5 * judge.threshold or len(out) == 10:
            break
        found = judge.judge(rows, scored, int(index), stronger)
        if found is not None:
            out.append(found)
    return out + _recurrent(
        judge.run,
        judge.run.compute_change,
        judge.threshold,
        thresholds,
        judge.basis,
        {c.ranks[0] for c in out if c.blamable},
    )


def gpu_power(
    timings: Timings, thresholds: Thresholds, history: Timings | None = None, found: Iterable[int] = ()
) -> Power:
    """The smallest slowdown of one GPU this window blames in every injection (:mod:`.power`), in both forms a fault
    takes in a live window: slow in its last ``power_steps`` steps (an onset inside the window), and slow all
    window (its onset in the history, when there is one; else against its peers). Each injection is a copy of
    one rank's rows with the slowdown added, judged by :func:`gpu_candidates`' rules against this window's own
    noise and run; up to :data:`.power.PROBES` ranks, evenly spread, are tried, but not the ranks in ``found``
    (a slow stretch of their own in this window, an event or a fault: that finding speaks for them).

    >>> from trainhealth._internal.simulator.cluster import ClusterLayout
    >>> from trainhealth._internal.simulator.scenario import Scenario
    >>> from trainhealth._internal.simulator.simulate import simulate
    >>> from trainhealth._internal.localize.timings import gather_timings
    >>> trace = simulate(Scenario(ClusterLayout(dp=4, pp=2, tp=2), steps=40, seed=1))
    >>> power = gpu_power(gather_timings(trace.records), Thresholds())
    >>> 1.0 < power.slowdown < 1.5, power.steps, power.injections
    (True, 10, 16)
    """
    judge = _Judge(timings, thresholds, history)
    n_steps = len(timings.steps)
    length = max(2, min(thresholds.power_steps, n_steps // 2))
    probes = judge.probes(set(found))
    onset = judge.detectable(probes, length)
    throughout = judge.detectable(probes, n_steps)
    return Power(max(onset, throughout), length, judge.noise, onset, throughout, len(probes))


@dataclass(frozen=True)
class _Rows:
    """The series judged: one row per rank, or per injected copy of one (``source``: the rank's row)."""

    source: np.ndarray
    change: np.ndarray  # the window: log compute relative to the rank's own usual
    versus_peers: np.ndarray  # the window: log compute relative to its peers, its replica's share taken out
    history: np.ndarray | None  # the history's change, ending with the window (None without one)


@dataclass(frozen=True)
class _Scored:
    """Per row: the strongest form's stretch (in the history's steps where ``in_history``) and z-value."""

    stretch: Stretch
    z: np.ndarray
    in_history: np.ndarray


class _Judge:
    """What every row is judged against: the window's noise, the run's census, the peers' own changes."""

    def __init__(self, timings: Timings, thresholds: Thresholds, history: Timings | None) -> None:
        self.timings = timings
        self.thresholds = thresholds
        self.history = history if history is not None and len(history.steps) > len(timings.steps) else None
        self.run = self.history or timings
        self.derived = timings.compute_derived
        self.basis: Basis = "derived" if self.derived else "compute"
        self.threshold = thresholds.collectives_z if self.derived else thresholds.gpu_z
        minimum = thresholds.min_compute_effect
        change = timings.compute_change
        self.noise = row_noise(change, minimum / 4)
        if self.derived:
            self.noise = float(np.median(np.maximum(self.noise, _step_noise(change))))
        self.robust_noise = np.maximum(row_noise(change, minimum / 4), _step_noise(change))
        self.within = _within_replicas(timings.compute, timings.replica_of)
        self.level_noise = row_noise(self.within, minimum / 4)
        self.history_noise = row_noise(self.history.compute_change, minimum / 4) if self.history else 0.0
        self.census = RunCensus(self.run.compute_change)
        self.levels = self._level(self.within).effect  # each rank's level, for the rarity of a level
        self._shared: dict[tuple[str, int, int, int], float] = {}

    def rows(self) -> _Rows:
        history = self.history.compute_change if self.history is not None else None
        return _Rows(np.arange(len(self.timings.ranks)), self.timings.compute_change, self.within, history)

    def _level(self, versus_peers: np.ndarray) -> Stretch:
        return level(
            np.nan_to_num(versus_peers),
            np.isfinite(versus_peers).astype(np.float64),
            self.level_noise,
            self.thresholds.compute_allowance,
            self.thresholds.min_length,
        )

    def score(self, rows: _Rows) -> _Scored:
        """Each row's strongest form: a change in the window, its level, a change since an onset in the history."""
        thresholds = self.thresholds
        if self.derived:  # no per-operation median dropped its GC pauses: medians over longer stretches
            stretch = strongest_robust_stretch(
                rows.change, self.robust_noise[rows.source], thresholds.min_length_derived
            )
        else:
            stretch = strongest_stretch(
                rows.change,
                np.isfinite(rows.change).astype(np.float64),
                self.noise,
                thresholds.min_length,
                thresholds.decay,
            )
        z, chosen = best(stretch, self._level(rows.versus_peers))
        # a fault now matters more than a stronger one that ended: a later stretch to the window's end that blames
        n_steps = rows.change.shape[1]
        ended = chosen.stop < n_steps
        columns = np.arange(n_steps)
        hidden = ended[:, None] & (columns >= chosen.start[:, None]) & (columns < chosen.stop[:, None])
        now = ongoing_stretch(
            np.where(hidden, np.nan, rows.change), self.noise, thresholds.min_length, thresholds.min_length
        )
        later = ended & (now.start >= chosen.stop) & (now.z >= self.threshold)
        z = np.where(later, now.z, z)
        chosen = Stretch(*(np.where(later, new, old) for new, old in zip(_fields(now), _fields(chosen))))
        in_history = np.zeros(len(z), dtype=bool)
        if rows.history is not None:
            window = rows.change.shape[1]
            ongoing = ongoing_stretch(rows.history, self.history_noise, inside=window, outside=window)
            # an onset inside the window is the window's own stretch: the history's would dilute it over the window
            onset_here = (chosen.stop == window) & (chosen.start > 0) & (z >= self.threshold)
            in_history = (ongoing.z > z) & ~onset_here
            z = np.where(in_history, ongoing.z, z)
            chosen = Stretch(*(np.where(in_history, new, old) for new, old in zip(_fields(ongoing), _fields(chosen))))
        z = np.where(chosen.effect >= thresholds.min_compute_effect, z, 0.0)
        return _Scored(chosen, z, in_history)

    def judge(
        self, rows: _Rows, scored: _Scored, index: int, stronger: list[tuple[int, int, float]] | None = None
    ) -> Candidate | None:
        """The candidate a row makes, with its shape (None: its peers or mates changed alike, or it echoes a
        stronger candidate); ``stronger`` collects the window stretches taken, strongest first."""
        source = int(rows.source[index])
        start, stop = int(scored.stretch.start[index]), int(scored.stretch.stop[index])
        effect, z = float(scored.stretch.effect[index]), float(scored.z[index])
        since: int | None
        what: Basis
        if scored.in_history[index]:
            assert rows.history is not None and self.history is not None
            if self._shared_change("history", source, start, stop) >= 0.5 * effect:
                return None
            shape = self._rare(shape_of(rows.history[index], start, stop), effect, source, stop - start)
            where, since, what = self.history, int(self.history.steps[start]), "own"
        else:
            partial = stop - start < rows.change.shape[1]
            if partial and self._shared_change("window", source, start, stop) >= 0.5 * effect:
                return None
            if stronger is not None and _echo(start, stop, effect, stronger, rows.change.shape[1]):
                return None  # it changed when a far slower GPU did: the irregularity propagated to it
            if stronger is not None:
                stronger.append((start, stop, effect))
            if partial:
                shape = self._rare(shape_of(rows.change[index], start, stop), effect, source, stop - start)
            else:
                elsewhere = float(np.delete(self.levels, source).max(initial=0.0))
                shape = "throughout" if effect >= self.thresholds.rarity * elsewhere else "ordinary"
            where, what = self.timings, self.basis if partial else "peers"
            since = int(self.timings.steps[start]) if partial else None
        rank = int(self.timings.ranks[source])
        last_share = float(self.timings.last_share[source])
        text = gpu_sentence(where.steps, last_share, what, self.derived, start, stop, effect, z, shape)
        return Candidate(
            "gpu",
            f"gpu:rank-{rank}",
            (rank,),
            self.timings.hosts.get(rank),
            z,
            text,
            self.basis,
            math.exp(effect),
            since,
            shape,
            int(where.steps[stop - 1]) if shape == "transient" else None,
        )

    def _rare(self, shape: str, effect: float, source: int, length: int) -> str:
        """A persistent stretch as far as other members of the run go for as long is ordinary (an event)."""
        if shape == "transient" or effect >= self.thresholds.rarity * self.census.elsewhere(source, length):
            return shape
        return "ordinary"

    def _shared_change(self, where: str, source: int, start: int, stop: int) -> float:
        """The larger change of the rank's peers and of its tensor-parallel mates over the stretch: a change they
        share is the stage's work, or the waiting of a layer's shards outside collectives, not one GPU."""
        key = (where, source, start, stop)
        if key not in self._shared:
            change = self.timings.compute_change if where == "window" else self.run.compute_change
            self._shared[key] = max(
                _shared_by(change, self.timings.peer_of, source, start, stop),
                _shared_by(change, self.timings.lockstep_of, source, start, stop),
            )
        return self._shared[key]

    def probes(self, skip: set[int]) -> np.ndarray:
        """The ranks slowdowns are injected into (:func:`.power.probe_rows`), but those in ``skip``."""
        change = self.timings.compute_change
        kept = ~np.isin(self.timings.ranks, sorted(skip))
        return np.flatnonzero(kept)[probe_rows(change[kept])]

    def detectable(self, probes: np.ndarray, length: int) -> float:
        """The smallest slowdown blamed in every probe when added to their last ``length`` steps
        (:func:`.power.smallest_detected`); infinite when none is."""
        if not len(probes):
            return math.inf

        def blamed(slowdown: float) -> np.ndarray:
            rows = self._injected(probes, math.log(slowdown), length)
            scored = self.score(rows)
            out = np.zeros(len(probes), dtype=bool)
            for index in np.flatnonzero(scored.z >= self.threshold):
                found = self.judge(rows, scored, int(index))
                out[index] = found is not None and found.shape in BLAMABLE_SHAPES
            return out

        return smallest_detected(blamed)

    def _injected(self, probes: np.ndarray, added: float, length: int) -> _Rows:
        """Copies of the probes' rows with ``added`` (a log slowdown) in their last ``length`` steps: in the change
        where the rank's usual lies outside them (a shorter stretch, or the history), and in the level against
        its peers."""
        n_steps = self.timings.compute_change.shape[1]
        source = probes
        last = np.zeros(n_steps, dtype=bool)
        last[n_steps - length :] = True
        change = self.timings.compute_change[source].copy()
        if length < n_steps or self.history is not None:
            change += added * last
        versus_peers = self.within[source] + added * last
        history = None
        if self.history is not None:
            history = self.history.compute_change[source].copy()
            history[:, -length:] += added
        return _Rows(source, change, versus_peers, history)


def _fields(stretch: Stretch) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return stretch.start, stretch.stop, stretch.effect, stretch.z


def _within_replicas(versus_peers: np.ndarray, replica_of: np.ndarray) -> np.ndarray:
    """Each rank's compute against its peers, less the median of its replica's ranks in the step (replicas of
    three or more: a median of two would split a fault): uneven work moves a whole replica, a slow GPU one rank."""
    large = np.bincount(replica_of)[replica_of] >= 3
    if not large.any():
        return versus_peers
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        shared = pd.DataFrame(versus_peers[large]).groupby(replica_of[large]).transform("median").to_numpy()
    out = versus_peers.copy()
    out[large] = versus_peers[large] - np.nan_to_num(shared)
    return out


def _recurrent(
    timings: Timings, change: np.ndarray, threshold: float, thresholds: Thresholds, basis: str, blamed: set[int]
) -> list[Candidate]:
    """GPUs slow in episode after episode (:func:`.excursions.recurrent_members`), each episode alone an event."""
    # episodes of two-step means, each GPU's standing out from its own noise (MoE routing skew and uneven packs
    # make some noisier): four standard errors of a two-step mean
    own = rows_noise(change, thresholds.min_compute_effect / 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # rows without values
        paired = np.nanmean(np.stack([change[:, :-1], change[:, 1:]]), axis=0)
    level = np.maximum(thresholds.recurrent_effect, 4.0 * own / math.sqrt(2))
    out = []
    for index, found in recurrent_members(
        paired,
        level,
        thresholds.recurrent_episodes,
        thresholds.false_blame,
        thresholds.min_length - 1,
        rarity=thresholds.rarity,
    ).items():
        found = [(start, stop + 1) for start, stop in found]  # a two-step mean covers its next step too
        rank = int(timings.ranks[index])
        if rank in blamed:
            continue
        slow = np.zeros(change.shape[1], dtype=bool)
        for start, stop in found:
            slow[start:stop] = True
        effect = float(np.nanmedian(change[index, slow]))
        z = effect / own[index] * math.sqrt(slow.sum()) / 2.0  # discounted: the episodes are the row's largest
        if z < threshold:
            continue
        text = recurrent_gpu_sentence(timings.steps, found, effect, z)
        out.append(
            Candidate(
                "gpu",
                f"gpu:rank-{rank}",
                (rank,),
                timings.hosts.get(rank),
                z,
                text,
                basis,
                math.exp(effect),
                int(timings.steps[found[0][0]]),
                "recurrent",
            )
        )
    return out


def _echo(start: int, stop: int, effect: float, stronger: list[tuple[int, int, float]], steps: int) -> bool:
    """Whether a stretch changes at the same steps as a stronger candidate's (or is its complement) with at
    most half its effect: the waiting a straggler causes shows up on others at the moments it starts and ends."""
    for other_start, other_stop, other_effect in stronger:
        same = abs(start - other_start) <= 1 and abs(stop - other_stop) <= 1
        complement = (start == 0 and abs(stop - other_start) <= 1) or (stop == steps and abs(start - other_stop) <= 1)
        if (same or complement) and effect <= 0.5 * other_effect:
            return True
    return False


def _shared_by(change: np.ndarray, group_of: np.ndarray, index: int, start: int, stop: int) -> float:
    """The median change of the other ranks in its group in steps [start, stop) over the rest of the window."""
    peers = np.flatnonzero(group_of == group_of[index])
    peers = peers[peers != index]
    if not len(peers):
        return 0.0
    return stretch_effect(change[peers], start, stop)


def _step_noise(values: np.ndarray) -> np.ndarray:
    """Per row, one step's standard deviation from its step-to-step changes (robust: a fault that starts or
    ends moves one change, not the spread); some ranks' timings are noisier than others'."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nan_to_num(1.4826 * np.nanmedian(np.abs(np.diff(values, axis=1)), axis=1) / np.sqrt(2), nan=0.0)
