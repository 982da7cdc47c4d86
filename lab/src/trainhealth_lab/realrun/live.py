"""The live analyzer of a running case: polled on its own thread, each answer scored against the truth so far.

While the job runs the launcher polls ``Analyzer(TraceDirectory(run_dir), MetricStore()).run_once()``
every ``POLL_S`` and records, for each poll, the step the ranks had reached when it read the traces:
the detection delay of a case is the first right poll's step minus the onset.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainhealth_lab.realrun.spec import Truth
from trainhealth_lab.scoring import score_result

__all__ = ["ANALYZER_NICE", "POLL_S", "LivePoll", "LiveWatcher", "progress"]

#: Seconds between polls of the live analyzer.
POLL_S = 0.4
#: Niceness of the live analyzer's thread: it reads the traces on idle CPU, not on the ranks' time.
ANALYZER_NICE = 19


@dataclass(frozen=True)
class LivePoll:
    """One run of the live analyzer: when, at which step the ranks were, and its answer."""

    wall_s: float
    step: int  # the last step the furthest rank had finished when the poll read the traces
    verdict: str | None
    top: str | None
    right: bool
    error: str | None = None
    analysis_s: float = 0.0  # seconds the analyzer took


def progress(run_dir: Path, ranks: int) -> tuple[int, int]:
    """(slowest, fastest) step finished over the ranks; -1 when a rank has not finished one."""
    steps = []
    for rank in range(ranks):
        try:
            steps.append(int(json.loads((run_dir / "progress" / f"rank-{rank}.json").read_text())["step"]))
        except (OSError, ValueError, KeyError):
            steps.append(-1)
    return min(steps), max(steps)


def _analyzer(run_dir: Path) -> Any:
    from trainhealth._internal.localize.analyzer import Analyzer
    from trainhealth._internal.localize.sources import TraceDirectory
    from trainhealth._internal.store import MetricStore

    return Analyzer(TraceDirectory(run_dir), MetricStore())


class LiveWatcher:
    """Polls the live analyzer on its own thread, so a slow analysis never delays a mid-run fault switch."""

    def __init__(self, run_dir: Path, ranks: int, poll_s: float, began: float) -> None:
        self._analyzer = _analyzer(run_dir)
        self._run_dir, self._ranks = run_dir, ranks
        self._poll_s = poll_s
        self._began = began
        self._plan: Truth | None = None
        self._polls: list[LivePoll] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lab-live-analyzer", daemon=True)
        self._thread.start()

    def update(self, plan: Truth) -> None:
        """The truth so far (a mid-run switch moves the onset); polls begin with the first update."""
        with self._lock:
            self._plan = plan

    def _run(self) -> None:
        try:  # Linux: a thread's niceness is its own
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), ANALYZER_NICE)
        except (OSError, AttributeError):
            pass
        while not self._done.wait(self._poll_s):
            with self._lock:
                plan = self._plan
            if plan is None:
                continue
            # the step reached when the analyzer reads the traces: what it sees is at most that recent
            step = progress(self._run_dir, self._ranks)[1]
            poll = _poll(self._analyzer, plan, time.monotonic() - self._began, step)
            with self._lock:
                self._polls.append(poll)

    def stop(self) -> list[LivePoll]:
        self._done.set()
        self._thread.join(timeout=60)
        with self._lock:
            return list(self._polls)


def _poll(analyzer: Any, plan: Truth, wall_s: float, step: int) -> LivePoll:
    began = time.perf_counter()
    try:
        run = analyzer.run_once()
    except Exception as exc:  # the localizer is judged here, not trusted: an exception is a recorded answer
        return LivePoll(
            wall_s, step, None, None, False, f"{type(exc).__name__}: {exc}", round(time.perf_counter() - began, 4)
        )
    took = round(time.perf_counter() - began, 4)
    if run is None:
        return LivePoll(wall_s, step, None, None, False, "no readable traces yet", took)
    score = score_result(plan.expected(), run.first)  # trace files: one job
    if plan.target is None:
        right = score.verdict_right and not score.false_blame
    else:  # the right verdict and top suspect, once the fault is on (a blame before the onset is false)
        right = bool(score.top1) and step >= plan.onset
    return LivePoll(wall_s, step, score.verdict, score.top, right, None, took)
