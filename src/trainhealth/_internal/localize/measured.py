"""Localization from measured compute and arrivals: traces of real jobs (step markers, collectives).

The path for traces that record each rank's steps and collectives but not every
forward and backward pass — what ``trainhealth.comm`` and the Monitor write on a
real job. Without step markers the iterations are inferred from the repeating
pattern of collectives; when neither works, or the window is too short to tell
a fault from noise, the answer is "insufficient data" with the reason.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from trainhealth._internal.localize.candidates import Candidate, Thresholds
from trainhealth._internal.localize.iterations import infer_steps, needs_inference
from trainhealth._internal.localize.jobwide import job_wide_slowdown
from trainhealth._internal.localize.links import LinkSettings, find_slow_paths
from trainhealth._internal.localize.power import Power, uncovered_ranks
from trainhealth._internal.localize.stragglers import (
    Straggler,
    StragglerSettings,
    find_stragglers,
    straggler_power,
    undecided_pairs,
)
from trainhealth._internal.localize.waits import Measured, measure
from trainhealth._internal.localize.wording import explained_path_note, slow_path_sentence, straggler_sentence
from trainhealth._internal.traces.topology import Topology

__all__ = ["MIN_STEPS", "WARMUP_STEPS", "MeasuredAnalysis", "analyze_measured"]

#: steps a window needs before a fault can be told from noise
MIN_STEPS = 6
#: a job's first steps, left out as warm-up when the window has enough after them
WARMUP_STEPS = 3
#: a stage (peer group) whose ranks are busy this much longer than the median stage's, on every replica: uneven stages
_STAGE_IMBALANCE = math.log(1.10)
#: work that moves between peers by this much from step to step is uneven (sequence lengths, data): on the lab's
#: development seeds clean runs on 2 shared cores moved by 1-8%, sequence-length controls by 15-30%; set
#: above both, a clean run on a busier machine is not called uneven (the controls are then healthy: nobody is
#: blamed either way)
_MOVING_WORK = math.log(1.25)


@dataclass(frozen=True)
class MeasuredAnalysis:
    candidates: tuple[Candidate, ...]
    imbalance: tuple[str, ...]
    irregular_steps: tuple[int, ...]
    details: dict[str, Any]
    insufficient: str | None = None  # why the window cannot support a verdict
    power: Power | None = None  # what the window could have seen
    uncovered: tuple[int, ...] = ()  # ranks without measurements in most of the window
    undecided: tuple[str, ...] = ()  # why nobody is blamed and yet the window cannot be called healthy


def analyze_measured(records: pd.DataFrame, topology: Topology | None, thresholds: Thresholds) -> MeasuredAnalysis:
    details: dict[str, Any] = {}
    if needs_inference(records):
        inferred = infer_steps(records)
        if inferred.records is None:
            return MeasuredAnalysis(
                (),
                (),
                (),
                {"evidence_source": "collectives"},
                f"no step markers and no repeating pattern of collectives: {inferred.problem}",
            )
        records = inferred.records
        details["steps_inferred"] = {"collectives_per_step": sorted(set(inferred.period.values()))}
    records = _without_warmup(records)
    hosts = topology.hosts if topology else None
    measured = measure(records, hosts)
    usable = int(np.isfinite(measured.step_time).any(axis=0).sum())
    details["evidence_source"] = "step markers and collectives" if measured.markers else "collectives (steps inferred)"
    details["window"] = {
        "steps": [int(measured.steps[0]), int(measured.steps[-1])] if len(measured.steps) else [],
        "ranks": len(measured.ranks),
        "median_step_seconds": round(_median(measured.step_time), 6),
    }
    if usable < MIN_STEPS:
        return MeasuredAnalysis(
            (),
            (),
            (),
            details,
            f"{usable} measured steps; at least {MIN_STEPS} are needed to tell a slow device from noise",
        )
    if not measured.groups:
        return MeasuredAnalysis(
            (),
            (),
            (),
            details,
            "no collective has two or more members in the trace: there are no peers to compare ranks with",
        )
    settings = StragglerSettings(z=thresholds.straggler_z, rarity=thresholds.rarity)
    job_wide = job_wide_slowdown(measured.busy, measured.steps)  # busy: a straggler's peers wait, not compute
    if job_wide is not None:  # steps every rank was slow in say nothing of one device
        measured = _without_steps(measured, job_wide.first_step, job_wide.last_step)
    found, compute_noise = find_stragglers(measured, settings)
    power = straggler_power(measured, settings, thresholds.power_steps, {s.rank for s in found if s.z >= settings.z})
    expected = (
        {int(r) for members in topology.groups.values() for r in members} if topology and topology.groups else None
    )
    uncovered = uncovered_ranks(measured.ranks, measured.busy, expected)
    candidates = [
        Candidate(
            "gpu",
            f"gpu:rank-{s.rank}",
            (s.rank,),
            measured.hosts.get(s.rank),
            s.z,
            straggler_sentence(s, int(measured.steps[-1])),
            "measured",
            math.exp(s.effect),
            None if s.shape == "throughout" else s.steps[0],
            s.shape,
            s.steps[-1] if s.shape == "transient" else None,
        )
        for s in found
    ]
    paths, transfer_noise = find_slow_paths(measured, LinkSettings(z=thresholds.path_z))
    blamed = [s for s in found if s.z >= thresholds.straggler_z]
    notes = []
    for path in paths:
        explaining = {s.rank for s in blamed if s.rank in path.ranks and _same_time(s, path.since, measured.steps)}
        if explaining:
            # a straggler's own collectives slowed with it (a starved CPU runs its communication threads late
            # too): the device explains them, they are no second fault
            notes.append(explained_path_note(path.component, path.effect, sorted(explaining)))
            continue
        candidates.append(
            Candidate(
                "link",
                path.component,
                path.ranks,
                measured.hosts.get(path.ranks[0]) if len(path.ranks) == 1 else None,
                path.z,
                slow_path_sentence(path),
                "measured-path",
                math.exp(path.effect),
                path.since,
                "throughout" if path.since is None else "persistent",
            )
        )
    if notes:
        details["notes"] = notes
    if job_wide is not None:
        details["job_wide"] = job_wide.to_dict()
    details["noise"] = {"compute_per_step": round(compute_noise, 4), "transfer_per_step": round(transfer_noise, 4)}
    details["compute_and_wait"] = _compute_and_wait(measured)
    irregular = _irregular_steps(measured)
    return MeasuredAnalysis(
        tuple(candidates),
        tuple(_imbalance(measured)),
        irregular,
        details,
        None,
        power,
        uncovered,
        tuple(undecided_pairs(measured, settings)),
    )


def _without_steps(measured: Measured, first: int, last: int) -> Measured:
    """``measured`` with the ranks' relative busy time in steps ``first``-``last`` left out."""
    columns = (measured.steps >= first) & (measured.steps <= last)
    return replace(
        measured,
        relative=np.where(columns, np.nan, measured.relative),
        slowest=measured.slowest & ~columns,
    )


def _same_time(straggler: Straggler, since: int | None, steps: np.ndarray) -> bool:
    """Whether the straggler was slow in most of the steps the path was (from the path's onset, or all window): a
    straggler of a few late steps explains no link that slowed long before."""
    path_steps = steps[steps >= since] if since is not None else steps
    return straggler.shape == "throughout" or np.isin(straggler.steps, path_steps).sum() >= 0.5 * len(path_steps)


def _without_warmup(records: pd.DataFrame) -> pd.DataFrame:
    """A job's first steps (allocations, first-touch, DDP building its buckets, caches filling) say nothing
    of anyone's health: when the window begins at step 0, its first :data:`WARMUP_STEPS` are left out."""
    steps = records["step"]
    if (steps == 0).any():
        kept = steps >= WARMUP_STEPS
        if steps[kept].nunique() >= 2 * MIN_STEPS:
            return records[kept]
        if steps.nunique() > MIN_STEPS:
            return records[steps != 0]
    return records


def _median(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if len(finite) else 0.0


def _compute_and_wait(measured: Measured) -> list[dict[str, Any]]:
    """Per rank: median seconds per step busy (computing) and waiting for others, the live view's columns; None
    for a rank whose steps were not measured (no step markers on it while others have them), never 0."""
    out = []
    for index, rank in enumerate(measured.ranks):
        busy, waited = measured.busy[index], measured.waited[index]
        seen = bool(np.isfinite(busy).any())
        out.append(
            {
                "rank": int(rank),
                "compute_seconds": round(_median(busy), 6) if seen else None,
                "wait_seconds": round(_median(waited), 6) if seen else None,
                "slowest_share": round(float(measured.slowest[index].mean()), 3),
            }
        )
    return out


def _irregular_steps(measured: Measured) -> tuple[int, ...]:
    """Steps whose time stands out from the window's (by more than 5% and four robust sigmas)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # steps no rank measured
        per_step = np.log(np.nanmedian(measured.step_time, axis=0))
    finite = np.isfinite(per_step)
    if finite.sum() < 3:
        return ()
    centre = float(np.median(per_step[finite]))
    spread = 1.4826 * float(np.median(np.abs(per_step[finite] - centre)))
    limit = centre + max(4.0 * spread, math.log(1.05))
    return tuple(int(s) for s in measured.steps[finite & (per_step > limit)])


def _imbalance(measured: Measured) -> list[str]:
    reasons = []
    components = _peer_components(measured)
    if len(set(components.values())) >= 2:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            typical = np.log(np.nanmedian(measured.busy, axis=1))
        per_component = pd.Series(typical).groupby([components.get(int(r), -1) for r in measured.ranks]).median()
        centre = float(per_component.median())
        longest = per_component.idxmax()
        if per_component.max() - centre >= _STAGE_IMBALANCE:
            ranks = sorted(int(r) for r in measured.ranks if components.get(int(r)) == longest)
            reasons.append(
                f"uneven stages: ranks {', '.join(map(str, ranks[:8]))} are busy "
                f"{math.exp(per_component.max() - centre):.2f}x as long per step as the median stage, "
                f"on every replica alike (no single device)"
            )
    spread = _spread(measured.relative)
    if spread >= _MOVING_WORK:
        share = measured.slowest.mean(axis=1)
        top = np.argsort(-share)[:3]
        shown = ", ".join(f"rank {int(measured.ranks[i])} {share[i]:.0%}" for i in top)
        reasons.append(
            f"uneven work: ranks' compute differs by {math.exp(spread) - 1:.0%} from step to step and the "
            f"slowest rank changes (slowest in: {shown}), as varying sequence lengths or data do"
        )
    return reasons


def _spread(relative: np.ndarray) -> float:
    """How much a rank's busy time moves against its peers' from step to step: 1.4826 * MAD of the relative
    busy time around each rank's own median (a rank that is always a little slower moves nothing)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        centred = relative - np.nanmedian(relative, axis=1, keepdims=True)
    centred = np.abs(centred[np.isfinite(centred)])
    return 1.4826 * float(np.median(centred)) if len(centred) else 0.0


def _peer_components(measured: Measured) -> dict[int, int]:
    """Ranks joined by symmetric collectives (the ranks doing the same work) get one component number."""
    parent = {int(r): int(r) for r in measured.ranks}

    def root(rank: int) -> int:
        while parent[rank] != rank:
            parent[rank] = parent[parent[rank]]
            rank = parent[rank]
        return rank

    for members in measured.groups.values():
        first = root(members[0])
        for member in members[1:]:
            parent[root(member)] = first
    return {rank: root(rank) for rank in parent}
