"""The hang watcher on a real gloo rank: stuck outside collectives is found and located, an announced pause is not,
and the threshold follows the job's own steps."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from tests.helpers import scrape
from trainhealth import Monitor
from trainhealth._internal import catalog
from trainhealth._internal.exporters.collectives.watch import ranges_text


def _slow_host_code(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.02)


def _steps(monitor: Monitor, count: int, gap_s: float = 0.01) -> None:
    for step in range(count):
        dist.all_reduce(torch.ones(64))
        time.sleep(gap_s)
        monitor.step(loss=1.0, step=step)


def _monitor(tmp_path, **overrides) -> Monitor:
    return Monitor(
        env={},
        comm=True,
        gpu_backend="off",
        prometheus_addr="127.0.0.1",
        prometheus_port=0,
        otel=False,
        trace_dir=str(tmp_path),
        comm_flush_interval=0.1,
        comm_hang_floor=1.0,
        **overrides,
    )


def test_a_rank_stuck_in_host_code_writes_its_stacks_naming_the_function(one_rank, tmp_path):
    with _monitor(tmp_path) as monitor:
        _steps(monitor, 20)
        seen = []
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and not seen:  # the training thread stays away from collectives
            _slow_host_code(0.2)
            seen = monitor.store.series(catalog.COMM_STUCK_DURATION)
        stuck_labels = seen[0][0] if seen else None
        _slow_host_code(0.3)
        dumps = list(monitor.comm.watch.dumps)
        got = scrape(monitor.metrics_url)
        assert got.value("trainhealth_comm_hang_threshold_seconds") == 1.0  # the floor: steps took ~10 ms
        assert got.value("trainhealth_comm_group_info", group="default_pg:0", members="0", size="1") == 1
        _steps(monitor, 3)
        monitor.comm.flush()
        after = monitor.store.series(catalog.COMM_STUCK_DURATION)
    assert stuck_labels is not None, "the watcher never called the rank stuck"
    state, op, group, seq, where = stuck_labels
    assert state == "outside_collectives" and op == group == seq == ""
    assert where.startswith("test_watch.py:_slow_host_code:")
    assert len(dumps) == 1 and dumps[0].parent == tmp_path / "stacks"
    text = dumps[0].read_text()
    assert text.startswith("rank 0: outside_collectives for ") and "<- training thread" in text
    assert "in _slow_host_code" in text and '"op": "all_reduce"' in text  # every stack, and the last records
    assert after == ()  # back in collectives: no longer stuck


def test_an_announced_pause_is_never_stuck(one_rank, tmp_path):
    with _monitor(tmp_path) as monitor:
        _steps(monitor, 20)
        with monitor.pause("checkpoint"):
            paused = monitor.store.value(catalog.COMM_PAUSED, ("checkpoint",))
            _slow_host_code(1.8)
            during = monitor.store.series(catalog.COMM_STUCK_DURATION)
        _steps(monitor, 3)
        monitor.comm.flush()
        after = monitor.store.value(catalog.COMM_PAUSED, ("checkpoint",))
        threshold = monitor.store.value(catalog.COMM_HANG_THRESHOLD)
        dumps = list(monitor.comm.watch.dumps)
    assert paused == 1.0 and after == 0.0
    assert during == () and dumps == []
    assert threshold == 1.0  # the pause's 1.8 s gap stayed out of the history


def test_the_threshold_follows_the_jobs_own_steps(one_rank, tmp_path):
    with _monitor(tmp_path) as monitor:
        _steps(monitor, 6, gap_s=0.5)  # steps of half a second: 3x that, over the 1 s floor
        monitor.comm.flush()
        threshold = monitor.store.value(catalog.COMM_HANG_THRESHOLD)
        monitor.checkpoint_saved(5, 4.0)  # a reported save of 4 s: 1.5x that
        monitor.comm.flush()
        with_save = monitor.store.value(catalog.COMM_HANG_THRESHOLD)
    assert 1.5 <= threshold < 2.5
    assert with_save == pytest.approx(6.0)


def test_every_group_used_is_published_with_its_members(one_rank, tmp_path):
    with _monitor(tmp_path) as monitor:
        side = dist.new_group([0])
        dist.all_reduce(torch.ones(4))
        dist.all_reduce(torch.ones(4), group=side)
        monitor.comm.flush()
        groups = {labels[0]: labels[1:] for labels, _ in monitor.store.series(catalog.COMM_GROUP)}
    assert len(groups) == 2 and groups["default_pg:0"] == ("0", "1")
    assert [members for name, members in groups.items() if name != "default_pg:0"] == [("0", "1")]


def test_member_ranges_are_compact():
    assert ranges_text([]) == ""
    assert ranges_text([5]) == "5"
    assert ranges_text([3, 1, 2, 7, 9, 8]) == "1-3,7-9"


def test_a_collective_that_raises_reaches_the_caller_and_is_counted_and_written_once(one_rank, tmp_path):
    with _monitor(tmp_path) as monitor:
        _steps(monitor, 3)
        for _ in range(2):
            with pytest.raises(RuntimeError, match="invalid root rank"):
                dist.broadcast(torch.ones(4), src=3)  # gloo refuses a root outside the group
        monitor.comm.flush()
        assert monitor.comm._current is None  # no longer in flight
        got = scrape(monitor.metrics_url)
        assert got.value("trainhealth_comm_failures_total", op="broadcast", group="default_pg:0") == 2
        written = list((tmp_path / "stacks").glob("*.failed.txt"))
        assert len(written) == 1  # the first failure; the second is its consequence
        first = written[0].read_text().splitlines()[0]
        assert first.startswith("rank 0: broadcast #3 of default_pg:0 failed at ") and "invalid root rank" in first
        _steps(monitor, 2)  # the job goes on where it can
        monitor.comm.flush()
        assert (
            scrape(monitor.metrics_url).value("trainhealth_comm_failures_total", op="broadcast", group="default_pg:0")
            == 2
        )
