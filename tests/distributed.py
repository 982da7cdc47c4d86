"""Real multi-process torch.distributed runs on gloo, for tests: one process per rank on 127.0.0.1.

A run's time limit comes from what it does, not from a number tuned on an idle machine: each rank
writes a heartbeat (its ``step`` and the collective it is in, read from its own stack) five times a
second, the parent measures the step time from them, and a run of ``steps`` steps may take
``STARTUP_S`` to reach its first step, then ``steps`` x the measured step time x ``FACTOR`` and
``SETTLE_S`` to finish.
When a run does run out of time, the error says what each rank was doing.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from trainhealth._internal._ports import free_port
from trainhealth._internal.exporters.collectives.wrappers import COMMUNICATION_FUNCTIONS

#: Seconds a rank may take to start (spawn, import torch, rendezvous) before its first step, on a busy machine.
STARTUP_S = 120.0
#: How many times the measured step time each step may take.
FACTOR = 10.0
#: Seconds after the last step for what a run does once it has stepped (closing a Monitor, writing results).
SETTLE_S = 60.0
_BEAT_S = 0.2
_COLLECTIVES = os.path.join("torch", "distributed", "distributed_c10d.py")
_OURS = (os.path.join(os.sep, "tests", ""), os.path.join(os.sep, "lab", ""), os.path.join(os.sep, "benchmarks", ""))


def init_rank(rank: int, world: int, port: int, timeout_s: float = 60.0, backend: str = "gloo") -> None:
    """Initialise the default group of ``rank``; a ``backend`` other than gloo must be registered in this process."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))


def _where(frame: Any) -> dict[str, Any]:
    """The rank's ``step`` (the innermost test frame that has one), the collective it is in (the outermost
    frame of torch.distributed's collectives) and the innermost test frame."""
    step, collective, at = None, None, None
    while frame is not None:
        code = frame.f_code
        if code.co_filename.endswith(_COLLECTIVES) and code.co_name in COMMUNICATION_FUNCTIONS:
            collective = code.co_name
        elif any(part in code.co_filename for part in _OURS):
            if at is None:
                at = f"{os.path.relpath(code.co_filename)}:{frame.f_lineno} in {code.co_name}"
            if step is None:
                value = frame.f_locals.get("step")
                step = value if isinstance(value, int) else None
        frame = frame.f_back
    return {"step": step, "collective": collective, "at": at}


def _issued() -> int | None:
    """How many collectives this rank has issued on the default group (torch's sequence number), if it has one."""
    try:
        if not dist.is_initialized():
            return None
        return int(dist.distributed_c10d._get_default_group()._get_sequence_number_for_group())
    except Exception:  # a group being torn down: no count this beat
        return None


def _beat(path: Path, thread_id: int) -> None:
    """Write the main thread's whereabouts to ``path`` every ``_BEAT_S``, until the process ends, with the times its
    ``step`` changed (the last 64)."""
    last_collective, scratch, changes = None, path.with_suffix(".tmp"), deque(maxlen=64)
    while True:
        frame = sys._current_frames().get(thread_id)
        if frame is None:
            return
        beat = _where(frame) | {"time": time.time()}
        del frame
        if beat["collective"]:
            last_collective = (beat["collective"], beat["time"])
        if beat["step"] is not None and (not changes or changes[-1][1] != beat["step"]):
            changes.append((beat["time"], beat["step"]))
        beat["last_collective"], beat["changes"], beat["issued"] = last_collective, list(changes), _issued()
        scratch.write_text(json.dumps(beat))
        os.replace(scratch, path)
        time.sleep(_BEAT_S)


def _entry(rank: int, function: Callable, world: int, port: int, args: tuple, beats: str) -> None:
    beat = threading.Thread(
        target=_beat, args=(Path(beats, f"rank-{rank}.json"), threading.get_ident()), daemon=True, name="heartbeat"
    )
    beat.start()
    function(rank, world, port, *args)


def start_ranks(function: Callable, world: int, *args, port: int | None = None):
    """Start ``function(rank, world, port, *args)`` in ``world`` processes; returns the process context."""
    port = port or free_port()
    beats = tempfile.mkdtemp(prefix="ranks-")
    context = mp.start_processes(
        _entry, args=(function, world, port, args, beats), nprocs=world, join=False, start_method="spawn"
    )
    context.heartbeats = Path(beats)
    return context


@dataclass
class _Pace:
    """The measured time per step, from the times each rank's ``step`` changed."""

    began: float = field(default_factory=time.time)
    per_step: dict[int, list[float]] = field(default_factory=dict)
    first_step: float | None = None

    def update(self, beats: dict[int, dict]) -> None:
        for rank, beat in beats.items():
            changes = beat.get("changes") or []
            if changes:
                self.first_step = min(changes[0][0], self.first_step or changes[0][0])
            self.per_step[rank] = [
                (t1 - t0) / (s1 - s0) for (t0, s0), (t1, s1) in zip(changes, changes[1:]) if s1 > s0 and t1 > t0
            ]

    def deadline(self, steps: int) -> tuple[float, str]:
        """When a run of ``steps`` steps has had its time, and how that was reckoned."""
        measured = [value for values in self.per_step.values() for value in values]
        if self.first_step is None or not measured:
            return self.began + STARTUP_S, f"{STARTUP_S:.0f} s to reach a measured step"
        step_s = statistics.median(measured)
        return (
            self.first_step + steps * step_s * FACTOR + SETTLE_S,
            f"{steps} steps x {step_s:.3f} s measured x {FACTOR:.0f} after the first step, then {SETTLE_S:.0f} s",
        )


def _read_beats(directory: Path | None) -> dict[int, dict]:
    beats: dict[int, dict] = {}
    for path in directory.glob("rank-*.json") if directory is not None else ():
        try:
            beats[int(path.stem.split("-")[1])] = json.loads(path.read_text())
        except (OSError, ValueError):  # being replaced: the next poll reads it
            continue
    return beats


def _report(context, beats: dict[int, dict]) -> str:
    lines = []
    for rank, process in enumerate(context.processes):
        if not process.is_alive():
            lines.append(f"  rank {rank}: exited {process.exitcode}")
            continue
        beat = beats.get(rank)
        if beat is None:
            lines.append(f"  rank {rank}: no heartbeat yet (still starting)")
            continue
        now = time.time()
        doing = f"in {beat['collective']}" if beat["collective"] else "in no collective"
        last = beat.get("last_collective")
        if not beat["collective"] and last:
            doing += f" (last: {last[0]}, {now - last[1]:.1f} s before)"
        step = "no step" if beat["step"] is None else f"step {beat['step']}"
        if beat.get("issued") is not None:
            doing += f", {beat['issued']} collectives issued on the default group"
        lines.append(f"  rank {rank}: {step}, {doing}, at {beat['at']}; heartbeat {now - beat['time']:.1f} s old")
    return "\n".join(lines)


def join(context, timeout_s: float | None = None, *, steps: int | None = None) -> None:
    """Wait for every rank; fail (killing the rest) when one fails or the time runs out.

    With ``steps`` (the steps the slowest rank runs, in all), the time is ``STARTUP_S`` to the first step and
    then ``steps`` x the measured step time x ``FACTOR``; without, ``timeout_s`` (a run with no step loop)."""
    if steps is None and timeout_s is None:
        raise ValueError("join needs steps (a run's step count) or timeout_s (a run with no steps)")
    pace, directory = _Pace(), getattr(context, "heartbeats", None)
    try:
        _wait(context, pace, directory, timeout_s, steps)
    finally:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


def _wait(context, pace: _Pace, directory: Path | None, timeout_s: float | None, steps: int | None) -> None:
    while not context.join(timeout=0.5):
        if steps is not None:
            pace.update(_read_beats(directory))
            deadline, reckoning = pace.deadline(steps)
        else:
            deadline, reckoning = pace.began + (timeout_s or 0.0), f"{timeout_s:.0f} s for a run with no steps"
        if time.time() > deadline:
            report = _report(context, _read_beats(directory))
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                    process.join(10)
            raise TimeoutError(
                f"ranks still running after {time.time() - pace.began:.0f} s (limit: {reckoning}):\n{report}"
            )


def run_ranks(function: Callable, world: int, *args, steps: int | None = None, timeout_s: float | None = None) -> None:
    """Run ``function(rank, world, port, *args)`` on ``world`` ranks and wait for them (see :func:`join`)."""
    join(start_ranks(function, world, *args), timeout_s, steps=steps)
