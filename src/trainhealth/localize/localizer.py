"""Root-cause localization of iteration-time irregularities from collective timings.

The rules are Holmes's (NSDI'25), applied to whole windows of steps with numpy:

1. **Compute.** In a prolonged collective, the member whose operation looks
   normal while the others' look prolonged is the straggler: they were waiting
   for it. Its lateness (and, when the trace records them, its compute times)
   stand out against its data-parallel peers; pipeline sends and receives carry
   the waiting back across stages to the stage it started in.
2. **Communication.** When every member's operation is prolonged — the last
   arrival's too, which did not wait — the path is slow. The transfers that
   cross each NIC, host and leaf switch are scored; a slow switch or host
   explains the transfers of all the NICs behind it, so the widest component
   that explains the evidence is named.
3. **Across iterations.** Evidence is accumulated over the window: for every
   candidate the strongest slow stretch of consecutive steps against the rest of
   the window (recent steps weighted more, by ``decay``), or its level over the
   whole window when it was slow throughout. Candidates are ranked by it.
4. **Imbalance is no one's fault.** Uneven work — a longer last pipeline stage,
   longer sequences in one replica — moves whole stages or replicas; it is
   compared between peers and replicas and reported as imbalance, never blamed
   on a GPU.

>>> from trainhealth.faults.cluster import Layout
>>> from trainhealth.faults.simulator import FaultKind, InjectedFault, Scenario, simulate
>>> fault = InjectedFault(FaultKind.GPU, target=5, severity=1.5, start_step=6)
>>> trace = simulate(Scenario(Layout(dp=4, pp=2, tp=2), steps=12, faults=(fault,), seed=3))
>>> result = localize(trace.records, trace.topology)
>>> result.verdict, result.suspects[0].component
('compute', 'gpu:rank-5')
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from trainhealth.alerts.advice import advice_for
from trainhealth.localize.evidence import Evidence, gather_evidence
from trainhealth.localize.result import LocalizationResult, Suspect
from trainhealth.localize.segments import Stretch, level, strongest_robust_stretch, strongest_stretch
from trainhealth.traces.topology import Topology

__all__ = ["Analysis", "Candidate", "Thresholds", "analyze", "decide", "localize"]


@dataclass(frozen=True)
class Thresholds:
    """The localizer's settings; the defaults were chosen on simulator seeds (benchmarks/localization.py)."""

    gpu_z: float = 6.0  # z-score of a rank's slow compute stretch that blames its GPU
    collectives_z: float = 8.0  # the same when compute is derived from collectives alone (noisier)
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

    def __post_init__(self) -> None:
        for name in ("gpu_z", "collectives_z", "link_z", "irregular"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if not 0 < self.decay <= 1:
            raise ValueError("decay must be in (0, 1]")


@dataclass(frozen=True)
class Candidate:
    """A component the evidence points at, before the thresholds judge it."""

    kind: str  # gpu, link, host
    component: str  # gpu:rank-N, nic:rank-N, host:NAME, switch:NAME
    ranks: tuple[int, ...]
    host: str | None
    z: float
    evidence: str
    basis: str = "transfers"  # what the z-score comes from: compute (records), derived (from collectives), transfers

    def strength(self, thresholds: Thresholds) -> float:
        """z over the threshold of its basis: 1 or more blames it."""
        threshold = {"compute": thresholds.gpu_z, "derived": thresholds.collectives_z}.get(self.basis, thresholds.link_z)
        return self.z / threshold


@dataclass(frozen=True)
class Analysis:
    """Everything the verdict is decided from (see :func:`decide`)."""

    candidates: tuple[Candidate, ...]
    imbalance: tuple[str, ...]  # reasons to call the irregularity uneven work
    irregular_steps: tuple[int, ...]
    details: dict[str, Any]


def localize(records: pd.DataFrame, topology: Topology | Mapping[str, Any] | None = None,
             thresholds: Thresholds | None = None) -> LocalizationResult:
    """Localize the cause of irregular steps in ``records`` (trace format v1, canonical dtypes)."""
    thresholds = thresholds or Thresholds()
    return decide(analyze(records, topology, thresholds), thresholds)


def analyze(records: pd.DataFrame, topology: Topology | Mapping[str, Any] | None,
            thresholds: Thresholds) -> Analysis:
    """Score every candidate GPU and network component, and look for uneven work."""
    if isinstance(topology, Mapping):
        topology = Topology.from_dict(dict(topology))
    evidence = gather_evidence(records, topology.hosts if topology else None, topology.switches if topology else None)
    median_step = float(np.median(evidence.step_time)) if len(evidence.step_time) else 0.0
    irregular = tuple(int(s) for s in evidence.steps[evidence.step_time > thresholds.irregular * median_step])
    gpus = _gpu_candidates(evidence, thresholds)
    clearly_slow = tuple(c.ranks[0] for c in gpus if c.z >= thresholds.explain_z)
    paths, network_notes = _path_candidates(evidence, thresholds, clearly_slow)
    candidates = gpus + paths
    simulated = bool(topology and topology.simulated) or bool(
        "simulated" in records.columns and records["simulated"].fillna(False).astype(bool).any())
    details: dict[str, Any] = {
        "window": {"steps": [int(evidence.steps[0]), int(evidence.steps[-1])] if len(evidence.steps) else [],
                   "ranks": len(evidence.ranks), "median_step_seconds": round(median_step, 6)},
        "evidence_source": "collectives" if evidence.compute_derived else "compute and collectives",
    }
    if simulated:
        details["simulated"] = True
    if network_notes:
        details["notes"] = network_notes
    return Analysis(tuple(candidates), tuple(_imbalance(evidence, thresholds)), irregular, details)


def decide(analysis: Analysis, thresholds: Thresholds) -> LocalizationResult:
    """The verdict: the strongest candidate over its threshold, else imbalance, else healthy."""
    ranked = sorted(analysis.candidates, key=lambda c: c.strength(thresholds), reverse=True)
    if ranked and ranked[0].strength(thresholds) >= 1.0:
        verdict = "compute" if ranked[0].kind == "gpu" else "communication"
        suspects = tuple(_suspect(c, thresholds) for c in ranked[: thresholds.max_suspects]
                         if c.strength(thresholds) >= 0.5)
        reasons: list[str] = []
    else:
        verdict = "imbalance" if analysis.imbalance else "healthy"
        suspects, reasons = (), list(analysis.imbalance)
    details = {**analysis.details, "reasons": reasons}
    return LocalizationResult(verdict, suspects, analysis.irregular_steps, advice_for(verdict), details)


def _suspect(candidate: Candidate, thresholds: Thresholds) -> Suspect:
    strength = candidate.strength(thresholds)
    return Suspect(candidate.kind, candidate.ranks, candidate.host, None, strength**2 / (strength**2 + 1.0),
                   candidate.evidence, candidate.component)


# --- compute: which GPU do the others wait for ------------------------------------------------

def _gpu_candidates(evidence: Evidence, thresholds: Thresholds) -> list[Candidate]:
    versus_peers, change = evidence.compute, evidence.compute_change
    basis = "derived" if evidence.compute_derived else "compute"
    minimum = thresholds.min_compute_effect
    noise = _row_noise(change, minimum / 4)
    if evidence.compute_derived:  # no per-operation median dropped its GC pauses: medians over longer stretches
        stretch = strongest_robust_stretch(change, np.maximum(noise, _step_noise(change)), thresholds.min_length_derived)
    else:
        stretch = strongest_stretch(change, np.isfinite(change).astype(np.float64), noise, thresholds.min_length,
                                    thresholds.decay)
    whole = level(np.nan_to_num(versus_peers), np.isfinite(versus_peers).astype(np.float64),
                  _row_noise(versus_peers, minimum / 4), thresholds.compute_allowance, thresholds.min_length)
    threshold = thresholds.collectives_z if evidence.compute_derived else thresholds.gpu_z
    z, chosen = _best(stretch, whole)
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
        text = _gpu_evidence(evidence, index, basis, start, stop, effect, float(z[index]))
        out.append(Candidate("gpu", f"gpu:rank-{rank}", (rank,), evidence.hosts.get(rank), float(z[index]), text, basis))
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
    return _stretch_effect(change[peers], start, stop)


def _stretch_effect(values: np.ndarray, start: int, stop: int) -> float:
    """The median row's mean in steps [start, stop) minus its mean in the other steps (its mean, for all steps)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # rows without values there
        inside = np.nanmean(values[:, start:stop], axis=1)
        outside = np.nanmean(np.delete(values, np.s_[start:stop], axis=1), axis=1) if stop - start < values.shape[1] else 0.0
        difference = inside - outside
    difference = difference[np.isfinite(difference)]
    return float(np.median(difference)) if len(difference) else 0.0


def _gpu_evidence(evidence: Evidence, index: int, what: str, start: int, stop: int, effect: float, z: float) -> str:
    steps = _steps_text(evidence, start, stop)
    if what == "compute":
        head = f"computes {np.exp(effect):.2f}x as long as its data-parallel peers {steps}"
    else:
        head = f"spends {np.exp(effect):.2f}x as long outside collectives (computing) as its peers {steps}"
    return (f"{head} (z={z:.1f}); its collectives look normal while its peers wait for it "
            f"(last to arrive in {evidence.last_share[index]:.0%} of them)")


def _minus_replica_median(values: np.ndarray, replica_of: np.ndarray) -> np.ndarray:
    """Remove what moves a whole replica at once (uneven batches), not one GPU.

    Replicas of fewer than three ranks are left alone: the median of two is their
    mean, which would blame a slow GPU's partner as much as the GPU.
    """
    out = values.copy()
    sizes = np.bincount(replica_of)
    if sizes.max() < 3:
        return out
    order = np.argsort(replica_of, kind="stable")
    frame = pd.DataFrame(values[order])
    medians = frame.groupby(replica_of[order]).transform("median").to_numpy()
    shared = sizes[replica_of[order]] >= 3
    out[order[shared]] = values[order[shared]] - medians[shared]
    return out


def _row_noise(values: np.ndarray, floor: float = 1e-6) -> float:
    """One cell's standard deviation around its row's median (robust: 1.4826 * MAD), at least ``floor``.

    The floor keeps noiseless input (synthetic traces, a constant timer) from
    turning a trifle into a large z-score.
    """
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # rows without any value
        centered = values - np.nanmedian(values, axis=1, keepdims=True)
    finite = np.abs(centered[np.isfinite(centered)])
    return max(1.4826 * float(np.median(finite)) if len(finite) else 0.0, floor)


def _step_noise(values: np.ndarray) -> np.ndarray:
    """Per row, one step's standard deviation from its step-to-step changes (robust: a fault that starts or
    ends moves one change, not the spread); some ranks' timings are noisier than others'."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nan_to_num(1.4826 * np.nanmedian(np.abs(np.diff(values, axis=1)), axis=1) / np.sqrt(2), nan=0.0)


def _best(stretch: Stretch, whole: Stretch) -> tuple[np.ndarray, Stretch]:
    """The larger z of the two; the stretch is reported unless the level is far stronger."""
    use_level = whole.z > 2.0 * stretch.z
    chosen = Stretch(np.where(use_level, whole.start, stretch.start), np.where(use_level, whole.stop, stretch.stop),
                     np.where(use_level, whole.effect, stretch.effect), np.maximum(whole.z, stretch.z))
    return chosen.z, chosen


# --- communication: which path makes every member wait ----------------------------------------

@dataclass(frozen=True)
class _Layer:
    """One kind of network component (NIC, host, switch) and the transfers that cross each."""

    name: str
    labels: list[str]
    members: list[np.ndarray]  # per component: indices into Evidence.ranks
    instance: np.ndarray  # per (instance, component) pair
    component: np.ndarray


def _path_candidates(evidence: Evidence, thresholds: Thresholds,
                     slow_gpus: tuple[int, ...]) -> tuple[list[Candidate], list[str]]:
    """Greedy explaining-away: name the strongest component, drop the transfers it explains, repeat.

    Transfers of a clearly slow GPU are explained by it (in real pipelines a
    straggler's partners wait inside the transfers too). A NIC whose slow stretch every NIC shares is
    no culprit: then the switch is named when one explains it, else the slowdown
    is reported as network-wide.
    """
    transfers = evidence.transfers
    if len(transfers.excess) < 2:
        return [], []
    layers = _layers(evidence)
    explained = np.zeros(len(transfers.excess), dtype=bool)
    _explain(evidence, explained, slow_gpus)
    out: list[Candidate] = []
    notes: list[str] = []
    for _ in range(thresholds.max_suspects):
        scores = {layer.name: _score_layer(evidence, layer, explained, thresholds) for layer in layers}
        nic_z, nic_stretch, nic_values = scores["nic"]
        index = int(np.argmax(nic_z))
        if nic_z[index] < 0.5 * thresholds.link_z:
            break
        start, stop, effect = int(nic_stretch.start[index]), int(nic_stretch.stop[index]), float(nic_stretch.effect[index])
        shared = _stretch_effect(nic_values, start, stop)
        candidate = _widest(evidence, layers, scores, index, float(nic_z[index]), effect, thresholds,
                            switch_only=shared >= 0.5 * effect)
        if candidate is None and shared >= 0.5 * effect:
            notes.append(f"all inter-host transfers were {np.exp(shared):.2f}x slower {_steps_text(evidence, start, stop)}: "
                         f"network-wide, no single NIC, host or known switch stands out")
            break
        if candidate is None:
            rank = int(evidence.ranks[index])
            text = (f"inter-host transfers through its NIC take {np.exp(effect):.2f}x their usual "
                    f"time {_steps_text(evidence, start, stop)} (z={nic_z[index]:.1f}); every member of those "
                    f"collectives is slow, the last to arrive too")
            candidate = Candidate("link", f"nic:rank-{rank}", (rank,), evidence.hosts.get(rank),
                                  float(nic_z[index]), text)
        out.append(candidate)
        _explain(evidence, explained, candidate.ranks)
    return out, notes


def _transfer_noise(excess: np.ndarray, values: np.ndarray, counts: np.ndarray, floor: float) -> float:
    """One transfer's standard deviation, times the overdispersion of the per-step means (at least 1)."""
    if not len(excess):
        return floor
    single = max(1.4826 * float(np.median(np.abs(excess - np.median(excess)))), floor)
    with np.errstate(all="ignore"):
        # step-to-step changes: a fault that starts in the window moves one of them, not all
        standardized = np.diff(values, axis=1) / (single * np.sqrt(1 / counts[:, 1:] + 1 / counts[:, :-1]))
    finite = np.abs(standardized[np.isfinite(standardized)])
    return single * max(1.0, 1.4826 * float(np.median(finite)) if len(finite) else 1.0)


def _explain(evidence: Evidence, explained: np.ndarray, ranks: tuple[int, ...]) -> None:
    """Mark the transfers any of ``ranks`` took part in as explained."""
    transfers = evidence.transfers
    covered = np.isin(evidence.ranks[transfers.member_rank], ranks)
    explained[transfers.member_instance[covered]] = True


def _layers(evidence: Evidence) -> list[_Layer]:
    transfers = evidence.transfers
    ranks = [int(r) for r in evidence.ranks]
    groupings = [("nic", {str(r): [i] for i, r in enumerate(ranks)})]
    for name, mapping in (("host", evidence.hosts), ("switch", evidence.switches)):
        members: dict[str, list[int]] = {}
        for index, rank in enumerate(ranks):
            if rank in mapping:
                members.setdefault(mapping[rank], []).append(index)
        if members:
            groupings.append((name, members))
    layers = []
    for name, members in groupings:
        labels = sorted(members, key=lambda label: members[label][0])
        component_of = np.full(len(ranks), -1)
        for code, label in enumerate(labels):
            component_of[members[label]] = code
        component = component_of[transfers.member_rank]
        known = component >= 0
        instance, component = transfers.member_instance[known], component[known]
        if name != "nic":  # several members of an instance may share a host or switch: count it once
            key = pd.unique(instance * len(labels) + component)
            instance, component = key // len(labels), key % len(labels)
        layers.append(_Layer(name, labels, [np.asarray(members[label]) for label in labels], instance, component))
    return layers


def _score_layer(evidence: Evidence, layer: _Layer, explained: np.ndarray,
                 thresholds: Thresholds) -> tuple[np.ndarray, Stretch, np.ndarray]:
    """Per component: z, stretch and per-step mean excess of the transfers crossing it, not yet explained.

    Each transfer counts once; the noise is one transfer's, inflated by how much
    more the per-step means vary than independent transfers would (congestion
    moves many transfers of a step together).
    """
    transfers = evidence.transfers
    n_steps, n_components = len(evidence.steps), len(layer.labels)
    open_pairs = ~explained[layer.instance]
    instance, code = layer.instance[open_pairs], layer.component[open_pairs]
    cell = code * n_steps + transfers.step[instance]
    size = n_components * n_steps
    sums = np.bincount(cell, weights=transfers.excess[instance], minlength=size).reshape(n_components, n_steps)
    counts = np.bincount(cell, minlength=size).astype(np.float64).reshape(n_components, n_steps)
    with np.errstate(invalid="ignore", divide="ignore"):
        values = np.where(counts > 0, sums / counts, np.nan)
    sigma = _transfer_noise(transfers.excess[instance], values, counts, thresholds.min_transfer_effect / 4)
    stretch = strongest_stretch(sums, counts, sigma, thresholds.min_length, thresholds.decay)
    whole = level(sums, counts, sigma, thresholds.transfer_allowance, thresholds.min_length)
    z, chosen = _best(stretch, whole)
    return np.where(chosen.effect >= thresholds.min_transfer_effect, z, 0.0), chosen, values


def _widest(evidence: Evidence, layers: list[_Layer], scores: dict[str, tuple[np.ndarray, Stretch, np.ndarray]],
            index: int, nic_z: float, nic_effect: float, thresholds: Thresholds,
            switch_only: bool = False) -> Candidate | None:
    """The switch or host behind rank ``index`` when it explains the NIC's slow transfers, else None.

    It explains them when its own transfers are slow by at least ``explain_share``
    of the NIC's excess, with at least half the NIC's confidence.
    """
    for layer in sorted(layers, key=lambda layer: ("switch", "host").index(layer.name) if layer.name != "nic" else 9):
        if layer.name == "nic" or switch_only and layer.name != "switch":
            continue
        found = [code for code, members in enumerate(layer.members) if index in members]
        if not found:
            continue
        code = found[0]
        z, stretch, _ = scores[layer.name]
        if z[code] < 0.5 * nic_z or stretch.effect[code] < thresholds.explain_share * nic_effect:
            continue
        covered = tuple(int(evidence.ranks[i]) for i in layer.members[code])
        label = layer.labels[code]
        steps = _steps_text(evidence, int(stretch.start[code]), int(stretch.stop[code]))
        factor = np.exp(stretch.effect[code])
        if layer.name == "switch":
            hosts = len({evidence.hosts.get(r, str(r)) for r in covered})
            text = (f"inter-host transfers of all {hosts} hosts under {label} take {factor:.2f}x their usual "
                    f"time {steps} (z={z[code]:.1f}): the switch, not one host or NIC")
            return Candidate("link", f"switch:{label}", covered, None, float(z[code]), text)
        text = (f"inter-host transfers of every GPU on {label} take {factor:.2f}x their usual time {steps} "
                f"(z={z[code]:.1f}): the host's network path, not one NIC")
        return Candidate("host", f"host:{label}", covered, label, float(z[code]), text)
    return None


# --- imbalance: uneven work, no device to blame -----------------------------------------------

def _imbalance(evidence: Evidence, thresholds: Thresholds) -> list[str]:
    """Reasons to call the window's irregularity uneven work: stages whose peer groups compute
    longer in every replica, or replicas whose compute moves together from step to step."""
    reasons = []
    n_peer_groups = int(evidence.peer_of.max()) + 1
    if n_peer_groups >= 2:
        per_group = _per_group_median(evidence.compute_seconds, evidence.peer_of, n_peer_groups)
        median = float(np.median(per_group))
        excess = per_group / median - 1.0 if median > 0 else np.zeros_like(per_group)
        uneven = np.flatnonzero(excess > thresholds.stage_imbalance)
        if len(uneven):
            ranks = evidence.ranks[np.isin(evidence.peer_of, uneven)]
            reasons.append(f"uneven stages: ranks {_ranks_text(ranks)} compute {excess[uneven].max() + 1:.2f}x as long "
                           f"per step as the median peer group, in every replica alike (no single device)")
    if int(evidence.replica_of.max()) >= 1:
        per_replica = pd.DataFrame(evidence.compute).groupby(evidence.replica_of).median().to_numpy()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            varying = per_replica - np.nanmean(per_replica, axis=1, keepdims=True)
            spread = float(np.nanstd(varying)) if np.isfinite(varying).any() else 0.0
        if spread > thresholds.replica_imbalance:
            reasons.append(f"uneven batches: whole replicas compute {np.exp(spread) - 1:.1%} longer or shorter from "
                           f"step to step (sequence lengths vary), every GPU of a replica alike")
    return reasons


def _per_group_median(values: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    out = np.zeros(n_groups)
    for group in range(n_groups):
        block = values[groups == group]
        out[group] = float(np.nanmedian(block)) if np.isfinite(block).any() else 0.0
    return out


# --- text -------------------------------------------------------------------------------------

def _steps_text(evidence: Evidence, start: int, stop: int) -> str:
    steps = evidence.steps
    if start <= 0 and stop >= len(steps):
        return "throughout the window"
    return f"in steps {steps[start]}-{steps[stop - 1]}"


def _ranks_text(ranks: np.ndarray) -> str:
    shown = ", ".join(str(int(r)) for r in ranks[:8])
    return shown + (f", ... ({len(ranks)} ranks)" if len(ranks) > 8 else "")
