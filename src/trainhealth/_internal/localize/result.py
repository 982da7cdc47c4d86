"""The localization result: trace format v1's public output (docs/trace-format.md).

Beside the fixed fields, ``details`` may carry ``events`` (slow stretches that blame
no device: they came and went, or healthy members of the run show the same),
``near_misses``, ``power`` (what the window could have seen: the slowdown of one
rank, over its last steps or all window, blamed in every injection), ``uncovered_ranks``,
``in_this_run`` (faults that came and went: the run's past, apart from its state now) and
``job_wide`` (every rank slower at once: no single device).
A result of ``trainhealth analyze`` names the job it judges (``job``, the job label, and
``job_name``, its logical name, where known); one run of the analyzer gives a
:class:`JobResults`, a result per job.

>>> result = LocalizationResult("compute", (Suspect("gpu", (5,), "node-b", None, 0.93, "last to arrive"),), (12,), ["..."])
>>> sorted(result.to_dict())
['advice', 'irregular_steps', 'suspects', 'verdict']
>>> run = JobResults.of([LocalizationResult("healthy", (), (), [], job="a"), LocalizationResult("hang", (), (), [], job="b")])
>>> [(r.job, r.verdict) for r in run.results], run.to_dict()["jobs"][0]["job"]
([('b', 'hang'), ('a', 'healthy')], 'b')
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["VERDICTS", "JobResults", "LocalizationResult", "Suspect", "past_text", "verdict_text"]

VERDICTS = ("healthy", "compute", "communication", "imbalance", "insufficient_data", "hang")
#: The order jobs are listed in: a hang first, then a blamed device or link, then the rest.
_URGENCY = {"hang": 0, "compute": 1, "communication": 1, "imbalance": 2, "insufficient_data": 3, "healthy": 4}


def past_text(past: list[dict[str, Any]]) -> str:
    """The run's past faults (``in_this_run``) in one line.

    >>> past_text([{"component": "gpu:rank-2", "slowdown": 3.18, "steps": [285, 571], "recovered": True}])
    'gpu:rank-2 3.18x slower in steps 285-571, recovered'
    """
    parts = []
    for episode in past:
        factor = f" {episode['slowdown']:.2f}x" if episode.get("slowdown") is not None else ""
        first, last = episode["steps"]
        parts.append(f"{episode['component']}{factor} slower in steps {first}-{last}, recovered")
    return "; ".join(parts)


def verdict_text(verdict: str, past: list[dict[str, Any]] | None) -> str:
    """The verdict with the run's past beside it: never a bare "healthy" beside a fault the run had.

    >>> verdict_text("healthy", [{"component": "gpu:rank-2", "slowdown": 3.18, "steps": [285, 571]}])
    'healthy now; in this run: gpu:rank-2 3.18x slower in steps 285-571, recovered'
    >>> verdict_text("compute", [{"component": "gpu:rank-2", "slowdown": 3.18, "steps": [285, 571]}])
    'compute'
    """
    if not past or verdict not in ("healthy", "insufficient_data"):
        return verdict
    return f"{verdict}{' now' if verdict == 'healthy' else ''}; in this run: {past_text(past)}"


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
    job: str | None = None  # the job label of the job judged (trainhealth analyze), which the suspects belong to
    job_name: str | None = None  # that job's logical name, where its ranks export one

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}")

    def to_dict(self) -> dict[str, Any]:
        named = {key: value for key, value in (("job", self.job), ("job_name", self.job_name)) if value is not None}
        return {
            **named,
            "verdict": self.verdict,
            "suspects": [s.to_dict() for s in self.suspects],
            "irregular_steps": list(self.irregular_steps),
            "advice": list(self.advice),
            **self.details,
        }

    def render(self) -> str:
        lines = [f"verdict: {verdict_text(self.verdict, self.details.get('in_this_run'))}"]
        if self.details.get("simulated"):
            lines[0] += "  (input is SIMULATED)"
        if self.job is not None:
            lines.insert(0, f"job: {self.job}" + (f" ({self.job_name})" if self.job_name else ""))
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


@dataclass(frozen=True)
class JobResults:
    """One run of the analyzer: a result per job it read, each judged on its own, the most urgent first (a
    hang, then a blamed GPU or link, then imbalance, insufficient data, healthy; jobs alike by label)."""

    results: tuple[LocalizationResult, ...]

    @classmethod
    def of(cls, results: Iterable[LocalizationResult]) -> JobResults:
        return cls(tuple(sorted(results, key=lambda r: (_URGENCY[r.verdict], r.job or ""))))

    @property
    def first(self) -> LocalizationResult:
        """The most urgent job's result (the only one where the source held one job)."""
        return self.results[0]

    def result(self, job: str | None) -> LocalizationResult | None:
        """The result of the job labelled ``job``, or None when the run judged no such job."""
        return next((r for r in self.results if r.job == job), None)

    def to_dict(self) -> dict[str, Any]:
        return {"jobs": [r.to_dict() for r in self.results]}

    def render(self) -> str:
        return "\n\n".join(r.render() for r in self.results)
