"""GPU candidates: whose compute is slow against its peers and its own past (Holmes's straggler rule).

A collective ends for all members at once, so the member that arrived last
waited least: its operations look normal while its peers' look prolonged, and
it spends longer outside collectives. A rank is scored by its compute (recorded,
or derived from collectives) against its own other steps, where a change in the
window shows, and against its peers, where a GPU slow throughout shows. A rank
whose peers or tensor-parallel mates changed alike is not blamed (the work
changed), nor one that changed exactly when a far slower GPU did (the waiting
propagated to it).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from trainhealth._internal.localize.candidates import (
    Candidate,
    Thresholds,
    best,
    row_noise,
    rows_noise,
    steps_text,
    stretch_effect,
)
from trainhealth._internal.localize.evidence import Evidence
from trainhealth._internal.localize.excursions import (
    largest_elsewhere,
    recurrent_members,
    shape_of,
)
from trainhealth._internal.localize.stretches import (
    level,
    strongest_robust_stretch,
    strongest_stretch,
)

__all__ = ["gpu_candidates", "gpu_noise"]


def gpu_noise(evidence: Evidence, thresholds: Thresholds) -> float:
    """One step's standard deviation of a rank's compute against its own usual, as the scan judges it."""
    noise = row_noise(evidence.compute_change, thresholds.min_compute_effect / 4)
    if evidence.compute_derived:
        return float(np.median(np.maximum(noise, _step_noise(evidence.compute_change))))
    return noise


def gpu_candidates(evidence: Evidence, thresholds: Thresholds, history: Evidence | None = None) -> list[Candidate]:
    """GPUs slow in ``evidence``'s window, judged against the run (``history``: the same ranks over more steps,
    ending with the window; the window itself without one): how far the others go, and recurrence."""
    versus_peers, change = evidence.compute, evidence.compute_change
    census = (history or evidence).compute_change
    basis = "derived" if evidence.compute_derived else "compute"
    minimum = thresholds.min_compute_effect
    noise = row_noise(change, minimum / 4)
    if evidence.compute_derived:  # no per-operation median dropped its GC pauses: medians over longer stretches
        stretch = strongest_robust_stretch(
            change, np.maximum(noise, _step_noise(change)), thresholds.min_length_derived
        )
    else:
        stretch = strongest_stretch(
            change, np.isfinite(change).astype(np.float64), noise, thresholds.min_length, thresholds.decay
        )
    whole = level(
        np.nan_to_num(versus_peers),
        np.isfinite(versus_peers).astype(np.float64),
        row_noise(versus_peers, minimum / 4),
        thresholds.compute_allowance,
        thresholds.min_length,
    )
    threshold = thresholds.collectives_z if evidence.compute_derived else thresholds.gpu_z
    z, chosen = best(stretch, whole)
    z = np.where(chosen.effect >= minimum, z, 0.0)
    out: list[Candidate] = []
    stronger: list[tuple[int, int, float]] = []  # (start, stop, effect) of the candidates taken
    for index in np.argsort(-z):
        if z[index] < 0.5 * threshold or len(out) == 10:
            break
        rank = int(evidence.ranks[index])
        start, stop, effect = (int(chosen.start[index]), int(chosen.stop[index]), float(chosen.effect[index]))
        partial = stop - start < change.shape[1]
        if partial and _shared_by(change, evidence.peer_of, index, start, stop) >= 0.5 * effect:
            continue  # its peers changed alike: the work of the whole stage changed, not this GPU
        if partial and _shared_by(change, evidence.lockstep_of, index, start, stop) >= 0.5 * effect:
            continue  # its tensor-parallel mates changed alike: they wait inside collectives for a slow GPU, so
            # a change they share is the layer's work or its waiting outside collectives, not one GPU
        if _echo(start, stop, effect, stronger, change.shape[1]):
            continue  # it changed when a far slower GPU did: the irregularity propagated to it
        stronger.append((start, stop, effect))
        shape = "throughout" if not partial else shape_of(change[index], start, stop)
        if shape != "transient":
            elsewhere = (
                float(np.delete(whole.effect, index).max(initial=0.0))
                if not partial
                else largest_elsewhere(census, index, stop - start)
            )
            shape = shape if effect >= thresholds.rarity * elsewhere else "ordinary"
        text = _gpu_evidence(evidence, index, basis, start, stop, effect, float(z[index]), shape)
        out.append(
            Candidate(
                "gpu",
                f"gpu:rank-{rank}",
                (rank,),
                evidence.hosts.get(rank),
                float(z[index]),
                text,
                basis,
                math.exp(effect),
                None if not partial else int(evidence.steps[start]),
                shape,
            )
        )
    return out + _recurrent(
        history or evidence, census, threshold, thresholds, basis, {c.ranks[0] for c in out if c.blamable}
    )


def _recurrent(
    evidence: Evidence, change: np.ndarray, threshold: float, thresholds: Thresholds, basis: str, blamed: set[int]
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
        rank = int(evidence.ranks[index])
        if rank in blamed:
            continue
        slow = np.zeros(change.shape[1], dtype=bool)
        for start, stop in found:
            slow[start:stop] = True
        effect = float(np.nanmedian(change[index, slow]))
        z = effect / own[index] * math.sqrt(slow.sum()) / 2.0  # discounted: the episodes are the row's largest
        if z < threshold:
            continue
        where = ", ".join(f"{evidence.steps[a]}-{evidence.steps[b - 1]}" for a, b in found[:6])
        text = (
            f"computes {math.exp(effect):.2f}x as long as usual in {len(found)} separate episodes (steps {where}"
            f"{', ...' if len(found) > 6 else ''}; z={z:.1f}), far more than episodes falling on random GPUs of "
            f"this run would give one GPU: a recurrent fault"
        )
        out.append(
            Candidate(
                "gpu",
                f"gpu:rank-{rank}",
                (rank,),
                evidence.hosts.get(rank),
                z,
                text,
                basis,
                math.exp(effect),
                int(evidence.steps[found[0][0]]),
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


def _gpu_evidence(
    evidence: Evidence, index: int, what: str, start: int, stop: int, effect: float, z: float, shape: str = "persistent"
) -> str:
    steps = steps_text(evidence, start, stop)
    if what == "compute":
        head = f"computes {np.exp(effect):.2f}x as long as its data-parallel peers {steps}"
    else:
        head = f"spends {np.exp(effect):.2f}x as long outside collectives (computing) as its peers {steps}"
    text = (
        f"{head} (z={z:.1f}); its collectives look normal while its peers wait for it "
        f"(last to arrive in {evidence.last_share[index]:.0%} of them)"
    )
    return text + _SHAPE_NOTE.get(shape, "")


#: what an event's evidence adds: why it pages nobody
_SHAPE_NOTE = {
    "transient": "; it came and went: an event, not a faulty device",
    "ordinary": "; other GPUs of this run went as far for as long: an event, not a faulty device",
}


def _step_noise(values: np.ndarray) -> np.ndarray:
    """Per row, one step's standard deviation from its step-to-step changes (robust: a fault that starts or
    ends moves one change, not the spread); some ranks' timings are noisier than others'."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nan_to_num(1.4826 * np.nanmedian(np.abs(np.diff(values, axis=1)), axis=1) / np.sqrt(2), nan=0.0)
