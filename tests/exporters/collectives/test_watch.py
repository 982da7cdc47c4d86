"""The hang watcher on a real gloo rank: stuck outside collectives is found and located, an announced pause is not,
and the threshold follows the job's own steps."""

from __future__ import annotations

import time
from collections import deque

import pytest
import torch
import torch.distributed as dist

from tests.helpers import scrape
from trainhealth import Monitor
from trainhealth._internal import catalog
from trainhealth._internal.exporters.collectives.watch import MAX_PAUSE_REASONS, HangWatch
from trainhealth._internal.store import MetricStore


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
        monitor.comm.writer.drain(10.0)  # the stacks are written off the flush thread
        dumps = list(monitor.comm.watch.dumps)
        got = scrape(monitor.metrics_url)
        assert got.value("trainhealth_comm_hang_threshold_seconds") == 1.0  # the floor: steps took ~10 ms
        assert got.value("trainhealth_comm_group_member_info", group="default_pg:0", group_rank="0", size="1") == 1
        (member,) = got.labels_of("trainhealth_comm_group_member_info")
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
    assert sorted(member) == ["group", "group_rank", "host", "job", "rank", "size"]  # no member list


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


def test_every_group_used_is_published_with_this_ranks_place_in_it(one_rank, tmp_path):
    with _monitor(tmp_path) as monitor:
        side = dist.new_group([0])
        dist.all_reduce(torch.ones(4))
        dist.all_reduce(torch.ones(4), group=side)
        monitor.comm.flush()
        groups = {labels[0]: labels[1:] for labels, _ in monitor.store.series(catalog.COMM_GROUP_MEMBER)}
    assert len(groups) == 2 and groups["default_pg:0"] == ("0", "1")
    assert [place for name, place in groups.items() if name != "default_pg:0"] == [("0", "1")]


class _Rank6:
    """What the watcher reads of a collective logger, on rank 6 of 16 ranks with tensor parallel 4: its groups'
    members as torch names them (a group torch could not name has none)."""

    store = None
    training_thread = None
    _current = None
    failure = None
    failures = 0
    rank = 6

    def __init__(self, members: dict[str, tuple[int, ...]]) -> None:
        self.members = members
        self._async: dict = {}
        self._ring: deque = deque()

    def trace_rows(self, records) -> list:
        return []


def test_each_group_is_published_as_this_ranks_group_rank_and_the_size_then_forgotten():
    logger = _Rank6({"default_pg:0": tuple(range(16)), "mesh_tp:1": (4, 5, 6, 7), "mesh_dp:6": (2, 6, 10, 14)})
    watch, store = HangWatch(logger), MetricStore()
    watch.check(store, None)
    assert sorted(labels for labels, _ in store.series(catalog.COMM_GROUP_MEMBER)) == [
        ("default_pg:0", "6", "16"),
        ("mesh_dp:6", "1", "4"),
        ("mesh_tp:1", "2", "4"),
    ]
    logger.members = {**logger.members, "side:9": ()}  # torch could not say who is in it: no place to publish
    watch.check(store, None)
    del logger.members["mesh_tp:1"]  # torch destroyed it: the logger let go of it, and tells the watcher
    watch.forget(store, ["mesh_tp:1"])
    watch.check(store, None)
    assert sorted(labels for labels, _ in store.series(catalog.COMM_GROUP_MEMBER)) == [
        ("default_pg:0", "6", "16"),
        ("mesh_dp:6", "1", "4"),
    ]


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
        assert monitor.comm.writer.drain(10.0)  # the stacks are written off the flush thread
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


def _stuck_labels(monitor: Monitor, seconds: float) -> tuple | None:
    """The first stuck series the watcher exports within ``seconds`` while the caller stays in host code."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen = monitor.store.series(catalog.COMM_STUCK_DURATION)
        if seen:
            return seen[0][0]
        _slow_host_code(0.1)
    return None


def test_start_up_holds_through_set_up_barriers_until_the_first_step(one_rank, tmp_path):
    with _monitor(tmp_path) as monitor:
        for _ in range(3):  # main_process_first, data preparation: barriers before any step
            dist.barrier()
            time.sleep(0.05)
        dist.all_reduce(torch.ones(4))
        monitor.comm.flush()
        before_first_step = monitor.store.value(catalog.COMM_HANG_THRESHOLD)
        stuck_before = _stuck_labels(monitor, 1.5)  # a slow first step: 1.5 s over the 1 s floor, no step yet
        _steps(monitor, 3)
        monitor.comm.flush()
        after_first_step = monitor.store.value(catalog.COMM_HANG_THRESHOLD)
    assert before_first_step == 60.0 and stuck_before is None
    assert after_first_step >= 3 * 1.5  # then the job's own: 3x its longest gap, the slow first step


def test_a_pause_past_its_bound_is_stuck_in_the_pause_and_stops_holding_the_rules(one_rank, tmp_path):
    with _monitor(tmp_path, comm_pause_limit=1.0) as monitor:
        _steps(monitor, 20)
        with monitor.pause("checkpoint"):
            stuck = _stuck_labels(monitor, 3.0)
            paused_past_bound = monitor.store.value(catalog.COMM_PAUSED, ("checkpoint",))
        _steps(monitor, 3)
        monitor.comm.flush()
        cleared = monitor.store.series(catalog.COMM_STUCK_DURATION)
        with monitor.pause("checkpoint"):  # the second pause's bound: 3x the first one (about 1 s)
            learnt = monitor.comm.watch.pause_bound("checkpoint")
            paused_within_bound = monitor.store.value(catalog.COMM_PAUSED, ("checkpoint",))
        monitor.comm.writer.drain(5.0)
        dumps = list(monitor.comm.watch.dumps)
    assert stuck is not None and stuck[:2] == ("in_pause", "checkpoint")
    assert paused_past_bound == 0.0 and paused_within_bound == 1.0
    assert cleared == ()
    assert 3.0 <= learnt < 6.0
    assert len(dumps) == 1 and dumps[0].read_text().startswith("rank 0: in a pause (checkpoint) since ")


def test_time_outside_collectives_counts_from_the_end_of_a_pause(one_rank, tmp_path):
    with _monitor(tmp_path) as monitor:
        _steps(monitor, 20)
        with monitor.pause("evaluation"):
            _slow_host_code(1.5)  # longer than the 1 s floor
        stuck_at_once = _stuck_labels(monitor, 0.5)  # host code right after the pause: 0.5 s, under the floor
    assert stuck_at_once is None


def test_a_stalled_disk_delays_the_stacks_never_the_stuck_series(one_rank, tmp_path, monkeypatch):
    import os

    real_fsync = os.fsync
    stalled = []

    def stalling_fsync(fd):  # a shared filesystem that hangs for 4 s on every sync
        stalled.append(fd)
        time.sleep(4.0)
        real_fsync(fd)

    with _monitor(tmp_path) as monitor:
        _steps(monitor, 20)
        monkeypatch.setattr(os, "fsync", stalling_fsync)
        seconds = []
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            _slow_host_code(0.3)
            value = monitor.store.series(catalog.COMM_STUCK_DURATION)
            if value:
                seconds.append(value[0][1])
        monkeypatch.setattr(os, "fsync", real_fsync)
        _steps(monitor, 2)
        monitor.comm.writer.drain(15.0)
        dumps = list(monitor.comm.watch.dumps)
    assert stalled, "nothing synced to disk: the stall was never exercised"
    assert len(seconds) >= 5 and seconds[-1] - seconds[0] >= 1.5  # the exported time kept growing
    assert len(dumps) == 1  # and the evidence arrived once the disk did


def test_an_error_in_the_flush_thread_is_counted_and_the_watcher_goes_on(one_rank, tmp_path):
    with _monitor(tmp_path) as monitor:
        _steps(monitor, 5)
        monitor.comm.add_marker("step", 5, "not a time", None)  # a record the flush cannot take in
        time.sleep(0.5)
        first = monitor.store.value(catalog.COMM_WATCH_TIMESTAMP)
        time.sleep(0.5)
        later = monitor.store.value(catalog.COMM_WATCH_TIMESTAMP)
        errors = monitor.store.value(catalog.EXPORTER_ERRORS, ("comm_flush",))
    assert errors is not None and errors >= 1
    assert later > first  # the watcher still looks


def test_groups_made_and_destroyed_every_step_get_their_own_names_and_numbers(one_rank, tmp_path):
    with _monitor(tmp_path) as monitor:
        names = []
        for _ in range(50):
            group = dist.new_group([0])
            dist.all_reduce(torch.ones(4), group=group)
            names.append(monitor.comm.group_id(group))
            dist.destroy_process_group(group)
            del group
            monitor.comm.flush()
        records = monitor.comm.records()
        published = monitor.store.series(catalog.COMM_GROUP_MEMBER)
    side = records[records["group"].isin(names)]
    assert len(set(names)) == 50  # never a dead group's name
    assert (side["seq"] == 0).all() and len(side) == 50  # each starts its own numbering
    assert len(published) <= 2  # destroyed groups leave the exported series


def test_pause_reasons_are_bounded_the_oldest_closed_one_forgotten_and_counted():
    """A reason made per step (``f"save {step}"``) grew the watcher's memory and its series without end."""
    logger = _Rank6({})
    logger.store = MetricStore()
    watch = HangWatch(logger)
    with watch.pause("checkpoint"):  # open through all the others: never forgotten
        for step in range(3 * MAX_PAUSE_REASONS):
            with watch.pause(f"save {step}"):
                pass
        reasons = {labels[0] for labels, _ in logger.store.series(catalog.COMM_PAUSED)}
        assert logger.store.value(catalog.COMM_PAUSED, ("checkpoint",)) == 1.0
    assert len(reasons) == MAX_PAUSE_REASONS and "checkpoint" in reasons
    assert f"save {3 * MAX_PAUSE_REASONS - 1}" in reasons and "save 0" not in reasons
    assert len(watch._known_reasons) <= MAX_PAUSE_REASONS and len(watch._pause_longest) <= MAX_PAUSE_REASONS
    forgotten = 3 * MAX_PAUSE_REASONS + 1 - MAX_PAUSE_REASONS
    assert logger.store.value(catalog.EXPORTER_ERRORS, ("comm_pause_reasons",)) == forgotten
    # a reason still remembered keeps its learnt bound; a forgotten one is back to the limit, never stricter
    assert watch.pause_bound(f"save {3 * MAX_PAUSE_REASONS - 1}") < watch.pause_limit_s
    assert watch.pause_bound("save 0") == watch.pause_limit_s
