"""The link probe's result: every pair's measurement, the slow-rank verdict, and its JSON form.

The result as JSON (:meth:`ProbeResult.to_json`, read back with :meth:`ProbeResult.load`)::

    {"format": "trainhealth-probe/1", "ranks": [0, 1, 2], "hosts": {"0": "node-a", ...},
     "sizes": [4096, 1048576], "repeats": 5, "complete": true, "notes": [],
     "measurements": [{"source": 0, "target": 1, "latency_s": 3.1e-05,
                       "bandwidth_bytes_per_s": 2.1e9, "latency_spread": 0.1, "bandwidth_spread": 0.04,
                       "failed": null}, ...]}

``latency_s`` is null for a failed link; the fields are those of :class:`LinkMeasurement`.

>>> links = [LinkMeasurement(a, b, 1e-5, 1e9 / (5 if 2 in (a, b) else 1))
...          for a, b in [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]]
>>> result = ProbeResult(tuple(links), (0, 1, 2, 3), {0: "a", 1: "a", 2: "b", 3: "b"}, (4096, 1 << 20))
>>> slow = result.slow_ranks()
>>> slow.rank, slow.host, slow.metric.value, round(slow.factor, 1)
(2, 'b', 'bandwidth', 5.0)
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainhealth._internal._files import write_json

__all__ = ["PROBE_FORMAT", "LinkMeasurement", "LinkMetric", "ProbeResult", "SlowRank"]

PROBE_FORMAT = "trainhealth-probe/1"
#: 1.4826 × MAD estimates the standard deviation of normal data.
_MAD_SCALE = 1.4826


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
        return {
            "source": self.source,
            "target": self.target,
            "latency_s": self.latency_s if math.isfinite(self.latency_s) else None,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "latency_spread": self.latency_spread,
            "bandwidth_spread": self.bandwidth_spread,
            "failed": self.failed,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LinkMeasurement:
        latency = data["latency_s"]
        return cls(
            int(data["source"]),
            int(data["target"]),
            math.inf if latency is None else float(latency),
            float(data["bandwidth_bytes_per_s"]),
            float(data.get("latency_spread", 0.0)),
            float(data.get("bandwidth_spread", 0.0)),
            data.get("failed"),
        )

    @classmethod
    def from_round_trips(
        cls, source: int, target: int, sizes: Sequence[int], times: Sequence[Sequence[float]]
    ) -> LinkMeasurement:
        """From the round trips of every pass (one time per size each, in the order of ``sizes``)."""
        small, large = sizes[0], sizes[-1]
        smalls, larges = [t[0] for t in times], [t[-1] for t in times]
        # The fastest pass: scheduling delays and other traffic only ever add time.
        rtt_small, rtt_large = min(smalls), min(larges)
        extra_time = (rtt_large - rtt_small) / 2
        bandwidth = (large - small) / extra_time if extra_time > 0 else large / (rtt_large / 2)
        return cls(source, target, rtt_small / 2, bandwidth, _log_spread(smalls), _log_spread(larges))


@dataclass(frozen=True)
class SlowRank:
    """The rank whose links are all slow.

    ``factor`` is how many times slower its median link is than the median link between the
    other ranks (bandwidth of the largest message: theirs / its; latency: its / theirs; ``inf`` when all its links
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

        For each metric (latency, then bandwidth) the candidate is the rank with the worst
        median over its links. It is named when every one of its links is worse than the
        median of the links between the other ranks by more than ``z`` robust standard
        deviations of the noise (the larger of the spread of those other links and the pairs'
        own repeat spread), and by at least ``min_factor``. Latency is judged first: a late
        small message makes the large one late too. Bandwidth is judged on the largest
        message's one-way time (:meth:`transfer_bandwidth`), not on the difference of two
        round trips, which on a fast link is smaller than the scheduling jitter and scatters
        healthy links over orders of magnitude. Needs three ranks or more: a single link
        cannot say which of its two ends is slow.
        """
        if min_factor < 1 or z <= 0:
            raise ValueError(f"min_factor must be at least 1 and z positive, got {min_factor!r}, {z!r}")
        if len(self.ranks) < 3:
            return None
        for metric in (LinkMetric.LATENCY, LinkMetric.BANDWIDTH):
            found = self._judge(metric, min_factor, z)
            if found is not None:
                return found
        return None

    def transfer_bandwidth(self, m: LinkMeasurement) -> float:
        """The largest message's size over its one-way time (latency included), bytes/s.

        Falls back to the measured bandwidth when the result does not record its sizes.
        """
        if len(self.sizes) < 2 or not m.bandwidth_bytes_per_s > 0 or not math.isfinite(m.latency_s):
            return m.bandwidth_bytes_per_s
        small, large = self.sizes[0], self.sizes[-1]
        return large / (m.latency_s + (large - small) / m.bandwidth_bytes_per_s)

    def _judge(self, metric: LinkMetric, min_factor: float, z: float) -> SlowRank | None:
        def slowness(m: LinkMeasurement) -> float:  # log scale, higher is worse
            if m.failed is not None:
                return math.inf
            value = self.transfer_bandwidth(m) if metric is LinkMetric.BANDWIDTH else m.latency_s
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
        own = _median(
            [
                m.bandwidth_spread if metric is LinkMetric.BANDWIDTH else m.latency_spread
                for m in self.measurements
                if m.failed is None
            ]
            or [0.0]
        )
        noise = max(spread, own)
        margin = max(math.log(min_factor), z * noise)
        mine = per_rank[candidate]
        if min(mine) <= reference + margin:
            return None
        factor = math.exp(_median(mine) - reference)
        threshold = math.exp(margin)
        host = self.hosts.get(candidate, "?")
        failed = sum(1 for m in self.links_of(candidate) if m.failed is not None)
        what = "large-message bandwidth" if metric is LinkMetric.BANDWIDTH else "latency"
        evidence = (
            f"all {len(mine)} links of rank {candidate} ({host}) are slower than the median link between the "
            f"other ranks: its median {what} is {factor:.3g}x worse (named above {threshold:.3g}x: "
            f"{z:g} x noise {noise:.3g} on a log scale, at least {min_factor:g}x)"
            + (f"; {failed} of its links failed" if failed else "")
        )
        return SlowRank(candidate, host, metric, factor, threshold, evidence)

    # -- JSON --------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PROBE_FORMAT,
            "ranks": list(self.ranks),
            "hosts": {str(rank): host for rank, host in sorted(self.hosts.items())},
            "sizes": list(self.sizes),
            "repeats": self.repeats,
            "complete": self.complete,
            "notes": list(self.notes),
            "measurements": [m.to_dict() for m in sorted(self.measurements, key=lambda m: (m.source, m.target))],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProbeResult:
        if not isinstance(data, Mapping) or data.get("format") != PROBE_FORMAT:
            raise ValueError(f"not a link probe result: expected format {PROBE_FORMAT!r}")
        try:
            return cls(
                tuple(LinkMeasurement.from_dict(m) for m in data["measurements"]),
                tuple(int(rank) for rank in data["ranks"]),
                {int(rank): str(host) for rank, host in data["hosts"].items()},
                tuple(int(size) for size in data.get("sizes", ())),
                int(data.get("repeats", 0)),
                bool(data.get("complete", True)),
                tuple(str(note) for note in data.get("notes", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed link probe result: {exc!r}") from None

    def to_json(self, path: str | Path) -> None:
        write_json(Path(path), self.to_dict())

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
            lines.append(
                f"{rank:>5}  {self.hosts.get(rank, '?'):<20}{latency:>12}{bandwidth:>16}{len(links) - len(good):>8}"
            )
        slow = self.slow_ranks()
        if slow is not None:
            lines.append(
                f"slow link: rank {slow.rank} ({slow.host}): {slow.metric.value} {slow.factor:.3g}x worse "
                f"than the other links"
            )
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


def _log_spread(values: Sequence[float]) -> float:
    logs = [math.log(value) for value in values if value > 0]
    centre = _median(logs)
    return _MAD_SCALE * _median([abs(value - centre) for value in logs]) if logs else 0.0
