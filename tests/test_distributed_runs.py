"""tests/distributed.py, the helper every multi-process test runs its ranks with: a limit from the measured step
time, and a report of what each rank was doing when a run outlives it."""

from __future__ import annotations

import inspect
import time

import pytest
import torch

import tests.distributed as ranks
from tests.distributed import init_rank, join, run_ranks, start_ranks


def _steps(rank: int, world: int, port: int, stall_at: int | None) -> None:
    import torch.distributed as dist

    init_rank(rank, world, port, timeout_s=600)  # gloo's own timeout far beyond the helper's
    tensor = torch.ones(8)
    for step in range(10):
        time.sleep(0.05)
        while rank == 1 and step == stall_at:  # rank 1 stops in host code; rank 0 waits in the all-reduce
            time.sleep(0.1)
        dist.all_reduce(tensor)
    dist.destroy_process_group()


def test_a_run_that_keeps_stepping_finishes():
    run_ranks(_steps, 2, None, steps=10)


def test_a_stalled_run_fails_after_its_measured_steps_saying_what_each_rank_was_doing(monkeypatch):
    monkeypatch.setattr(ranks, "SETTLE_S", 2.0)
    monkeypatch.setattr(ranks, "FACTOR", 3.0)
    context = start_ranks(_steps, 2, 4)
    with pytest.raises(TimeoutError) as raised:
        join(context, steps=10)
    report = str(raised.value)
    assert "10 steps x" in report and "s measured x 3 after the first step" in report, report
    # rank 0 waits in its fifth all-reduce for rank 1, which stopped after four
    assert "rank 0: step 4, in all_reduce, 5 collectives issued on the default group," in report, report
    assert "rank 1: step 4, in no collective" in report, report
    assert "4 collectives issued on the default group, at tests/test_distributed_runs.py" in report, report
    lines, first = inspect.getsourcelines(_steps)
    stalled_on = first + next(i for i, line in enumerate(lines) if "time.sleep(0.1)" in line)
    assert f"test_distributed_runs.py:{stalled_on} in _steps" in report, report
    assert not any(process.is_alive() for process in context.processes)


def test_a_run_needs_a_step_count_or_a_limit():
    with pytest.raises(ValueError, match="steps"):
        join(None)
