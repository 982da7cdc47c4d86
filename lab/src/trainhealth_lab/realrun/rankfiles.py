"""What a rank writes beside its trace for the launcher and the scoring: progress, step timings, topology.

``progress/rank-<R>.json`` (the step just finished, read by the launcher while the job runs),
``progress/steps-rank-<R>.json`` (every step's index, start, wall seconds, compute seconds and CPU
seconds, at the end) and ``topology.json`` (rank 0 merges every rank's groups and host).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from trainhealth._internal import _files
from trainhealth_lab.realrun.kernels import Clock
from trainhealth_lab.realrun.spec import CaseSpec, Parallelism

__all__ = ["StepLog", "write_json", "write_topology"]


def write_json(path: Path, data: Any) -> None:
    """``data`` as trainhealth writes JSON (replacing ``path`` atomically: the launcher reads these while they
    change), its directory made first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _files.write_json(path, data)


def write_topology(run_dir: Path, spec: CaseSpec, rank: int, fragment: dict[str, Any], timeout_s: float = 60.0) -> None:
    """Each rank writes its groups and host; rank 0 merges them into ``topology.json`` (no collective needed)."""
    parts = run_dir / "progress"
    write_json(parts / f"topology-rank-{rank}.json", fragment)
    if rank != 0:
        return
    deadline = time.monotonic() + timeout_s
    found: dict[int, dict[str, Any]] = {}
    while len(found) < spec.ranks and time.monotonic() < deadline:
        for other in range(spec.ranks):
            path = parts / f"topology-rank-{other}.json"
            if other not in found and path.is_file():
                found[other] = json.loads(path.read_text(encoding="utf-8"))
        if len(found) < spec.ranks:
            time.sleep(0.05)
    groups: dict[str, list[int]] = {}
    hosts: dict[str, str] = {}
    for other, part in sorted(found.items()):
        groups.update(part["groups"])
        hosts[str(other)] = part["host"]
    parallelism = {"dp": spec.replicas}
    if spec.layout is Parallelism.DP_PP:
        parallelism["pp"] = 2
    elif spec.layout is Parallelism.DP_TP:
        parallelism["tp"] = 2
    write_json(
        run_dir / "topology.json", {"groups": dict(sorted(groups.items())), "hosts": hosts, "parallelism": parallelism}
    )


class StepLog:
    """One rank's step timings: :meth:`begin` starts a step (and its paced kernels), :meth:`end` records it."""

    def __init__(self, run_dir: Path, rank: int, clock: Clock) -> None:
        self._progress = run_dir / "progress" / f"rank-{rank}.json"
        self._final = run_dir / "progress" / f"steps-rank-{rank}.json"
        self._clock = clock
        self._rows: list[list[float]] = []
        self._began = self._cpu = 0.0

    def begin(self, factor: float) -> None:
        self._began, self._cpu = time.time(), time.process_time()
        self._clock.begin_step(factor)

    def end(self, step: int) -> None:
        self._rows.append(
            [step, self._began, time.time() - self._began, self._clock.busy_s(), time.process_time() - self._cpu]
        )
        write_json(self._progress, {"step": step, "time": time.time()})

    def close(self) -> None:
        write_json(self._final, self._rows)
