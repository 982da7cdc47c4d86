"""A pairwise link probe: which rank's links are slow, measured rather than inferred.

When every collective spans every rank, passive collective timings can say "communication is
slow" but not through which link. :func:`probe_links` confirms a suspicion the way Greyhound
does, with a micro-benchmark: every pair of ranks exchanges a small message (latency: round
trip / 2) and a large one (bandwidth) over a process group of its own, pairs scheduled
round-robin so each rank is in at most one pair at a time. Every rank gets the same
:class:`ProbeResult`; :meth:`ProbeResult.slow_ranks` names the rank whose links are all slow
compared with the spread of the other links, or returns None.

Call it on every rank at the same point of the program (a training loop may call it at a
checkpoint or between steps). A peer that does not answer within ``timeout_s`` never raises
into the caller: its links are reported as failed (``failed`` holds the reason, latency
infinite, bandwidth 0), and a probe that falls out of step returns ``complete=False`` with
what this rank measured. Mistakes in the call (torch.distributed not initialised, bad sizes)
raise at once.

The result as JSON (:meth:`ProbeResult.to_json`, read back with :meth:`ProbeResult.load`)::

    {"format": "trainhealth-probe/1", "ranks": [0, 1, 2], "hosts": {"0": "node-a", ...},
     "sizes": [4096, 1048576], "repeats": 5, "complete": true, "notes": [],
     "measurements": [{"source": 0, "target": 1, "latency_s": 3.1e-05,
                       "bandwidth_bytes_per_s": 2.1e9, "latency_spread": 0.1, "bandwidth_spread": 0.04,
                       "failed": null}, ...]}

``latency_s`` is null for a failed link; the fields are those of :class:`LinkMeasurement`.

>>> links = [LinkMeasurement(a, b, 1e-4 * (5 if 2 in (a, b) else 1), 1e9 / (5 if 2 in (a, b) else 1))
...          for a, b in [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]]
>>> result = ProbeResult(tuple(links), (0, 1, 2, 3), {0: "a", 1: "a", 2: "b", 3: "b"})
>>> slow = result.slow_ranks()
>>> slow.rank, slow.host, slow.metric.value, round(slow.factor, 1)
(2, 'b', 'bandwidth', 5.0)
"""

from __future__ import annotations

import enum
import json
import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

__all__ = ["PROBE_FORMAT", "LinkMeasurement", "LinkMetric", "ProbeResult", "SlowRank", "probe_links", "round_robin"]

PROBE_FORMAT = "trainhealth-probe/1"
#: 1.4826 × MAD estimates the standard deviation of normal data.
_MAD_SCALE = 1.4826

log = logging.getLogger(__name__)


class LinkMetric(enum.Enum):
    """What made a rank stand out."""

    BANDWIDTH = "bandwidth"
    LATENCY = "latency"


@dataclass(frozen=True)
class LinkMeasurement:
    """One pair of ranks, measured by ping-pong (both directions together).

    ``latency_s`` is half the fastest small-message round trip; ``bandwidth_bytes_per_s`` is
    the extra bytes of the large message over its extra one-way time (fastest round trips).
    ``latency_spread`` and ``bandwidth_spread`` are the robust spreads of the small and large
    round trips over the repeats (1.4826 × the median absolute deviation of their logarithms),
    the pair's own noise. ``failed`` is None, or why the exchange did not complete (then
    latency is ``inf`` and bandwidth 0).
    """

    source: int
    target: int
    latency_s: float
    bandwidth_bytes_per_s: float
    latency_spread: float = 0.0
    bandwidth_spread: float = 0.0
    failed: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "target": self.target,
                "latency_s": self.latency_s if math.isfinite(self.latency_s) else None,
                "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s, "latency_spread": self.latency_spread,
                "bandwidth_spread": self.bandwidth_spread, "failed": self.failed}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LinkMeasurement:
        latency = data["latency_s"]
        return cls(int(data["source"]), int(data["target"]), math.inf if latency is None else float(latency),
                   float(data["bandwidth_bytes_per_s"]), float(data.get("latency_spread", 0.0)),
                   float(data.get("bandwidth_spread", 0.0)), data.get("failed"))


@dataclass(frozen=True)
class SlowRank:
    """The rank whose links are all slow.

    ``factor`` is how many times slower its median link is than the median link between the
    other ranks (bandwidth: theirs / its; latency: its / theirs; ``inf`` when all its links
    failed); ``threshold`` is the factor it had to exceed, from the measured noise.
    """

    rank: int
    host: str
    metric: LinkMetric
    factor: float
    threshold: float
    evidence: str


@dataclass(frozen=True)
class ProbeResult:
    """Every pair's measurement, the same on every rank."""

    measurements: tuple[LinkMeasurement, ...]
    ranks: tuple[int, ...]
    hosts: dict[int, str]
    sizes: tuple[int, ...] = ()
    repeats: int = 0
    complete: bool = True
    notes: tuple[str, ...] = field(default=())

    def links_of(self, rank: int) -> list[LinkMeasurement]:
        return [m for m in self.measurements if rank in (m.source, m.target)]

    def slow_ranks(self, *, min_factor: float = 1.5, z: float = 4.0) -> SlowRank | None:
        """The rank whose links are all slow, or None when no rank stands out.

        For each metric (bandwidth, latency) the candidate is the rank with the worst median
        over its links. It is named when every one of its links is worse than the median of
        the links between the other ranks by more than ``z`` robust standard deviations of the
        noise (the larger of the spread of those other links and the pairs' own repeat
        spread), and by at least ``min_factor``. Needs three ranks or more: a single link
        cannot say which of its two ends is slow.
        """
        if min_factor < 1 or z <= 0:
            raise ValueError(f"min_factor must be at least 1 and z positive, got {min_factor!r}, {z!r}")
        if len(self.ranks) < 3:
            return None
        best: tuple[float, SlowRank] | None = None
        for metric in LinkMetric:
            found = self._judge(metric, min_factor, z)
            if found is not None and (best is None or found[0] > best[0]):
                best = found
        return None if best is None else best[1]

    def _judge(self, metric: LinkMetric, min_factor: float, z: float) -> tuple[float, SlowRank] | None:
        def slowness(m: LinkMeasurement) -> float:  # log scale, higher is worse
            if m.failed is not None:
                return math.inf
            value = m.bandwidth_bytes_per_s if metric is LinkMetric.BANDWIDTH else m.latency_s
            if not value > 0:
                return math.inf if metric is LinkMetric.BANDWIDTH else -math.inf
            return -math.log(value) if metric is LinkMetric.BANDWIDTH else math.log(value)

        per_rank = {rank: [slowness(m) for m in self.links_of(rank)] for rank in self.ranks}
        if any(not values for values in per_rank.values()):
            return None
        candidate = max(self.ranks, key=lambda rank: _median(per_rank[rank]))
        others = [slowness(m) for m in self.measurements if candidate not in (m.source, m.target)]
        others = [value for value in others if math.isfinite(value)]
        if not others:
            return None
        reference = _median(others)
        spread = _MAD_SCALE * _median([abs(value - reference) for value in others])
        own = _median([m.bandwidth_spread if metric is LinkMetric.BANDWIDTH else m.latency_spread
                       for m in self.measurements if m.failed is None] or [0.0])
        noise = max(spread, own)
        margin = max(math.log(min_factor), z * noise)
        mine = per_rank[candidate]
        if min(mine) <= reference + margin:
            return None
        factor = math.exp(_median(mine) - reference)
        threshold = math.exp(margin)
        host = self.hosts.get(candidate, "?")
        failed = sum(1 for m in self.links_of(candidate) if m.failed is not None)
        evidence = (f"all {len(mine)} links of rank {candidate} ({host}) are slower than the median link between the "
                    f"other ranks: its median {metric.value} is {factor:.3g}x worse (named above {threshold:.3g}x: "
                    f"{z:g} x noise {noise:.3g} on a log scale, at least {min_factor:g}x)"
                    + (f"; {failed} of its links failed" if failed else ""))
        return (min(mine) - reference) / margin, SlowRank(candidate, host, metric, factor, threshold, evidence)

    # -- JSON --------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {"format": PROBE_FORMAT, "ranks": list(self.ranks),
                "hosts": {str(rank): host for rank, host in sorted(self.hosts.items())},
                "sizes": list(self.sizes), "repeats": self.repeats, "complete": self.complete,
                "notes": list(self.notes),
                "measurements": [m.to_dict() for m in sorted(self.measurements, key=lambda m: (m.source, m.target))]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProbeResult:
        if not isinstance(data, Mapping) or data.get("format") != PROBE_FORMAT:
            raise ValueError(f"not a link probe result: expected format {PROBE_FORMAT!r}")
        try:
            return cls(tuple(LinkMeasurement.from_dict(m) for m in data["measurements"]),
                       tuple(int(rank) for rank in data["ranks"]),
                       {int(rank): str(host) for rank, host in data["hosts"].items()},
                       tuple(int(size) for size in data.get("sizes", ())), int(data.get("repeats", 0)),
                       bool(data.get("complete", True)), tuple(str(note) for note in data.get("notes", ())))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed link probe result: {exc!r}") from None

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> ProbeResult:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON: {exc}") from None
        return cls.from_dict(data)

    def render(self) -> str:
        """A table per rank (median over its links) and the verdict."""
        lines = [f"{'rank':>5}  {'host':<20}{'latency us':>12}{'bandwidth MB/s':>16}{'failed':>8}"]
        for rank in self.ranks:
            links = self.links_of(rank)
            good = [m for m in links if m.failed is None]
            latency = f"{_median([m.latency_s for m in good]) * 1e6:.1f}" if good else "-"
            bandwidth = f"{_median([m.bandwidth_bytes_per_s for m in good]) / 1e6:.1f}" if good else "-"
            lines.append(f"{rank:>5}  {self.hosts.get(rank, '?'):<20}{latency:>12}{bandwidth:>16}"
                         f"{len(links) - len(good):>8}")
        slow = self.slow_ranks()
        if slow is not None:
            lines.append(f"slow link: rank {slow.rank} ({slow.host}): {slow.metric.value} {slow.factor:.3g}x worse "
                         f"than the other links")
            lines.append(f"  {slow.evidence}")
        elif len(self.ranks) < 3:
            lines.append("no verdict: a probe of fewer than 3 ranks cannot tell which end of a link is slow")
        else:
            lines.append("no rank stands out: every rank's links are within the noise of the others")
        if not self.complete:
            lines.append("incomplete: the probe fell out of step; this holds only what this rank measured")
        lines.extend(f"note: {note}" for note in self.notes)
        return "\n".join(lines)


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if not ordered:
        return math.nan
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def round_robin(ranks: Sequence[int]) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs covering every pair once (the circle method).

    >>> round_robin([0, 1, 2, 3])
    [[(0, 3), (1, 2)], [(0, 2), (1, 3)], [(0, 1), (2, 3)]]
    """
    slots: list[int | None] = list(ranks) + ([None] if len(ranks) % 2 else [])
    rounds = []
    for _ in range(len(slots) - 1):
        pairs = []
        for index in range(len(slots) // 2):
            a, b = slots[index], slots[len(slots) - 1 - index]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        slots = [slots[0], slots[-1], *slots[1:-1]]
    return rounds


def _untraced(dist: Any) -> Any:
    """send, recv and barrier on the process group's own methods: the probe's traffic is monitoring, not
    training, and must not enter the collective trace the localizer reads (``trainhealth.comm`` wraps the
    module's functions, and their unwrapped versions still call the wrapped ``isend`` and ``irecv``)."""

    def send(tensor: Any, peer: int, group: Any, tag: int) -> None:
        group.send([tensor], dist.get_group_rank(group, peer), tag).wait()

    def recv(tensor: Any, peer: int, group: Any, tag: int) -> None:
        group.recv([tensor], dist.get_group_rank(group, peer), tag).wait()

    def barrier(group: Any) -> None:
        group.barrier().wait()

    return SimpleNamespace(send=send, recv=recv, barrier=barrier)


def _exchange(dist, group, buffers, me: int, peer: int, base_tag: int) -> list[float]:  # noqa: ANN001
    """One ping-pong per buffer with ``peer`` (the lower rank sends first); the round-trip times."""
    times = []
    for index, buffer in enumerate(buffers):
        start = time.perf_counter()
        if me < peer:
            dist.send(buffer, peer, group=group, tag=base_tag + index)
            dist.recv(buffer, peer, group=group, tag=base_tag + index)
        else:
            dist.recv(buffer, peer, group=group, tag=base_tag + index)
            dist.send(buffer, peer, group=group, tag=base_tag + index)
        times.append(time.perf_counter() - start)
    return times


def _measurement(a: int, b: int, sizes: Sequence[int], times: Sequence[Sequence[float]]) -> LinkMeasurement:
    """From the round trips of every pass (one time per size each), fastest first."""
    small, large = sizes[0], sizes[-1]
    smalls, larges = [t[0] for t in times], [t[-1] for t in times]
    # The fastest pass: scheduling delays and other traffic only ever add time.
    rtt_small, rtt_large = min(smalls), min(larges)
    extra_time = (rtt_large - rtt_small) / 2
    bandwidth = (large - small) / extra_time if extra_time > 0 else large / (rtt_large / 2)
    return LinkMeasurement(a, b, rtt_small / 2, bandwidth, _log_spread(smalls), _log_spread(larges))


def _log_spread(values: Sequence[float]) -> float:
    logs = [math.log(value) for value in values if value > 0]
    centre = _median(logs)
    return _MAD_SCALE * _median([abs(value - centre) for value in logs]) if logs else 0.0


def probe_links(*, group=None, sizes: Iterable[int] = (4096, 1 << 20), repeats: int = 5,  # noqa: ANN001
                timeout_s: float = 60.0) -> ProbeResult:
    """Measure every pair of ranks of ``group`` (default: all) and return the same result on every rank.

    Every rank of ``group`` calls it at the same point. It creates its own gloo process group
    (``timeout_s`` bounds every wait in it) and destroys it on return. The smallest of
    ``sizes`` (bytes) measures latency, the largest bandwidth. The whole round-robin schedule
    runs ``repeats`` times after a warm-up pass, each pair exchanging one message of each size
    per pass, and the fastest pass counts; a barrier of the probe group ends every round. The
    time taken is about ``(repeats + 1) × (ranks - 1)`` rounds of the slowest pair's exchange.
    """
    import torch
    import torch.distributed as dist

    sizes = tuple(sorted(set(int(size) for size in sizes)))
    if len(sizes) < 2 or sizes[0] < 1:
        raise ValueError(f"sizes needs two or more distinct positive byte counts, got {sizes!r}")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("probe_links needs torch.distributed initialised (init_process_group) on every rank")
    me = dist.get_rank()
    if group is None:
        ranks = tuple(range(dist.get_world_size()))
    else:
        ranks = tuple(sorted(dist.get_process_group_ranks(group)))
        if me not in ranks:
            raise ValueError(f"rank {me} is not in the group passed to probe_links")

    from trainhealth.identity import Identity

    host = Identity.from_env().host
    timeout = timedelta(seconds=timeout_s)
    probe_group = dist.new_group(ranks=list(ranks), backend="gloo", timeout=timeout,
                                 use_local_synchronization=group is not None)
    untraced = _untraced(dist)
    schedule = round_robin(ranks)
    partners = [{rank: (a, b, index) for index, (a, b) in enumerate(pairs) for rank in (a, b)} for pairs in schedule]
    buffers = [torch.zeros(size, dtype=torch.uint8) for size in sizes]
    times: dict[tuple[int, int], list[list[float]]] = {}
    failures: dict[tuple[int, int], str] = {}
    notes: list[str] = []
    complete = True
    width = max(len(pairs) for pairs in schedule) * len(sizes) if schedule else 1
    try:
        # Pass 0 warms every connection up; the passes spread each pair's repeats over time,
        # so a burst of other load slows one pass, not the fastest of them.
        for repeat in range(repeats + 1):
            for round_index, pairing in enumerate(partners):
                if me in pairing:
                    a, b, pair_index = pairing[me]
                    peer = b if me == a else a
                    if (a, b) not in failures:
                        tag = 1 + ((repeat * len(schedule) + round_index) * width) + pair_index * len(sizes)
                        try:
                            measured = _exchange(untraced, probe_group, buffers, me, peer, tag)
                            if repeat:
                                times.setdefault((a, b), []).append(measured)
                        except RuntimeError as exc:  # a peer that did not answer in time, a broken connection
                            log.warning("link probe: rank %d <-> %d failed: %s", me, peer, exc)
                            failures[(a, b)] = f"{type(exc).__name__}: {exc}"[:300]
                untraced.barrier(group=probe_group)
    except RuntimeError as exc:
        complete = False
        notes.append(f"rank {me}: the probe fell out of step: {exc}"[:300])
    try:
        mine = [LinkMeasurement(a, b, math.inf, 0.0, failed=reason) for (a, b), reason in failures.items()]
        mine += [_measurement(a, b, sizes, passes) for (a, b), passes in times.items()
                 if (a, b) not in failures and a == me]
        gathered: list[Any] = [None] * len(ranks)
        if complete:
            try:
                dist.all_gather_object(gathered, {"rank": me, "host": host, "links": mine}, group=probe_group)
            except RuntimeError as exc:
                complete = False
                notes.append(f"rank {me}: gathering the measurements failed: {exc}"[:300])
        if not complete:
            gathered = [{"rank": me, "host": host, "links": mine}]
    finally:
        try:
            dist.destroy_process_group(probe_group)
        except Exception as exc:  # noqa: BLE001 - cleanup must not raise into the training loop
            log.warning("link probe: destroying its process group failed: %s", exc)
    links: dict[tuple[int, int], LinkMeasurement] = {}
    for part in gathered:
        for m in part["links"]:
            key = (m.source, m.target)
            if key not in links or links[key].failed is None and m.failed is not None:
                links[key] = m  # a failure seen by either end wins
    hosts = {part["rank"]: part["host"] for part in gathered}
    return ProbeResult(tuple(sorted(links.values(), key=lambda m: (m.source, m.target))), ranks, hosts, sizes,
                       repeats, complete, tuple(notes))
