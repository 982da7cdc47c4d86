"""Step markers, forward and optimizer rows, and each rank's compute / wait split, in real 2-rank gloo DDP runs."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.distributed as dist
from prometheus_client import CollectorRegistry

import trainhealth.comm
from tests.distributed import init_rank, join, run_ranks, start_ranks
from trainhealth import Monitor
from trainhealth._internal.exporters.collectives.logger import CollectiveLogger
from trainhealth._internal.sinks.prometheus import StoreCollector
from trainhealth._internal.traces.ops import COMMUNICATION_OPS
from trainhealth.traces import read_trace

STEPS = 8


class _Net(torch.nn.Module):
    """A small MLP whose forward can take ``delay_s`` longer: a slow GPU's kernels."""

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.body(x)


def _train(monitor: Monitor, ddp, optimizer, steps: int) -> float:
    """``steps`` DDP steps reported to ``monitor``; the wall time from the first forward to the last report."""
    torch.manual_seed(1)
    began = time.perf_counter()
    for step in range(steps):
        loss = ddp(torch.randn(16, 32)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        monitor.step(loss=loss)
    return time.perf_counter() - began


# --- work done in each rank (module level: spawned processes import it) ---------------------
def _markers_and_live_trace(rank: int, world: int, port: int, out: str) -> None:
    init_rank(rank, world, port)
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(_Net(), bucket_cap_mb=0.01)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    monitor = Monitor(
        ddp,
        optimizer,
        env={},
        comm=True,
        gpu_backend="off",
        prometheus=False,
        otel=False,
        trace_dir=out,
        comm_flush_interval=0.1,
        trace_write_interval=0.2,
    )
    trainhealth.comm.instrument_ddp(ddp)
    wall = _train(monitor, ddp, optimizer, STEPS)
    Path(out, f"wall-{rank}.json").write_text(json.dumps(wall))
    release, deadline = Path(out, "release"), time.monotonic() + 60
    while not release.exists() and time.monotonic() < deadline:  # still running: the test reads the live trace
        time.sleep(0.05)
    dist.barrier()
    monitor.close()
    dist.destroy_process_group()


def _straggler(rank: int, world: int, port: int, out: str, slow_rank: int, delay_s: float) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):  # as mp.spawn starts it: torch.distributed knows the rank
        os.environ.pop(name, None)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(_Net(delay_s if rank == slow_rank else 0.0))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    monitor = Monitor(
        ddp,
        optimizer,
        env={},
        comm=True,
        gpu_backend="off",
        prometheus=False,
        otel=False,
        comm_flush_interval=0.1,
        trace_write_interval=0,
    )
    trainhealth.comm.instrument_ddp(ddp)
    _train(monitor, ddp, optimizer, 12)
    monitor.comm.flush()
    monitor.flush()
    registry = CollectorRegistry()
    registry.register(StoreCollector(monitor.store, monitor.identity))
    labels = monitor.identity.labels
    values = {
        name: registry.get_sample_value(name, labels)
        for name in (
            "trainhealth_train_step_wait_seconds_total",
            "trainhealth_train_step_compute_seconds_total",
            "trainhealth_train_last_step_wait_seconds",
            "trainhealth_train_last_step_compute_seconds",
        )
    }
    values["rank_label"] = labels["rank"]
    values["logger_rank"] = monitor.comm.rank
    Path(out, f"metrics-{rank}.json").write_text(json.dumps(values))
    monitor.close()
    dist.destroy_process_group()


# --- the tests ------------------------------------------------------------------------------
def _live_trace(directory: Path, world: int, timeout_s: float = 90.0):
    """The trace in ``directory`` once every rank's file holds all its step markers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(any(directory.glob(f"rank-{r}.*.jsonl.gz")) for r in range(world)):
            records = read_trace([directory]).records  # an append in progress is left out: no TraceError here
            markers = records[records["op"] == "step"]
            if len(markers) == world * STEPS:
                return records
        time.sleep(0.1)
    raise TimeoutError("the live trace never held every step marker")


def test_markers_forward_and_optimizer_rows_follow_the_steps(tmp_path):
    context = start_ranks(_markers_and_live_trace, 2, str(tmp_path))
    try:
        records = _live_trace(tmp_path, 2)  # read while the ranks still run: the periodic write
        assert not (tmp_path / "release").exists()
    finally:
        (tmp_path / "release").write_text("go")
        join(context, timeout_s=90)
    for rank in (0, 1):
        mine = records[records["rank"] == rank]
        markers = mine[mine["op"] == "step"].sort_values("step")
        assert list(markers["step"]) == list(range(STEPS))
        assert markers["group"].isna().all() and markers["seq"].isna().all()
        ends = (markers["start"] + markers["duration"]).to_numpy()
        assert abs(markers["start"].to_numpy()[1:] - ends[:-1]).max() < 1e-6  # each step begins where the last ended
        wall = json.loads((tmp_path / f"wall-{rank}.json").read_text())
        assert markers["duration"].sum() == pytest.approx(wall, rel=0.05, abs=0.005)
        for op in ("forward", "optimizer"):
            rows = mine[mine["op"] == op].sort_values("start")
            assert list(rows["step"]) == list(range(STEPS)), op
            step_of = markers.set_index("step")
            for row in rows.itertuples():  # each row lies inside its step's marker
                assert step_of.loc[row.step, "start"] - 1e-6 <= row.start
                assert (
                    row.start + row.duration
                    <= step_of.loc[row.step, "start"] + step_of.loc[row.step, "duration"] + 1e-6
                )
        buckets = mine[mine["op"].isin(COMMUNICATION_OPS)]
        assert set(buckets["step"]) == set(range(STEPS))  # DDP's bucket all-reduces, tagged with their step
    final = read_trace([tmp_path]).records  # the last write, at close, holds the same rows
    assert len(final[final["op"] == "step"]) == 2 * STEPS


@pytest.mark.slow
def test_the_straggler_waits_least_and_computes_most(tmp_path):
    run_ranks(_straggler, 2, str(tmp_path), 1, 0.05, steps=12)
    metrics = [json.loads((tmp_path / f"metrics-{rank}.json").read_text()) for rank in (0, 1)]
    assert [m["rank_label"] for m in metrics] == ["0", "1"]  # from torch.distributed: no RANK was set
    assert [m["logger_rank"] for m in metrics] == [0, 1]
    steps = 12
    wait = [m["trainhealth_train_step_wait_seconds_total"] / steps for m in metrics]
    compute = [m["trainhealth_train_step_compute_seconds_total"] / steps for m in metrics]
    assert wait[0] > 0.035  # rank 0 waits in its bucket all-reduces for rank 1's slow forward
    assert wait[1] < wait[0] / 3
    assert compute[1] > compute[0] + 0.035
    assert (
        metrics[0]["trainhealth_train_last_step_wait_seconds"] > metrics[1]["trainhealth_train_last_step_wait_seconds"]
    )
    assert metrics[1]["trainhealth_train_last_step_compute_seconds"] > 0.05


def test_a_link_at_the_segment_name_is_not_followed(tmp_path):
    logger = CollectiveLogger(rank=0, trace_dir=tmp_path)
    for step in range(3):
        logger.add_marker("step", step, 10.0 + step, 1.0)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    planted = tmp_path / "rank-0.0000.jsonl.gz"
    planted.symlink_to(victim)
    path = logger.write_trace()
    assert victim.read_text() == "keep me"
    assert planted.is_symlink() and os.readlink(planted) == str(victim)
    assert path == tmp_path / "rank-0.0001.jsonl.gz"
    records = read_trace([path]).records
    assert list(records["op"]) == ["step"] * 3 and list(records["step"]) == [0, 1, 2]


def test_each_write_appends_only_the_new_records(tmp_path):
    logger = CollectiveLogger(rank=2, host="node-a", gpu=1, trace_dir=tmp_path)
    logger.end("all_reduce", "dp0", 0, 5.0, 0.25, 64, None, False)
    logger.add_marker("step", 0, 4.0, 1.5)
    first = logger.write_trace()
    logger.step = 1
    logger.end("send", "pp:2->3", 0, 6.0, 0.5, 32, 3, True)
    logger.add_marker("step", 1, 5.5, 1.5)
    assert logger.write_trace() == first
    assert logger.write_trace() == first  # nothing new: nothing appended
    records = read_trace([tmp_path]).records
    assert list(records["step"]) == [0, 0, 1, 1] and list(records["op"]) == ["all_reduce", "step", "send", "step"]
    assert list(records["rank"]) == [2] * 4 and set(records["host"]) == {"node-a"} and set(records["gpu"]) == {1}
    assert list(records["async"]) == [False, False, True, False]
    assert records["peer"].tolist()[2] == 3 and pd.isna(records["group"][1])
    assert records["start"][0] == pytest.approx(logger.records()["start"][0])  # the wall clock, as records()
    assert logger.records_dropped == 0


def test_records_that_never_reach_the_trace_are_counted(tmp_path):
    logger = CollectiveLogger(rank=0, ring_size=4, trace_dir=tmp_path)
    for step in range(10):
        logger.add_marker("step", step, float(step), 1.0)
        logger.flush()  # the flush thread keeps up, the writes do not: 10 records, room for 4
    logger.write_trace()
    assert logger.records_dropped == 6
    assert list(read_trace([tmp_path]).records["step"]) == [6, 7, 8, 9]


def test_markers_are_trace_rows_with_empty_group_and_seq():
    logger = CollectiveLogger(rank=3)
    logger.end("all_reduce", "dp0", 0, 5.0, 0.25, 64, None, False)
    logger.add_marker("forward", 0, 4.5, 0.25)
    logger.add_marker("step", 0, 4.0, 1.5)
    frame = logger.records()
    assert list(frame["op"]) == ["all_reduce", "forward", "step"]
    marker = frame.iloc[2]
    assert marker["rank"] == 3 and marker["step"] == 0 and marker["duration"] == 1.5
    assert pd.isna(marker["group"]) and pd.isna(marker["seq"]) and pd.isna(marker["bytes"])


def test_wait_counts_blocking_collectives_and_the_tail_of_asynchronous_ones():
    from trainhealth._internal import catalog
    from trainhealth._internal.store import MetricStore

    store = MetricStore()
    logger = CollectiveLogger(rank=0, store=store)
    # step 0 from t=0 to 1: a blocking barrier 0.1-0.2; buckets started 0.3 and 0.6, done at 0.5 and 0.9
    logger.end("barrier", "g", 0, 0.1, 0.1, 0, None, False)
    logger.end("all_reduce", "g", 1, 0.3, 0.2, 8, None, True)
    logger.end("all_reduce", "g", 2, 0.6, 0.3, 8, None, True)
    logger.add_marker("step", 0, 0.0, 1.0)
    logger.flush()
    assert store.value(catalog.TRAIN_STEP_WAIT) == pytest.approx(0.1 + 0.3)  # the barrier, and 0.6-0.9
    assert store.value(catalog.TRAIN_STEP_COMPUTE) == pytest.approx(0.6)
    # step 1 from t=1 to 2, its collective flushed before its marker arrives
    logger.end("all_reduce", "g", 3, 1.5, 0.25, 8, None, False)
    logger.flush()
    assert store.value(catalog.TRAIN_LAST_STEP_WAIT) == pytest.approx(0.4)  # still step 0's
    logger.add_marker("step", 1, 1.0, 1.0)
    logger.flush()
    assert store.value(catalog.TRAIN_LAST_STEP_WAIT) == pytest.approx(0.25)
    assert store.value(catalog.TRAIN_LAST_STEP_COMPUTE) == pytest.approx(0.75)
    assert store.value(catalog.TRAIN_STEP_WAIT) == pytest.approx(0.65)
    assert store.value(catalog.COMM_OPS, ("all_reduce", "g")) == 3  # markers are no collectives


def _blocked_by_sweep(intervals, t0, t1):
    """The waiting time by a plain sweep over the pieces: the definition step_wait is checked against."""
    pieces = [(max(start, t0), min(end, t1)) for start, end, is_async in intervals if not is_async]
    started = [start for start, _, is_async in intervals if is_async]
    if started:
        last = max(max(started), t0)
        pieces += [(max(start, last), min(end, t1)) for start, end, is_async in intervals if is_async]
    blocked, reach = 0.0, -float("inf")
    for start, end in sorted(pieces):
        start = max(start, reach)
        if end > start:
            blocked += end - start
            reach = end
    return blocked


def test_step_wait_agrees_with_a_sweep_on_random_overlapping_intervals():
    import random

    from trainhealth._internal.exporters.collectives.logger import step_wait

    rng = random.Random(7)
    for _ in range(500):
        intervals = []
        for _ in range(rng.randint(0, 12)):
            start = rng.uniform(-0.5, 1.5)
            intervals.append((start, start + rng.expovariate(4.0), rng.random() < 0.4))
        assert step_wait(intervals, 0.0, 1.0) == pytest.approx(_blocked_by_sweep(intervals, 0.0, 1.0), abs=1e-12)


def test_collectives_waiting_for_a_marker_are_bounded_by_the_ring():
    logger = CollectiveLogger(rank=0, ring_size=100)
    logger.add_marker("step", 0, 0.0, 0.001)  # markers arrive: collectives are held for the next one
    logger.flush()
    for seq in range(250):
        logger.end("all_reduce", "g", seq, 1.0 + seq * 1e-3, 1e-4, 8, None, False)
        if seq % 60 == 0:
            logger.flush()
    logger.flush()
    starts, _, _ = logger._intervals.take()
    assert len(starts) == 100 and starts[0] == pytest.approx(1.0 + 150e-3)  # the newest 100, oldest first
