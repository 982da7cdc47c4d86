"""What a finished real-run case produced: its measured slowdowns, the scored answers and the outcome record.

After the job the launcher localizes the ranks' traces with this code (:func:`score_run`), scores
the answer beside the naive baselines and the live polls, and returns one :class:`CaseOutcome`.
"""

from __future__ import annotations

import inspect
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainhealth._internal._files import write_json
from trainhealth_lab.realrun.baselines import baseline_compute, baseline_wait, score_baseline
from trainhealth_lab.realrun.live import LivePoll
from trainhealth_lab.realrun.spec import CaseSpec, LabFault, Truth, with_onset
from trainhealth_lab.scoring import score_result

__all__ = ["CaseOutcome", "finish", "score_run"]


@dataclass(frozen=True)
class CaseOutcome:
    """Everything one case produced; one JSON line of the suite's results."""

    case: str
    status: str  # ok, error, skipped
    reason: str
    run_dir: str
    truth: dict[str, Any]
    wall_s: float = 0.0
    steps_done: int = 0
    median_step_s: float | None = None
    #: a compute or CPU-contention fault: the target's compute per step, faulty steps / its other steps;
    #: otherwise the job's step time, faulty steps / other steps
    measured_slowdown: float | None = None
    measured_step_slowdown: float | None = None  # the job's step time, faulty steps / other steps
    others_slowdown: float | None = None  # the other ranks' compute per step, the same steps
    localize: dict[str, Any] | None = None  # the final answer's score
    localize_probe: dict[str, Any] | None = None  # with the probe, when the localizer takes one
    baseline_compute: dict[str, Any] | None = None
    baseline_wait: dict[str, Any] | None = None
    live_detection_step: int | None = None
    live_detection_delay: int | None = None
    live_false_blame_polls: int = 0
    live_polls: tuple[LivePoll, ...] = ()
    noise: bool = False
    answer: dict[str, Any] | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["live_polls"] = [asdict(p) for p in self.live_polls]
        return out


@dataclass(frozen=True)
class _Slowdowns:
    steps_done: int = 0
    median_step_s: float | None = None
    measured: float | None = None
    step: float | None = None
    others: float | None = None


def _ratio(active: list[float], calm: list[float]) -> float | None:
    if not active or not calm or float(np.median(calm)) <= 0:
        return None
    return round(float(np.median(active)) / float(np.median(calm)), 3)


def _measured_slowdown(spec: CaseSpec, plan: Truth, run_dir: Path) -> _Slowdowns:
    """Step and compute slowdowns (median over faulty steps / median over the others) from the ranks' timings."""
    step_s: dict[int, float] = {}
    busy: dict[int, dict[int, float]] = {}
    for rank in range(spec.ranks):
        try:
            rows = json.loads((run_dir / "progress" / f"steps-rank-{rank}.json").read_text())
        except (OSError, ValueError):
            continue
        for step, _, seconds, compute, *_ in rows:
            step_s[int(step)] = max(step_s.get(int(step), 0.0), float(seconds))
            busy.setdefault(rank, {})[int(step)] = float(compute)
    if not step_s:
        return _Slowdowns()
    steps = sorted(step_s)[1:]  # step 0 holds the warm-up
    median = float(np.median([step_s[s] for s in steps])) if steps else None
    if plan.target is None or not steps:
        return _Slowdowns(len(step_s), median)
    fault = with_onset(spec.fault, plan.onset)
    active = [s for s in steps if fault.active(s)]
    calm = [s for s in steps if not fault.active(s)]
    step_ratio = _ratio([step_s[s] for s in active], [step_s[s] for s in calm])
    others = [r for r in busy if r != plan.target]
    other_ratio = _ratio(
        [busy[r][s] for r in others for s in active if s in busy[r]],
        [busy[r][s] for r in others for s in calm if s in busy[r]],
    )
    measured = step_ratio
    if spec.kind in (LabFault.COMPUTE, LabFault.CPU_CONTENTION) and plan.target in busy:
        mine = busy[plan.target]
        measured = _ratio([mine[s] for s in active if s in mine], [mine[s] for s in calm if s in mine])
    return _Slowdowns(len(step_s), median, measured, step_ratio, other_ratio)


def finish(spec: CaseSpec, plan: Truth, run_dir: Path, wall: float, polls: list[LivePoll], noise: bool) -> CaseOutcome:
    slow = _measured_slowdown(spec, plan, run_dir)
    detection = next((p.step for p in polls if p.right), None)
    delay = None if detection is None or plan.target is None else max(0, detection - plan.onset)
    false_polls = sum(
        1
        for p in polls
        if p.verdict in ("compute", "communication")
        and not p.right
        and (plan.target is None or p.step < plan.onset or p.top not in plan.components)
    )
    common = dict(
        case=spec.name,
        run_dir=str(run_dir),
        truth=plan.to_dict(),
        wall_s=round(wall, 2),
        steps_done=slow.steps_done,
        median_step_s=slow.median_step_s,
        measured_slowdown=slow.measured,
        measured_step_slowdown=slow.step,
        others_slowdown=slow.others,
        live_detection_step=detection,
        live_detection_delay=delay,
        live_false_blame_polls=false_polls,
        live_polls=tuple(polls),
        noise=noise,
    )
    try:
        scores = score_run(plan, run_dir)
    except _RunError as exc:
        return CaseOutcome(status="error", reason=str(exc), **exc.partial, **common)  # type: ignore[arg-type]
    return CaseOutcome(status="ok", reason="", **scores, **common)  # type: ignore[arg-type]


class _RunError(Exception):
    def __init__(self, message: str, partial: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.partial = partial or {}


def score_run(plan: Truth, run_dir: str | os.PathLike[str], *, save: bool = True) -> dict[str, Any]:
    """Localize one finished run's traces with this code and score the answers (``localize``, ``localize_probe``,
    ``baseline_compute``, ``baseline_wait``, ``answer``); with ``save``, ``answer.json`` is written beside the
    traces."""
    from trainhealth._internal.localize.localizer import localize
    from trainhealth._internal.traces.io import read_trace

    run_dir = Path(run_dir)
    try:
        trace = read_trace([run_dir])
    except Exception as exc:
        raise _RunError(f"reading the traces: {exc}") from None
    records = trace.records
    baselines = dict(
        baseline_compute=score_baseline(plan, baseline_compute(records)).to_dict(),
        baseline_wait=score_baseline(plan, baseline_wait(records)).to_dict(),
    )
    try:
        result = localize(records, trace.topology)
    except Exception as exc:
        raise _RunError(f"localize raised {type(exc).__name__}: {exc}", baselines) from None
    probe_score = _with_probe(localize, records, trace.topology, run_dir, plan, save)
    if save:
        write_json(run_dir / "answer.json", result.to_dict())
    return dict(
        localize=score_result(plan.expected(), result).to_dict(),
        localize_probe=probe_score,
        answer=result.to_dict(),
        **baselines,
    )


def _with_probe(
    localize: Any, records: Any, topology: Any, run_dir: Path, plan: Truth, save: bool = True
) -> dict[str, Any] | None:
    """The answer with the link probe's result, when there is one and ``localize`` takes ``probe=``."""
    path = run_dir / "probe.json"
    if not path.is_file() or "probe" not in inspect.signature(localize).parameters:
        return None
    if "unavailable" in json.loads(path.read_text()):
        return None
    try:
        from trainhealth._internal.exporters.collectives.probe import ProbeResult

        result = localize(records, topology, probe=ProbeResult.load(path))
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    if save:
        write_json(run_dir / "answer-probe.json", result.to_dict())
    return score_result(plan.expected(), result).to_dict()
