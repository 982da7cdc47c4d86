"""Root-cause localization of iteration-time irregularities from collective timings.

The rules are Holmes's (NSDI'25), applied to whole windows of steps with numpy:

1. **Compute.** In a prolonged collective, the member whose operation looks
   normal while the others' look prolonged is the straggler: they were waiting
   for it. Its compute times (recorded, or the time it spends outside
   collectives) stand out against its data-parallel peers and its own past;
   the waiting of other stages stays inside their sends and receives.
2. **Communication.** When every member's operation is prolonged — the last
   arrival's too, which did not wait — the path is slow. The transfers that
   cross each NIC, host and leaf switch are scored; a slow switch or host
   explains the transfers of all the NICs behind it, so the widest component
   that explains the slow transfers is named.
3. **Across iterations.** Slowness is accumulated over the window: for every
   candidate the strongest slow stretch of consecutive steps against the rest of
   the window (recent steps weighted more, by ``decay``), or its level over the
   whole window when it was slow throughout. Candidates are ranked by it.
4. **Imbalance is no one's fault.** Uneven work — a longer last pipeline stage,
   longer sequences in one replica — moves whole stages or replicas; it is
   compared between peers and replicas and reported as imbalance, never blamed
   on a GPU.

>>> from trainhealth._internal.simulator.cluster import ClusterLayout
>>> from trainhealth._internal.simulator.scenario import Scenario, cluster_fault
>>> from trainhealth._internal.simulator.simulate import simulate
>>> layout = ClusterLayout(dp=4, pp=2, tp=2)
>>> trace = simulate(Scenario(layout, steps=12, faults=(cluster_fault(layout, "gpu", 5, 1.5, step=6),), seed=3))
>>> result = localize(trace.records, trace.topology)
>>> result.verdict, result.suspects[0].component
('compute', 'gpu:rank-5')
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from trainhealth._internal.knowledge.advice import advice_for
from trainhealth._internal.localize.candidates import Candidate, Thresholds
from trainhealth._internal.localize.gpus import gpu_candidates, gpu_power
from trainhealth._internal.localize.imbalance import imbalance_reasons
from trainhealth._internal.localize.iterations import needs_inference
from trainhealth._internal.localize.jobwide import job_wide_slowdown
from trainhealth._internal.localize.measured import MIN_STEPS, analyze_measured
from trainhealth._internal.localize.paths import path_candidates
from trainhealth._internal.localize.power import Power, uncovered_ranks
from trainhealth._internal.localize.result import LocalizationResult, Suspect, past_text
from trainhealth._internal.localize.timings import gather_timings, last_steps, without_steps
from trainhealth._internal.localize.wording import probe_sentence
from trainhealth._internal.traces.topology import Topology

__all__ = ["Analysis", "Candidate", "Thresholds", "analyze", "decide", "localize"]


@dataclass(frozen=True)
class Analysis:
    """Everything the verdict is decided from (see :func:`decide`)."""

    candidates: tuple[Candidate, ...]
    imbalance: tuple[str, ...]  # reasons to call the irregularity uneven work
    irregular_steps: tuple[int, ...]
    details: dict[str, Any]
    insufficient: str | None = None  # why the window cannot support a verdict
    power: Power | None = None  # what the window could have seen (None: not measured)
    uncovered: tuple[int, ...] = ()  # ranks without measurements in most of the window
    undecided: tuple[str, ...] = ()  # why nobody is blamed and yet the window cannot be called healthy


def localize(
    records: pd.DataFrame,
    topology: Topology | Mapping[str, Any] | None = None,
    thresholds: Thresholds | None = None,
    probe: Any = None,
    judge_last: int | None = None,
    usual_before: int | None = None,
) -> LocalizationResult:
    """Localize the cause of irregular steps in ``records`` (trace format v1, canonical dtypes).

    ``probe`` is a :class:`trainhealth._internal.exporters.collectives.probe.ProbeResult` (or ``None``): a pairwise link
    measurement that names the slow link where timings alone can only say "communication". With
    ``judge_last``, only the last ``judge_last`` steps are judged, and the steps before them are the run's
    history: each rank's usual, how far healthy members go, and recurrence come from all of them (what a live
    analyzer does: ``trainhealth analyze --last 20 --history 200``); steps numbered below ``usual_before`` are the
    run's usual level, read from before the history (:mod:`.history`).
    """
    thresholds = thresholds or Thresholds()
    return decide(analyze(records, topology, thresholds, probe, judge_last, usual_before), thresholds)


def recorded_passes(records: pd.DataFrame) -> bool:
    """True for traces the recorded path reads: no step markers, and either the compute is timed itself (every
    forward and backward pass from the simulator or a profiler, or each step's compute from the Prometheus
    source), or the steps are numbered and every collective blocks the training thread (no ``async`` rows), so
    the gaps between a step's collectives are its compute. DDP buckets run beside backward (``async``), and
    such gaps are then near zero: those traces, and traces with markers, take the measured path."""
    ops = set(records["op"].unique())
    if "step" in ops:
        return False
    if ops & {"backward", "compute"}:
        return True
    running_beside = "async" in records.columns and bool(records["async"].fillna(False).astype(bool).any())
    return not running_beside and not needs_inference(records)


def analyze(
    records: pd.DataFrame,
    topology: Topology | Mapping[str, Any] | None,
    thresholds: Thresholds,
    probe: Any = None,
    judge_last: int | None = None,
    usual_before: int | None = None,
) -> Analysis:
    """Score every candidate GPU and network component, and look for uneven work (in the last ``judge_last``
    steps against the history before them, when given; see :func:`localize`)."""
    if isinstance(topology, Mapping):
        topology = Topology.from_dict(dict(topology))
    if records.empty:
        return Analysis((), (), (), {}, "the trace window is empty")
    if judge_last is not None and judge_last < 1:
        raise ValueError("judge_last must be at least 1")
    if not recorded_passes(records):
        if judge_last is not None:  # the measured path judges its window alone
            records = records[records["step"].isin(np.sort(records["step"].unique())[-judge_last:])]
        analysis = _measured(records, topology, thresholds)
    else:
        analysis = _recorded(records, topology, thresholds, judge_last, usual_before)
    return _with_probe(analysis, probe) if probe is not None else analysis


def _measured(records: pd.DataFrame, topology: Topology | None, thresholds: Thresholds) -> Analysis:
    found = analyze_measured(records, topology, thresholds)
    details = dict(found.details)
    if topology is not None and topology.simulated:
        details["simulated"] = True
    return Analysis(
        found.candidates,
        found.imbalance,
        found.irregular_steps,
        details,
        found.insufficient,
        found.power,
        found.uncovered,
        found.undecided,
    )


def _with_probe(analysis: Analysis, probe: Any) -> Analysis:
    """A probe that names a slow link confirms (or adds) the communication finding with that rank."""
    details = {**analysis.details, "probe": probe.to_dict()}
    slow = probe.slow_ranks()
    if slow is None:
        return Analysis(
            analysis.candidates, analysis.imbalance, analysis.irregular_steps, details, analysis.insufficient
        )
    named = Candidate(
        "link",
        f"nic:rank-{slow.rank}",
        (slow.rank,),
        slow.host,
        float("inf"),
        probe_sentence(slow.evidence),
        "probe",
        slowdown=slow.factor if math.isfinite(slow.factor) else None,
    )
    others = tuple(c for c in analysis.candidates if c.kind != "link")
    return Analysis((named,) + others, analysis.imbalance, analysis.irregular_steps, details, None)


def _recorded(
    records: pd.DataFrame,
    topology: Topology | None,
    thresholds: Thresholds,
    judge_last: int | None = None,
    usual_before: int | None = None,
) -> Analysis:
    timings = gather_timings(
        records,
        topology.hosts if topology else None,
        topology.switches if topology else None,
        usual_before if judge_last is not None else None,
    )
    history = None
    if judge_last is not None and len(timings.steps) > judge_last:
        history, timings = timings, last_steps(timings, judge_last)
    median_step = float(np.median(timings.step_time)) if len(timings.step_time) else 0.0
    window = {
        "steps": [int(timings.steps[0]), int(timings.steps[-1])] if len(timings.steps) else [],
        "ranks": len(timings.ranks),
        "median_step_seconds": round(median_step, 6),
    }
    if len(timings.steps) < MIN_STEPS or len(timings.ranks) < 2:
        what = f"{len(timings.steps)} steps" if len(timings.steps) < MIN_STEPS else f"{len(timings.ranks)} rank"
        return Analysis(
            (),
            (),
            (),
            {"window": window, "evidence_source": "compute and collectives"},
            f"{what} in the trace; at least {MIN_STEPS} steps of 2 or more ranks are needed to tell a "
            f"slow device or uneven work from noise",
        )
    irregular = tuple(int(s) for s in timings.steps[timings.step_time > thresholds.irregular * median_step])
    # steps every rank was slow in say nothing of one device: left out of the compute the GPUs are judged by
    job_wide = job_wide_slowdown((history or timings).compute_seconds, (history or timings).steps)
    if job_wide is not None:
        timings = without_steps(timings, job_wide.first_step, job_wide.last_step)
        history = without_steps(history, job_wide.first_step, job_wide.last_step) if history is not None else None
    gpus = gpu_candidates(timings, thresholds, history)
    clearly_slow = tuple(c.ranks[0] for c in gpus if c.z >= thresholds.explain_z)
    paths, network_notes = path_candidates(timings, thresholds, clearly_slow, history)
    candidates = gpus + paths
    simulated = bool(topology and topology.simulated) or bool(
        "simulated" in records.columns and records["simulated"].fillna(False).astype(bool).any()
    )
    details: dict[str, Any] = {
        "window": window,
        "evidence_source": "collectives" if timings.compute_derived else "compute and collectives",
    }
    if simulated:
        details["simulated"] = True
    if network_notes:
        details["notes"] = network_notes
    found = {c.ranks[0] for c in gpus if c.strength(thresholds) >= 1.0}  # a finding of their own speaks for them
    power = gpu_power(timings, thresholds, history, found)
    if job_wide is not None and job_wide.last_step >= timings.steps[0]:  # it reached the window judged
        details["job_wide"] = job_wide.to_dict()
    if history is not None:
        details["history"] = {"steps": [int(history.steps[0]), int(history.steps[-1])]}
    uncovered = uncovered_ranks(timings.ranks, timings.compute, _members(topology))
    return Analysis(
        tuple(candidates), tuple(imbalance_reasons(timings, thresholds)), irregular, details, None, power, uncovered
    )


def _members(topology: Topology | None) -> set[int] | None:
    """Every rank the topology names (group members), or None without one."""
    if topology is None or not topology.groups:
        return None
    return {int(r) for members in topology.groups.values() for r in members}


def decide(analysis: Analysis, thresholds: Thresholds) -> LocalizationResult:
    """The verdict: the strongest fault over its threshold, else imbalance, else healthy when the window could
    have seen a fault (:mod:`.power`); "insufficient data" with the reason when it cannot tell.

    A persistent, whole-window or recurrent slowness blames its device; a transient excursion, or one that
    healthy members of the run show too, is an event with its steps (``events``), never a suspect. Near
    misses (half the threshold or more) are listed apart (``near_misses``), never as suspects; one at least as
    slow as the window's stated power keeps it from being called healthy. Faults that came and went are the
    run's past (``in_this_run``: "healthy now; in this run: ..."), and a slowdown every rank shared
    (``job_wide``) is said first, whatever the verdict.
    """
    if analysis.insufficient is not None:
        details = {**analysis.details, "reasons": [analysis.insufficient]}
        return LocalizationResult("insufficient_data", (), (), advice_for("insufficient_data"), details)
    ranked = sorted(analysis.candidates, key=lambda c: c.strength(thresholds), reverse=True)
    faults = [c for c in ranked if c.blamable and c.strength(thresholds) >= 1.0]
    # an excursion no other member matched (transient) tells more than one as common as the run's noise
    events = sorted(
        (c for c in ranked if not c.blamable and c.strength(thresholds) >= 1.0), key=lambda c: c.shape == "ordinary"
    )
    near = [c for c in ranked if c.blamable and 0.5 <= c.strength(thresholds) < 1.0]
    details = dict(analysis.details)
    shared = [details["job_wide"]["text"]] if "job_wide" in details else []
    if events:
        details["events"] = [_event(c) for c in events[: thresholds.max_suspects]]
    past = [
        c
        for c in events
        if c.shape == "transient" and c.until is not None and (c.slowdown or 0.0) >= _PAST_FAULT_SLOWDOWN
    ]
    if past:
        details["in_this_run"] = [_past(c) for c in past[: thresholds.max_suspects]]
    if near:
        details["near_misses"] = [
            {"component": c.component, "strength": round(c.strength(thresholds), 3)}
            for c in near[: thresholds.max_suspects]
        ]
    if analysis.power is not None:
        details["power"] = analysis.power.to_dict()
    if analysis.uncovered:
        details["uncovered_ranks"] = list(analysis.uncovered)
    if faults:
        verdict = "compute" if faults[0].kind == "gpu" else "communication"
        suspects = tuple(_suspect(c, thresholds) for c in faults[: thresholds.max_suspects])
        return LocalizationResult(
            verdict, suspects, analysis.irregular_steps, advice_for(verdict), {**details, "reasons": shared}
        )
    if analysis.imbalance:  # robust to one device's excursion (:func:`.imbalance.imbalance_reasons`)
        return LocalizationResult(
            "imbalance",
            (),
            analysis.irregular_steps,
            advice_for("imbalance"),
            {**details, "reasons": shared + list(analysis.imbalance)},
        )
    unseen = _unseen(analysis, events, near, thresholds)
    if unseen is not None or analysis.power is None:
        return LocalizationResult(
            "insufficient_data",
            (),
            analysis.irregular_steps,
            advice_for("insufficient_data"),
            {**details, "reasons": shared + [unseen or "no detection power to state"]},
        )
    history = f"; in this run: {past_text(details['in_this_run'])}" if past else ""
    return LocalizationResult(
        "healthy",
        (),
        analysis.irregular_steps,
        advice_for("healthy"),
        {**details, "reasons": shared + [f"healthy{' now' if past else ''}: {analysis.power.sentence()}{history}"]},
    )


#: a stretch that came and went counts as a past fault of the run from this slowdown on; smaller ones (congestion,
#: a GC pause, a slow shard) stay events
_PAST_FAULT_SLOWDOWN = 1.2


def _past(candidate: Candidate) -> dict[str, Any]:
    """A fault that came and went, as the run's past."""
    out: dict[str, Any] = {"component": candidate.component, "steps": [candidate.since, candidate.until]}
    if candidate.slowdown is not None:
        out["slowdown"] = round(candidate.slowdown, 4)
    out["recovered"] = True
    return out


def _unseen(analysis: Analysis, events: list[Candidate], near: list[Candidate], thresholds: Thresholds) -> str | None:
    """Why the window cannot be called healthy, or None when it can."""
    if analysis.uncovered:
        shown = ", ".join(map(str, analysis.uncovered[:8])) + (", ..." if len(analysis.uncovered) > 8 else "")
        return (
            f"rank{'s' if len(analysis.uncovered) > 1 else ''} {shown} measured in fewer than half of the "
            f"window's steps (no records, or no step markers where other ranks have them): record every rank "
            f"with the same tools (trainhealth.Monitor or trainhealth.comm on each)"
        )
    if analysis.undecided:
        return analysis.undecided[0]
    ongoing = [c for c in events if c.shape == "ordinary"]  # slow to the window's end, like the run's noise
    if ongoing:
        since = f"since step {ongoing[0].since}" if ongoing[0].since is not None else "all window"
        return (
            f"{ongoing[0].component} is {ongoing[0].slowdown or 0:.2f}x slow {since}, and other members of this "
            f"run went as far for as long: too soon to tell a fault from this run's noise"
        )
    if analysis.power is None:
        return "the window's noise could not be measured: no detection power to state"
    close = [c for c in near if c.slowdown is not None and c.slowdown >= analysis.power.slowdown]
    if close:
        since = f"since step {close[0].since}" if close[0].since is not None else "all window"
        return (
            f"{close[0].component} is {close[0].slowdown:.2f}x slow {since}, short of the threshold at this "
            f"window's noise (strength {close[0].strength(thresholds):.2f} of 1): too soon or too noisy to tell"
        )
    if analysis.power.slowdown > thresholds.max_hidden:
        return (
            f"too noisy to call healthy: only {analysis.power.sentence().replace(' would have', ', or more, would have')}; "
            f"a longer window (more steps) or steadier timings are needed"
        )
    return None


def _event(candidate: Candidate) -> dict[str, Any]:
    out: dict[str, Any] = {
        "component": candidate.component,
        "kind": candidate.kind,
        "ranks": list(candidate.ranks),
        "shape": candidate.shape,
        "evidence": candidate.evidence,
    }
    if candidate.slowdown is not None:
        out["slowdown"] = round(candidate.slowdown, 4)
    if candidate.since is not None:
        out["since_step"] = candidate.since
    return out


def _suspect(candidate: Candidate, thresholds: Thresholds) -> Suspect:
    strength = candidate.strength(thresholds)
    score = 1.0 if math.isinf(strength) else strength**2 / (strength**2 + 1.0)
    return Suspect(
        candidate.kind,
        candidate.ranks,
        candidate.host,
        None,
        score,
        candidate.evidence,
        candidate.component,
        candidate.slowdown,
        candidate.since,
    )
