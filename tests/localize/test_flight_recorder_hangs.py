"""A real gloo job that hangs, dumped by Flight Recorder from each rank's hang watcher: ``trainhealth localize``
names the rank that never entered the collective, as torch's own analyzer (``fr_trace``) does on the same dumps.
(torch 2.13's gloo dumps leave the groups' members out, and fr_trace fails on them with a KeyError; the watcher
fills them in, which is what lets either analyzer name a rank that left no dump.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.distributed import init_rank, join, start_ranks
from trainhealth import Monitor

ABSENT = 2


def _hang_with_flight_recorder(rank: int, world: int, port: int, out: str) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    init_rank(rank, world, port, timeout_s=120)
    monitor = Monitor(
        comm=True,
        gpu_backend="off",
        prometheus=False,
        otel=False,
        trace_dir=out,
        comm_flush_interval=0.2,
        comm_hang_floor=1.0,
    )
    t = torch.ones(16)
    for step in range(5):
        dist.all_reduce(t)
        time.sleep(0.02)
        monitor.step(loss=1.0, step=step)  # past start-up: the watcher's threshold is the 1 s floor from here
    if rank == ABSENT:  # stays away from the sixth all-reduce until the test has read the dumps
        deadline = time.monotonic() + 90
        while not Path(out, "release").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    dist.all_reduce(t)
    monitor.close()
    dist.destroy_process_group()


def _torch_analyzer(dumps: Path) -> tuple[int, set[int]]:
    """torch's fr_trace on the dumps: the sequence number and missing ranks it reports."""
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(dumps), "--prefix", "rank_"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    said = done.stdout + done.stderr  # its findings go to its log (stderr)
    assert done.returncode == 0, said
    seq = re.search(r"Not all ranks joining collective, sequence number: (\d+)", said)
    missing = re.search(r"missing ranks: \{([\d, ]*)\}", said)
    assert seq and missing, said
    return int(seq.group(1)), {int(r) for r in missing.group(1).split(",") if r.strip()}


@pytest.mark.slow
def test_flight_recorder_dumps_of_a_hang_name_the_absent_rank_as_torch_does(tmp_path):
    context = start_ranks(_hang_with_flight_recorder, 3, str(tmp_path))
    dumps = tmp_path / "flight-recorder"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(list(dumps.glob("rank_*"))) < 3:
            time.sleep(0.25)
        assert sorted(p.name for p in dumps.glob("rank_*")) == ["rank_0", "rank_1", "rank_2"]
        time.sleep(0.5)
        done = subprocess.run(
            [sys.executable, "-m", "trainhealth._internal.cli", "localize", str(dumps), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        ours = json.loads(done.stdout)
        torch_seq, torch_missing = _torch_analyzer(dumps)
    finally:
        (tmp_path / "release").write_text("go")
        join(context, timeout_s=120)
    assert ours["verdict"] == "hang" and ours["suspects"][0]["ranks"] == [ABSENT]
    hang = ours["hangs"][0]
    assert (hang["seq"], set(hang["lagging_ranks"])) == (torch_seq, torch_missing) == (6, {ABSENT})
    assert hang["waiting_ranks"] == [0, 1] and hang["op"] == "all_reduce"


def _leave_early(rank: int, world: int, port: int, out: str) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    init_rank(rank, world, port, timeout_s=120)
    Monitor(comm=True, gpu_backend="off", prometheus=False, otel=False, trace_dir=out, comm_flush_interval=0.2)
    t = torch.ones(16)
    for _ in range(5):
        dist.all_reduce(t)
    if rank == ABSENT:
        return  # a plain exit: its connections close; the Monitor is closed at exit
    time.sleep(0.5)
    dist.all_reduce(t)  # raises in the peers ("Connection closed by peer"), which end with it


@pytest.mark.slow
def test_a_rank_that_exits_plainly_is_named_from_the_dumps_its_peers_wrote_as_they_failed(tmp_path):
    context = start_ranks(_leave_early, 3, str(tmp_path))
    for process in context.processes:  # the peers fail: nothing to join cleanly
        process.join(timeout=120)
    codes = [process.exitcode for process in context.processes]
    assert codes[ABSENT] == 0 and codes[0] != 0 and codes[1] != 0, codes
    dumps = tmp_path / "flight-recorder"
    assert sorted(p.name for p in dumps.glob("rank_*")) == ["rank_0", "rank_1"]  # written at exit, after the error
    failed = sorted(p.name.split(".")[0] for p in (tmp_path / "stacks").glob("*.failed.txt"))
    assert failed == ["rank-0", "rank-1"]
    done = subprocess.run(
        [sys.executable, "-m", "trainhealth._internal.cli", "localize", str(dumps), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    ours = json.loads(done.stdout)
    assert ours["verdict"] == "hang" and ours["suspects"][0]["ranks"] == [ABSENT]
    assert "missing" in ours["suspects"][0]["evidence"]
    errors = [reason for reason in ours["reasons"] if " failed at " in reason]
    assert len(errors) == 2 and all("all_reduce #5 of" in e and "RuntimeError" in e for e in errors), errors
