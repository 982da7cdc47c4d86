"""The localization result: trace format v1's public output (docs/trace-format.md).

Beside the fixed fields, ``details`` may carry ``events`` (slow stretches that blame
no device: they came and went, or healthy members of the run show the same),
``near_misses``, ``power`` (what the window could have seen: the slowdown of one
rank over its last steps that would have been blamed) and ``uncovered_ranks``.

>>> result = LocalizationResult("compute", (Suspect("gpu", (5,), "node-b", None, 0.93, "last to arrive"),), (12,), ["..."])
>>> sorted(result.to_dict())
['advice', 'irregular_steps', 'suspects', 'verdict']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["VERDICTS", "LocalizationResult", "Suspect"]

VERDICTS = ("healthy", "compute", "communication", "imbalance", "insufficient_data", "hang")


@dataclass(frozen=True)
class Suspect:
    """A component to blame: ``kind`` gpu, link or host; ``ranks`` it covers; ``score`` in [0, 1]."""

    kind: str
    ranks: tuple[int, ...]
    host: str | None
    group: str | None
    score: float
    evidence: str
    component: str | None = None  # e.g. "gpu:rank-5", "nic:rank-9", "switch:leaf-2", "host:node-3"
    slowdown: float | None = None  # how many times as long it computes (or its transfers take), where measured
    since_step: int | None = None  # the step the slowness began, where an onset was found

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "ranks": list(self.ranks),
            "host": self.host,
            "group": self.group,
            "score": round(self.score, 4),
            "evidence": self.evidence,
        }
        if self.component is not None:
            out["component"] = self.component
        if self.slowdown is not None:
            out["slowdown"] = round(self.slowdown, 4)
        if self.since_step is not None:
            out["since_step"] = self.since_step
        return out


@dataclass(frozen=True)
class LocalizationResult:
    verdict: str
    suspects: tuple[Suspect, ...]
    irregular_steps: tuple[int, ...]
    advice: list[str]
    details: dict[str, Any] = field(default_factory=dict)  # extra, optional fields of the JSON

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "suspects": [s.to_dict() for s in self.suspects],
            "irregular_steps": list(self.irregular_steps),
            "advice": list(self.advice),
            **self.details,
        }

    def render(self) -> str:
        lines = [f"verdict: {self.verdict}"]
        if self.details.get("simulated"):
            lines[0] += "  (input is SIMULATED)"
        steps = self.irregular_steps
        lines.append(
            f"irregular steps: {len(steps)}"
            + (f" ({', '.join(map(str, steps[:12]))}{', ...' if len(steps) > 12 else ''})" if steps else "")
        )
        if self.suspects:
            lines.append("suspects:")
            for position, suspect in enumerate(self.suspects, start=1):
                ranks = ", ".join(map(str, suspect.ranks[:8])) + (", ..." if len(suspect.ranks) > 8 else "")
                where = f" on {suspect.host}" if suspect.host else ""
                label = suspect.component or f"{suspect.kind} {ranks}"
                lines.append(f"  {position}. {label} (ranks {ranks}){where}  score {suspect.score:.2f}")
                lines.append(f"     {suspect.evidence}")
        events = self.details.get("events", [])
        if events:
            lines.append("events (not faults: they came and went, or the run's healthy members do the same):")
            lines += [f"  - {event['component']}: {event['evidence']}" for event in events]
        for reason in self.details.get("reasons", []):
            lines.append(f"note: {reason}")
        if self.advice:
            lines.append("advice:")
            lines += [f"  - {line}" for line in self.advice]
        return "\n".join(lines)
