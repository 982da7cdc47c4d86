"""The trace survives the job: a rank killed with SIGKILL keeps every record appended before it died."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

import trainhealth.comm
from tests.distributed import init_rank, start_ranks
from trainhealth.traces import read_trace


def _all_reduce_until_killed(rank: int, world: int, port: int, out: str) -> None:
    init_rank(rank, world, port)
    trainhealth.comm.install(trace_dir=out, settings=trainhealth.Settings.resolve(
        env={}, comm_flush_interval=0.05, trace_write_interval=0.2))
    Path(out, f"pid-{rank}").write_text(str(os.getpid()))
    tensor = torch.ones(1024)
    step = 0
    while True:  # never returns: the test kills the process, as the OOM killer or a node failure would
        trainhealth.comm.installed().step = step
        dist.all_reduce(tensor)
        step += 1
        time.sleep(0.002)


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
