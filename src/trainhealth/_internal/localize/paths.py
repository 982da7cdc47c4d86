"""Network candidates: which NIC, host or switch makes every member of its transfers wait.

The last member to arrive at a collective did not wait, so its duration is the
transfer time (Holmes's communication rule). The inter-host transfers that cross
each NIC, host and leaf switch are scored; the strongest NIC is taken, the host
or switch behind it is named instead when it explains most of the NIC's excess,
its transfers are set aside, and the next is looked for.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import pairwise

import numpy as np

from trainhealth._internal.localize.candidates import (
    Candidate,
    Thresholds,
    best,
    row_noise,
    rows_noise,
    stretch_effect,
)
from trainhealth._internal.localize.excursions import (
    largest_elsewhere,
    recurrent_members,
    shape_of,
)
from trainhealth._internal.localize.stretches import Stretch, level, strongest_stretch
from trainhealth._internal.localize.timings import Message, Timings
from trainhealth._internal.localize.wording import (
    event_note,
    host_sentence,
    network_wide_note,
    nic_sentence,
    recurrent_nic_sentence,
    steps_text,
    switch_sentence,
)

__all__ = ["path_candidates"]

#: the messages a link's sentence names: the most common among its slow transfers, each a share of them at least
_MAX_MESSAGES = 3
_MESSAGE_SHARE = 0.1


@dataclass(frozen=True)
class _Layer:
    """One kind of network component (NIC, host, switch) and the transfers that cross each."""

    name: str
    labels: list[str]
    members: list[np.ndarray]  # per component: indices into Timings.ranks
    instance: np.ndarray  # per (instance, component) pair
    cell: np.ndarray  # per pair: component x steps + the instance's step (where _score_layer adds it up)
    counts: np.ndarray  # per cell: its pairs, none explained
    sums: np.ndarray  # per cell: its pairs' excess, none explained


def path_candidates(
    timings: Timings, thresholds: Thresholds, slow_gpus: tuple[int, ...], history: Timings | None = None
) -> tuple[list[Candidate], list[str]]:
    """Greedy explaining-away: name the strongest component, drop the transfers it explains, repeat.

    Transfers of a clearly slow GPU are explained by it (in real pipelines a
    straggler's partners wait inside the transfers too). A NIC whose slow stretch
    every NIC shares is no culprit: then the switch is named when one explains it,
    else the slowdown is reported as network-wide.
    """
    transfers = timings.transfers
    if len(transfers.excess) < 2:
        return [], []
    layers = _layers(timings)
    explained = np.zeros(len(transfers.excess), dtype=bool)
    _explain(timings, explained, slow_gpus)
    noise: dict[str, float] = {}  # per layer, measured once: explaining a few components away barely moves it
    # the run the window is judged against: its NICs over the history (the window itself without one)
    run = history or timings
    run_nics = _layers(run)[0] if history is not None else layers[0]
    run_noise: dict[str, float] = {} if history is not None else noise
    run_explained = np.zeros(len(run.transfers.excess), dtype=bool)
    _explain(run, run_explained, slow_gpus)
    remembered: dict[tuple[int, bytes], tuple[np.ndarray, Stretch, np.ndarray]] = {}

    def score(
        of: Timings, layer: _Layer, marked: np.ndarray, layer_noise: dict[str, float]
    ) -> tuple[np.ndarray, Stretch, np.ndarray]:
        """:func:`_score_layer`, once per layer and set of explained transfers (the recurrence test, the first
        round and a candidate's comparison with the run's other NICs often ask the same)."""
        key = (id(layer), np.packbits(marked).tobytes())
        if key not in remembered:
            remembered[key] = _score_layer(of, layer, marked, thresholds, layer_noise)
        return remembered[key]

    _, _, run_values = score(run, run_nics, run_explained, run_noise)
    out: list[Candidate] = _recurrent(run, run_nics, run_explained, run_values, thresholds)
    for recurrent in out:  # its episodes are one finding, not events of their own
        _explain(timings, explained, recurrent.ranks)
    notes: list[str] = []
    for _ in range(min(thresholds.max_suspects, 3)):  # a network fault rarely comes with more than a second
        scores = {layer.name: score(timings, layer, explained, noise) for layer in layers}
        nic_z, nic_stretch, nic_values = scores["nic"]
        index = int(np.argmax(nic_z))
        if nic_z[index] < 0.5 * thresholds.link_z:
            break
        start, stop, effect = (
            int(nic_stretch.start[index]),
            int(nic_stretch.stop[index]),
            float(nic_stretch.effect[index]),
        )
        shared = stretch_effect(nic_values, start, stop)
        candidate = _widest(
            timings,
            layers,
            scores,
            explained,
            index,
            float(nic_z[index]),
            effect,
            thresholds,
            switch_only=shared >= 0.5 * effect,
        )
        when = steps_text(timings.steps, start, stop)
        if candidate is None and shared >= 0.5 * effect:
            notes.append(network_wide_note(shared, when))
            break
        if candidate is None:
            rank = int(timings.ranks[index])
            slow = _steps_between(len(timings.steps), start, stop)
            sizes = _message_slowdowns(timings, layers[0], index, explained, slow)
            text = nic_sentence(effect, when, float(nic_z[index]), sizes)
            candidate = Candidate(
                "link", f"nic:rank-{rank}", (rank,), timings.hosts.get(rank), float(nic_z[index]), text
            )

        def elsewhere(candidate: Candidate = candidate) -> np.ndarray:
            """The run's other NICs, without the transfers the candidate explains (its partners' share)."""
            others = run_explained.copy()
            _explain(run, others, candidate.ranks)
            return score(run, run_nics, others, run_noise)[2]

        out.append(_judged(candidate, timings, nic_values[index], elsewhere, start, stop, effect, thresholds))
        _explain(timings, explained, candidate.ranks)
    return out, notes


def _recurrent(
    timings: Timings, nics: _Layer, explained: np.ndarray, values: np.ndarray, thresholds: Thresholds
) -> list[Candidate]:
    """The NIC slow in episode after episode, far more often than episodes falling on random NICs of this run
    would make one (:func:`.excursions.recurrent_members`); its partners' share of its episodes is left out by
    taking the NIC whose episodes are strongest. ``values``: per NIC (of ``nics``) and step, the mean excess of
    its transfers not ``explained``."""
    # each NIC's episodes stand out from its own noise too: one whose transfers were partly explained (a slow
    # GPU's) is measured on fewer of them and is noisier than the rest
    sigma = rows_noise(values, row_noise(values, thresholds.min_transfer_effect / 4))
    level = np.maximum(thresholds.recurrent_effect, 4.0 * sigma)
    found = recurrent_members(
        values,
        level,
        thresholds.recurrent_episodes,
        thresholds.false_blame,
        thresholds.min_length - 1,
        lambda: _partners(timings),
        thresholds.rarity,
    )
    best: Candidate | None = None
    for index, episodes in found.items():
        slow = np.zeros(values.shape[1], dtype=bool)
        for start, stop in episodes:
            slow[start:stop] = True
        effect = float(np.nanmedian(values[index, slow]))
        z = effect / sigma[index] * math.sqrt(slow.sum()) / 2.0  # discounted: the episodes are the row's largest
        if z < thresholds.link_z or (best is not None and z <= best.z):
            continue
        rank = int(timings.ranks[index])
        sizes = _message_slowdowns(timings, nics, index, explained, slow)
        text = recurrent_nic_sentence(timings.steps, episodes, effect, z, sizes)
        best = Candidate(
            "link",
            f"nic:rank-{rank}",
            (rank,),
            timings.hosts.get(rank),
            z,
            text,
            "transfers",
            math.exp(effect),
            int(timings.steps[episodes[0][0]]),
            "recurrent",
        )
    return [best] if best is not None else []


def _partners(timings: Timings) -> dict[int, set[int]]:
    """Per rank index, the rank indices at the other ends of its inter-host transfers. Instances of one group
    share their members: each distinct member set is expanded once (a data-parallel group of 64 has 4,032
    pairs, repeated in every step it would be millions)."""
    transfers = timings.transfers
    order = np.lexsort((transfers.member_rank, transfers.member_instance))
    instance, rank = transfers.member_instance[order], transfers.member_rank[order]
    bounds = np.flatnonzero(np.r_[True, instance[1:] != instance[:-1], True])
    member_sets = {rank[a:b].tobytes(): rank[a:b] for a, b in pairwise(bounds)}
    out: dict[int, set[int]] = {}
    for members in member_sets.values():
        for member in members.tolist():
            out.setdefault(member, set()).update(members.tolist())
    for member, others in out.items():
        others.discard(member)
    return out


def _judged(
    candidate: Candidate,
    timings: Timings,
    row: np.ndarray,
    elsewhere: Callable[[], np.ndarray],
    start: int,
    stop: int,
    effect: float,
    thresholds: Thresholds,
) -> Candidate:
    """The candidate with its shape (:mod:`.excursions`): slow all window, from an onset on, or an event (it
    came and went, or other NICs of the run, without the transfers it explains, went as far for as long)."""
    whole = start <= 0 and stop >= len(row)
    shape = "throughout" if whole else shape_of(row, start, stop)
    covered = np.flatnonzero(np.isin(timings.ranks, candidate.ranks))  # a host's or switch's NICs are not "others"
    if shape != "transient" and effect < thresholds.rarity * largest_elsewhere(elsewhere(), covered, stop - start):
        shape = "ordinary"
    return replace(
        candidate,
        evidence=candidate.evidence + event_note(shape, "NICs", "component"),
        shape=shape,
        slowdown=float(np.exp(effect)),
        since=None if whole else int(timings.steps[start]),
        until=int(timings.steps[stop - 1]) if shape == "transient" else None,
    )


def _transfer_noise(excess: np.ndarray, values: np.ndarray, counts: np.ndarray, floor: float) -> float:
    """One transfer's standard deviation, times the overdispersion of the per-step means (at least 1).
    ``excess`` is overwritten: its medians are taken in place (partitioned, not copied first)."""
    if not len(excess):
        return floor
    excess -= np.median(excess, overwrite_input=True)
    deviation = np.abs(excess, out=excess)
    single = max(1.4826 * float(np.median(deviation, overwrite_input=True)), floor)
    del deviation
    with np.errstate(all="ignore"):
        # step-to-step changes: a fault that starts in the window moves one of them, not all
        standardized = np.diff(values, axis=1) / (single * np.sqrt(1 / counts[:, 1:] + 1 / counts[:, :-1]))
    finite = np.abs(standardized[np.isfinite(standardized)])
    return single * max(1.0, 1.4826 * float(np.median(finite, overwrite_input=True)) if len(finite) else 1.0)


def _explain(timings: Timings, explained: np.ndarray, ranks: tuple[int, ...]) -> None:
    """Mark the transfers any of ``ranks`` took part in as explained."""
    transfers = timings.transfers
    covered = np.isin(transfers.member_rank, np.flatnonzero(np.isin(timings.ranks, ranks)))
    explained[transfers.member_instance[covered]] = True


def _layers(timings: Timings) -> list[_Layer]:
    transfers = timings.transfers
    ranks = [int(r) for r in timings.ranks]
    groupings = [("nic", {str(r): [i] for i, r in enumerate(ranks)})]
    for name, mapping in (("host", timings.hosts), ("switch", timings.switches)):
        members: dict[str, list[int]] = {}
        for index, rank in enumerate(ranks):
            if rank in mapping:
                members.setdefault(mapping[rank], []).append(index)
        if members:
            groupings.append((name, members))
    layers = []
    for name, members in groupings:
        labels = sorted(members, key=lambda label: members[label][0])
        if name == "nic":  # a NIC per rank, in the ranks' order: the memberships as they are
            instance, component = transfers.member_instance, transfers.member_rank
        else:
            component_of = np.full(len(ranks), -1, dtype=np.int32)
            for code, label in enumerate(labels):
                component_of[members[label]] = code
            component = component_of[transfers.member_rank]
            known = component >= 0
            instance = transfers.member_instance
            if not known.all():
                instance, component = instance[known], component[known]
            del known
            # several members of an instance may share a host or switch: count it once
            first = _first_memberships(instance, component, len(labels))
            if not first.all():
                instance, component = instance[first], component[first]
            del first
        cell = _cells(component, transfers.step[instance], len(labels), len(timings.steps))
        size = len(labels) * len(timings.steps)
        counts = np.bincount(cell, minlength=size)
        sums = np.bincount(cell, weights=transfers.excess[instance], minlength=size)
        layers.append(
            _Layer(name, labels, [np.asarray(members[label]) for label in labels], instance, cell, counts, sums)
        )
    return layers


def _cells(component: np.ndarray, step: np.ndarray, n_components: int, n_steps: int) -> np.ndarray:
    """Per pair, its (component, step) cell, 32-bit where they fit."""
    kind = np.int32 if n_components * n_steps <= np.iinfo(np.int32).max else np.int64
    cell = component.astype(kind)  # a new array: multiplied and added to in place
    cell *= n_steps
    cell += step
    return cell


#: memberships sorted at a time: a few million pairs sorted in parts hold a fraction of their size
_CHUNK = 1 << 20


def _first_memberships(
    instance: np.ndarray, component: np.ndarray, n_components: int, part: int = _CHUNK
) -> np.ndarray:
    """Per (instance, component) pair: whether it is the first of its kind (the ones ``pd.unique`` keeps). A
    stable sort, several times faster than hashing millions of mostly distinct pairs, over a range of instances
    at a time (a pair's instance decides its part).

    >>> _first_memberships(np.array([0, 1, 0, 1, 0]), np.array([3, 3, 3, 2, 1]), 4)
    array([ True,  True, False,  True,  True])
    """
    first = np.empty(len(instance), dtype=bool)
    n_instances = int(instance.max(initial=-1)) + 1
    per_part = max(1, n_instances * part // max(len(instance), 1))  # instances to about ``part`` pairs
    for low in range(0, n_instances, per_part):
        rows = np.flatnonzero((instance >= low) & (instance < low + per_part))
        values = instance[rows].astype(np.int64)
        values *= n_components
        values += component[rows]
        order = np.argsort(values, kind="stable")
        ordered = values[order]
        first[rows[order]] = np.r_[True, ordered[1:] != ordered[:-1]]
    return first


def _score_layer(
    timings: Timings, layer: _Layer, explained: np.ndarray, thresholds: Thresholds, noise: dict[str, float]
) -> tuple[np.ndarray, Stretch, np.ndarray]:
    """Per component: z, stretch and per-step mean excess of the transfers crossing it, not yet explained.

    Each transfer counts once; the noise is one transfer's, inflated by how much
    more the per-step means vary than independent transfers would (congestion
    moves many transfers of a step together).
    """
    transfers = timings.transfers
    n_steps, n_components = len(timings.steps), len(layer.labels)
    size = n_components * n_steps
    sums, counts = layer.sums, layer.counts
    closed_pairs = explained[layer.instance] if explained.any() else None
    if closed_pairs is not None:
        closed = np.flatnonzero(closed_pairs)
        touched = np.zeros(size, dtype=bool)
        touched[layer.cell[closed]] = True
        # a touched cell's excess is added up again over its open pairs in their order: the very sum it would
        # have had without the explained ones (the others' sums stand)
        again = np.flatnonzero(touched[layer.cell] & ~closed_pairs)
        sums = np.where(touched, np.bincount(layer.cell[again], transfers.excess[layer.instance[again]], size), sums)
        counts = counts - np.bincount(layer.cell[closed], minlength=size)
    sums = sums.reshape(n_components, n_steps)
    counts = counts.astype(np.float64).reshape(n_components, n_steps)
    with np.errstate(invalid="ignore", divide="ignore"):
        values = np.where(counts > 0, sums / counts, np.nan)
    if layer.name not in noise:  # the open pairs' excess (overwritten there)
        opened = transfers.excess[layer.instance if closed_pairs is None else layer.instance[~closed_pairs]]
        noise[layer.name] = _transfer_noise(opened, values, counts, thresholds.min_transfer_effect / 4)
    sigma = noise[layer.name]
    stretch = strongest_stretch(sums, counts, sigma, thresholds.min_length, thresholds.decay)
    whole = level(sums, counts, sigma, thresholds.transfer_allowance, thresholds.min_length)
    z, chosen = best(stretch, whole)
    return np.where(chosen.effect >= thresholds.min_transfer_effect, z, 0.0), chosen, values


def _widest(
    timings: Timings,
    layers: list[_Layer],
    scores: dict[str, tuple[np.ndarray, Stretch, np.ndarray]],
    explained: np.ndarray,
    index: int,
    nic_z: float,
    nic_effect: float,
    thresholds: Thresholds,
    switch_only: bool = False,
) -> Candidate | None:
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
        covered = tuple(int(timings.ranks[i]) for i in layer.members[code])
        label = layer.labels[code]
        start, stop, effect = int(stretch.start[code]), int(stretch.stop[code]), float(stretch.effect[code])
        when = steps_text(timings.steps, start, stop)
        sizes = _message_slowdowns(timings, layer, code, explained, _steps_between(len(timings.steps), start, stop))
        if layer.name == "switch":
            hosts = len({timings.hosts.get(r, str(r)) for r in covered})
            text = switch_sentence(label, hosts, effect, when, float(z[code]), sizes)
            return Candidate("link", f"switch:{label}", covered, None, float(z[code]), text)
        text = host_sentence(label, effect, when, float(z[code]), sizes)
        return Candidate("host", f"host:{label}", covered, label, float(z[code]), text)
    return None


def _steps_between(n_steps: int, start: int, stop: int) -> np.ndarray:
    """Per step: whether it is in [``start``, ``stop``)."""
    inside = np.zeros(n_steps, dtype=bool)
    inside[start:stop] = True
    return inside


def _message_slowdowns(
    timings: Timings, layer: _Layer, code: int, explained: np.ndarray, slow: np.ndarray
) -> tuple[tuple[Message, float], ...]:
    """The messages most common among the transfers crossing component ``code`` of ``layer`` in the ``slow`` steps
    (per step: whether it is one), not yet ``explained``: up to :data:`_MAX_MESSAGES`, each at least
    :data:`_MESSAGE_SHARE` of them, with each one's slowdown (its mean excess in those steps less that in the
    others; against its class's usual time where the slow steps are all)."""
    transfers = timings.transfers
    n_steps = len(timings.steps)
    crossing = (layer.cell >= code * n_steps) & (layer.cell < (code + 1) * n_steps)
    instance = layer.instance[crossing]
    instance = instance[~explained[instance]]
    inside = slow[transfers.step[instance]]
    message, excess = transfers.message[instance], transfers.excess[instance]
    counts = np.bincount(message[inside], minlength=len(transfers.messages))
    out = []
    for common in np.argsort(-counts, kind="stable")[:_MAX_MESSAGES].tolist():
        if counts[common] == 0 or counts[common] < _MESSAGE_SHARE * counts.sum():
            break
        mine = message == common
        outside = mine & ~inside
        effect = float(excess[mine & inside].mean()) - (float(excess[outside].mean()) if outside.any() else 0.0)
        out.append((transfers.messages[common], math.exp(effect)))
    return tuple(out)
