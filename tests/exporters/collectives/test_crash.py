"""The trace survives the job: a rank killed with SIGKILL keeps every record appended before it died."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import trainhealth.comm
from tests.distributed import init_rank, start_ranks
from trainhealth.traces import read_trace


def _all_reduce_until_killed(rank: int, world: int, port: int, out: str) -> None:
    init_rank(rank, world, port)
    trainhealth.comm.install(
        trace_dir=out, settings=trainhealth.Settings.resolve(env={}, comm_flush_interval=0.05, trace_write_interval=0.2)
    )
    Path(out, f"pid-{rank}").write_text(str(os.getpid()))
    tensor = torch.ones(1024)
    step = 0
    while True:  # never returns: the test kills the process, as the OOM killer or a node failure would
        trainhealth.comm.installed().step = step
        dist.all_reduce(tensor)
        step += 1
        time.sleep(0.002)


@pytest.mark.slow
def test_records_appended_before_sigkill_are_read_back(tmp_path):
    context = start_ranks(_all_reduce_until_killed, 2, str(tmp_path))
    try:
        deadline = time.monotonic() + 90
        steps: list[int] = []
        while time.monotonic() < deadline and len(steps) < 100:  # wait for a few appends from each rank
            time.sleep(0.3)
            if all(any(tmp_path.glob(f"rank-{r}.*.jsonl.gz")) for r in (0, 1)):
                records = read_trace([tmp_path]).records
                steps = sorted(set(records[records["rank"] == 0]["step"]) & set(records[records["rank"] == 1]["step"]))
        assert len(steps) >= 100, "the ranks never appended 100 steps"
    finally:
        for process in context.processes:
            if process.is_alive():
                os.kill(process.pid, signal.SIGKILL)
        for process in context.processes:
            process.join(timeout=30)
    records = read_trace([tmp_path]).records  # after the crash: every whole append, nothing cut in half
    for rank in (0, 1):
        mine = records[records["rank"] == rank].sort_values("seq")
        assert list(mine["seq"]) == list(range(len(mine)))  # no gaps: appends hold consecutive records
        assert len(mine) >= len(steps)
        assert set(mine["op"]) == {"all_reduce"}


def _steps_then_wait(rank: int, world: int, port: int, out: str, mode: str) -> None:
    """Rank 1 stops answering after 50 all-reduces; rank 0, its peer, is then blocked inside the 51st (``mode``
    ``blocked``) or rank 0 sleeps in Python after 50 (``python``); a user handler is installed first (``user``)."""
    import signal as signals

    init_rank(rank, world, port, timeout_s=300)
    if mode == "user":
        signals.signal(signals.SIGTERM, lambda *_: Path(out, f"user-handler-{rank}").write_text("ran"))
    trainhealth.comm.install(trace_dir=out, settings=trainhealth.Settings.resolve(env={}, trace_write_interval=0))
    tensor = torch.ones(64)
    for step in range(50):
        trainhealth.comm.installed().step = step
        dist.all_reduce(tensor)
    Path(out, f"ready-{rank}").write_text(str(os.getpid()))
    if mode == "blocked" and rank == 0:
        dist.all_reduce(tensor)  # rank 1 never joins: blocked in gloo, not in Python
    for _ in range(600):  # sleeping in Python: the handler runs at once
        time.sleep(0.1)


def _stop_rank0(tmp_path: Path, mode: str) -> int | None:
    context = start_ranks(_steps_then_wait, 2, str(tmp_path), mode)
    try:
        deadline = time.monotonic() + 90
        while not all((tmp_path / f"ready-{r}").exists() for r in (0, 1)) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # rank 0 is now inside its 51st all-reduce (blocked) or asleep
        rank0 = context.processes[0]
        os.kill(rank0.pid, signal.SIGTERM)
        if mode == "user":  # the user's handler runs and the rank goes on
            deadline = time.monotonic() + 20
            while not (tmp_path / "user-handler-0").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.5)
        else:
            rank0.join(timeout=20)
        return rank0.exitcode
    finally:
        for process in context.processes:
            if process.is_alive():
                os.kill(process.pid, signal.SIGKILL)
            process.join(timeout=30)


@pytest.mark.slow
def test_sigterm_saves_the_trace_and_still_ends_the_rank(tmp_path):
    assert _stop_rank0(tmp_path, "python") == -signal.SIGTERM  # ended by the signal, as without trainhealth
    records = read_trace([tmp_path]).records
    assert sorted(records[records["rank"] == 0]["seq"]) == list(range(50))  # nothing written before the signal


def test_sigterm_while_blocked_in_a_collective_saves_the_trace_and_ends_the_rank(tmp_path):
    began = time.monotonic()
    assert _stop_rank0(tmp_path, "blocked") == -signal.SIGTERM
    assert time.monotonic() - began < 60  # not the 300 s gloo timeout
    records = read_trace([tmp_path]).records
    assert sorted(records[records["rank"] == 0]["seq"]) == list(range(50))


def test_sigterm_runs_the_users_handler_after_saving(tmp_path):
    assert _stop_rank0(tmp_path, "user") is None  # the user's handler did not end the process: still running
    assert (tmp_path / "user-handler-0").read_text() == "ran"
    records = read_trace([tmp_path]).records
    assert sorted(records[records["rank"] == 0]["seq"]) == list(range(50))
