"""What ``trainhealth trace info`` prints: ranks, groups, steps, ops, time span, per-op durations.

>>> import pandas as pd
>>> from trainhealth._internal.traces.format import validate
>>> records = validate(pd.DataFrame({"rank": [0, 1], "step": [0, 0], "op": ["barrier"] * 2, "group": ["g"] * 2,
...                                  "seq": [0, 0], "start": [0.0, 0.0], "duration": [0.5, 1.5]}), "t")
>>> s = summarize(records)
>>> s.ranks, s.ops[0].op, s.ops[0].median_s
((0, 1), 'barrier', 1.0)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["OpSummary", "TraceSummary", "summarize"]


@dataclass(frozen=True)
class OpSummary:
    op: str
    count: int
    median_s: float
    p90_s: float
    p99_s: float
    max_s: float
    total_s: float


@dataclass(frozen=True)
class TraceSummary:
    records: int
    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    groups: dict[str, int]  # group -> number of member ranks seen
    steps: tuple[int, ...]
    start: float
    end: float
    ops: tuple[OpSummary, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def render(self) -> str:
        lines = [
            f"records  {self.records}",
            f"ranks    {len(self.ranks)} ({_ranges(self.ranks)})",
            f"hosts    {len(self.hosts)}"
            + (f" ({', '.join(self.hosts[:8])}{', ...' if len(self.hosts) > 8 else ''})" if self.hosts else ""),
            f"groups   {len(self.groups)}"
            + (
                f" ({', '.join(list(self.groups)[:6])}{', ...' if len(self.groups) > 6 else ''})" if self.groups else ""
            ),
            f"steps    {len(self.steps)} ({_ranges(self.steps)})",
            f"span     {self.end - self.start:.3f} s",
            "",
            f"{'op':<15}{'count':>9}{'median':>12}{'p90':>12}{'p99':>12}{'max':>12}{'total':>12}",
        ]
        for s in self.ops:
            lines.append(
                f"{s.op:<15}{s.count:>9}{_seconds(s.median_s):>12}{_seconds(s.p90_s):>12}"
                f"{_seconds(s.p99_s):>12}{_seconds(s.max_s):>12}{_seconds(s.total_s):>12}"
            )
        return "\n".join(lines)


def _seconds(value: float) -> str:
    if value >= 1:
        return f"{value:.3f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3f} ms"
    return f"{value * 1e6:.1f} us"


def _ranges(values: tuple[int, ...]) -> str:
    if not values:
        return ""
    parts, start, previous = [], values[0], values[0]
    for value in values[1:]:
        if value != previous + 1:
            parts.append(f"{start}" if start == previous else f"{start}-{previous}")
            start = value
        previous = value
    parts.append(f"{start}" if start == previous else f"{start}-{previous}")
    text = ", ".join(parts)
    return text if len(text) < 80 else text[:77] + "..."


def summarize(records: pd.DataFrame) -> TraceSummary:
    ops = []
    for op, durations in records.groupby("op", sort=True)["duration"]:
        values = durations.to_numpy()
        ops.append(
            OpSummary(
                str(op),
                len(values),
                float(np.median(values)),
                float(np.quantile(values, 0.9)),
                float(np.quantile(values, 0.99)),
                float(values.max()),
                float(values.sum()),
            )
        )
    groups = records.dropna(subset=["group"]).groupby("group")["rank"].nunique()
    hosts = tuple(sorted(records["host"].dropna().unique())) if "host" in records.columns else ()
    return TraceSummary(
        records=len(records),
        ranks=tuple(sorted(int(r) for r in records["rank"].unique())),
        hosts=hosts,
        groups={str(g): int(n) for g, n in groups.items()},
        steps=tuple(sorted(int(s) for s in records["step"].unique())),
        start=float(records["start"].min()),
        end=float((records["start"] + records["duration"]).max()),
        ops=tuple(ops),
    )
