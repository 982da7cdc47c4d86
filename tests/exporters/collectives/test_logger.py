"""The collective logger in real multi-process torch.distributed runs on gloo (2-4 ranks on 127.0.0.1)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import trainhealth.comm
from tests.distributed import free_port, init_rank, join, run_ranks, start_ranks
from tests.helpers import scrape
from tests.tiers import sweep
from trainhealth import Monitor
from trainhealth._internal.localize.hangs import find_hangs, states_from_samples
from trainhealth._internal.traces.ops import COMMUNICATION_OPS
from trainhealth.traces import read_trace
from trainhealth_lab import nccl_semantics


# --- work done in each rank (module level: spawned processes import it) ---------------------
def _init(rank: int, world: int, port: int, backend: str, timeout_s: float = 60.0) -> None:
    """``backend``: gloo, or the lab's CPU backend with NCCL's semantics (calls return at once, complete later)."""
    if backend == nccl_semantics.BACKEND:
        nccl_semantics.register()
    init_rank(rank, world, port, timeout_s=timeout_s, backend=backend)


def _device_sync(backend: str) -> None:
    """Where a GPU job waits for the device (``loss.item()``): on the NCCL-semantics backend, the host blocks until
    its collectives ran."""
    if backend == nccl_semantics.BACKEND:
        nccl_semantics.synchronize()


def _every_collective(rank: int, world: int, port: int, out: str, backend: str) -> None:
    _init(rank, world, port, backend)
    trainhealth.comm.install(trace_dir=out)
    t = torch.ones(1000)
    dist.all_reduce(t)
    dist.all_reduce(t, async_op=True).wait()
    dist.all_gather([torch.zeros(1000) for _ in range(world)], t)
    dist.all_gather_into_tensor(torch.zeros(1000 * world), t)
    dist.reduce_scatter(torch.zeros(1000), [torch.ones(1000) for _ in range(world)])
    dist.reduce_scatter_tensor(torch.zeros(1000), torch.ones(1000 * world))
    dist.all_to_all([torch.zeros(10) for _ in range(world)], [torch.ones(10) for _ in range(world)])
    dist.all_to_all_single(torch.zeros(10 * world), torch.ones(10 * world))
    dist.broadcast(t, 0)
    dist.reduce(t, 0)
    dist.barrier()
    partner = rank ^ 1
    if rank % 2 == 0:
        dist.send(torch.ones(64), partner)
        dist.recv(torch.zeros(32), partner)
    else:
        dist.recv(torch.zeros(64), partner)
        dist.send(torch.ones(32), partner)
    requests = [dist.isend(torch.ones(16), partner), dist.irecv(torch.zeros(16), partner)]
    for request in requests:
        request.wait()
    works = dist.batch_isend_irecv(
        [dist.P2POp(dist.isend, torch.ones(8), partner), dist.P2POp(dist.irecv, torch.zeros(8), partner)]
    )
    for work in works:
        work.wait()
    pairs = dist.new_group([0, 1], group_desc="pair")
    if rank in (0, 1):
        dist.all_reduce(torch.ones(4), group=pairs)
    dist.barrier()
    _device_sync(backend)
    trainhealth.comm.uninstall()
    dist.destroy_process_group()


def _straggler(
    rank: int, world: int, port: int, out: str, slow_rank: int, normal: int, slow: int, backend: str
) -> None:
    """``normal`` healthy iterations, then ``slow`` in which ``slow_rank`` computes 40 ms longer."""
    _init(rank, world, port, backend)
    logger = trainhealth.comm.install(trace_dir=out)
    t = torch.ones(4096)
    for step in range(normal + slow):
        logger.step = step
        time.sleep(0.004)  # the compute every rank does
        if rank == slow_rank and step >= normal:
            time.sleep(0.04)
        dist.all_reduce(t)
    _device_sync(backend)  # on NCCL's semantics the peers ran ahead: every all-reduce has completed after this
    trainhealth.comm.uninstall()  # stops the logger: what completed is recorded, flushed and written
    Path(out, f"summary-{rank}.json").write_text(
        json.dumps(
            {
                "flushed": logger._flushed_total,
                "abnormal": len(logger.abnormal_records),
                "fraction": logger.abnormal_fraction,
            }
        )
    )
    dist.destroy_process_group()


def _ddp_straggler(rank: int, world: int, port: int, out: str, slow_rank: int) -> None:
    init_rank(rank, world, port)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.05)
    trainhealth.comm.install(trace_dir=out)
    trainhealth.comm.instrument_ddp(ddp)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step in range(12):
        trainhealth.comm.installed().step = step
        loss = ddp(torch.randn(16, 64)).pow(2).mean()
        if rank == slow_rank:
            time.sleep(0.1)  # a slow GPU: its backward starts late
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    trainhealth.comm.uninstall()
    dist.destroy_process_group()


def _hang(rank: int, world: int, port: int, out: str, absent_rank: int, backend: str) -> None:
    _init(rank, world, port, backend)
    monitor = Monitor(
        comm=True,
        gpu_backend="off",
        comm_flush_interval=0.2,  # identity from RANK etc.
        prometheus_addr="127.0.0.1",
        prometheus_port=0,
        otel=False,
    )
    Path(out, f"url-{rank}.txt").write_text(monitor.metrics_url)
    t = torch.ones(16)
    for _ in range(5):
        dist.all_reduce(t)
    if rank == absent_rank:  # this rank stays away from the sixth all-reduce until the test has seen the hang
        release = Path(out, "release")
        deadline = time.monotonic() + 60
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    dist.all_reduce(t)  # the others wait here for the absent rank (on NCCL: the call returns, the work does not)
    _device_sync(backend)  # on NCCL the host blocks here, outside any collective, while the all-reduce is in flight
    monitor.close()
    dist.destroy_process_group()


# --- the tests ------------------------------------------------------------------------------
BACKENDS = sweep("backend", ["gloo", nccl_semantics.BACKEND])


@BACKENDS
def test_every_explicit_collective_is_recorded_with_matching_group_and_seq(tmp_path, backend):
    run_ranks(_every_collective, 4, str(tmp_path), backend, timeout_s=120)  # no steps: one call of each
    trace = read_trace([tmp_path])
    records = trace.records
    assert sorted(records["rank"].unique()) == [0, 1, 2, 3]
    assert set(records["op"]) == {
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "broadcast",
        "reduce",
        "barrier",
        "send",
        "recv",
    }
    collectives = records[~records["op"].isin(["send", "recv"])]
    world = collectives[collectives["group"] == "default_pg:0"]
    per_instance = world.groupby("seq").agg(ranks=("rank", "nunique"), ops=("op", "nunique"))
    assert (per_instance["ranks"] == 4).all() and (per_instance["ops"] == 1).all()
    assert len(per_instance) == 12  # 11 collectives and the final barrier, numbered alike on every rank
    pair = collectives[collectives["group"] == "pair:1"]
    assert sorted(pair["rank"]) == [0, 1] and set(pair["seq"]) == {0}
    reduce_rows = world[world["op"] == "all_reduce"]
    assert set(reduce_rows["bytes"]) == {4000}
    assert set(world[world["op"] == "barrier"]["bytes"]) == {0}
    # every send has exactly one receive with the same (group, seq), and the peers point at each other
    p2p = records[records["op"].isin(["send", "recv"])]
    for (group, seq), pair_rows in p2p.groupby(["group", "seq"]):
        assert sorted(pair_rows["op"]) == ["recv", "send"], (group, seq)
        send, recv = pair_rows[pair_rows["op"] == "send"].iloc[0], pair_rows[pair_rows["op"] == "recv"].iloc[0]
        assert send["peer"] == recv["rank"] and recv["peer"] == send["rank"]
        assert send["bytes"] == recv["bytes"]
    assert len(p2p) == 4 * 6  # blocking, isend/irecv and batch_isend_irecv: three sends and three receives per rank
    assert (records["duration"] >= 0).all() and records["host"].notna().all()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gloo", nccl_semantics.BACKEND])
def test_a_slow_rank_looks_short_and_its_peers_long(tmp_path, backend):
    run_ranks(_straggler, 4, str(tmp_path), 2, 40, 20, backend, steps=60)
    records = read_trace([tmp_path]).records
    slow_steps = records[records["step"] >= 40]
    median = slow_steps.groupby("rank")["duration"].median()
    assert median[2] < 0.015  # the slow rank arrives last: its all-reduces return at once
    assert all(median[r] > 0.03 for r in (0, 1, 3))  # its peers wait for it
    healthy = records[records["step"] < 40].groupby("rank")["duration"].median()
    assert all(healthy < 0.02)

    # the abnormal filter keeps the peers' slow all-reduces and little else
    flagged = read_trace([tmp_path / "abnormal"]).records
    assert (flagged["rank"] != 2).mean() > 0.9  # a stray record of the slow rank on a busy machine is tolerated
    assert (flagged["step"] >= 40).mean() > 0.9
    summaries = [json.loads((tmp_path / f"summary-{r}.json").read_text()) for r in range(4)]
    total = sum(s["flushed"] for s in summaries)
    kept = sum(s["abnormal"] for s in summaries)
    assert total == 4 * 60 and 0 < kept <= 3 * 20
    assert kept / total < 0.3  # what would leave the node: at most the peers' slow iterations


@pytest.mark.slow
def test_ddp_bucket_all_reduces_are_recorded(tmp_path):
    run_ranks(_ddp_straggler, 3, str(tmp_path), 1, steps=12)
    records = read_trace([tmp_path]).records
    buckets = records[records["op"] == "all_reduce"]
    assert len(buckets) > 0 and buckets["bytes"].min() > 0
    per_instance = buckets.groupby(["group", "seq"])["rank"].nunique()
    assert (per_instance == 3).all()
    later = buckets[buckets["step"] >= 2]  # after DDP's first iterations settle its buckets
    median = later.groupby("rank")["duration"].median()
    assert median[1] < median[0] / 2 and median[1] < median[2] / 2


@sweep("backend", [nccl_semantics.BACKEND, "gloo"])
def test_a_hang_names_the_rank_that_never_arrived(tmp_path, backend):
    context = start_ranks(_hang, 3, str(tmp_path), 2, backend)
    try:
        deadline = time.monotonic() + 60
        hangs = []
        while time.monotonic() < deadline and not hangs:
            time.sleep(0.5)
            urls = [tmp_path / f"url-{r}.txt" for r in range(3)]
            if not all(u.exists() for u in urls):
                continue
            samples = []
            for url in urls:
                for (name, labels), value in scrape(url.read_text()).samples().items():
                    samples.append((name, dict(labels), value))
            hangs = find_hangs(states_from_samples(samples), min_wait_s=2.0)
        assert hangs, "no hang was reported"
        (hang,) = hangs
        assert hang.group == "default_pg:0" and hang.op == "all_reduce"
        assert hang.seq == 5 and hang.waiting_ranks == (0, 1)
        assert hang.lagging_ranks == (2,) and hang.lagging_at == {2: 4}
        assert hang.verdict.startswith("rank 2 never entered it (last entered #4); ranks 0, 1 waiting ")
        assert hang.verdict.endswith(" s in all_reduce #5")
    finally:
        (tmp_path / "release").write_text("go")  # the absent rank arrives and the collective completes
        join(context, timeout_s=90)


def test_metrics_from_the_logger_in_one_process(tmp_path):
    port = free_port()
    init_rank(0, 1, port)
    unwrapped = dist.all_reduce
    try:
        with Monitor(
            env={},
            comm=True,
            gpu_backend="off",
            prometheus_addr="127.0.0.1",
            prometheus_port=0,
            otel=False,
            trace_dir=str(tmp_path),
        ) as monitor:
            for step in range(3):
                for _ in range(4):
                    dist.all_reduce(torch.ones(256))
                dist.broadcast(torch.ones(8), 0)
                monitor.step(loss=1.0, step=step)
            monitor.comm.flush()
            monitor.flush()
            got = scrape(monitor.metrics_url)
        labels = {"op": "all_reduce", "group": "default_pg:0"}
        assert got.value("trainhealth_comm_ops_total", **labels) == 12
        assert got.value("trainhealth_comm_bytes_total", **labels) == 12 * 1024
        assert got.value("trainhealth_comm_op_duration_seconds_count", **labels) == 12
        assert got.value("trainhealth_comm_ops_total", op="broadcast", group="default_pg:0") == 3
        assert got.value("trainhealth_comm_started_seq", group="default_pg:0") == 14
        assert got.value("trainhealth_comm_completed_seq", group="default_pg:0") == 14
        assert trainhealth.comm.installed() is None  # the Monitor that installed it removed it
        assert dist.all_reduce is unwrapped and dist.distributed_c10d.all_reduce is unwrapped
        records = read_trace([tmp_path]).records
        collectives = records[records["op"].isin(COMMUNICATION_OPS)]
        assert list(collectives.groupby("step").size()) == [5, 5, 5]  # steps follow monitor.step
        markers = records[records["op"] == "step"]
        assert list(markers["step"]) == [0, 1, 2] and markers["group"].isna().all()
    finally:
        dist.destroy_process_group()


def test_the_ring_buffer_is_bounded_and_counts_what_it_dropped():
    from trainhealth._internal import catalog
    from trainhealth._internal.exporters.collectives.logger import CollectiveLogger
    from trainhealth._internal.store import MetricStore

    store = MetricStore()
    logger = CollectiveLogger(rank=0, ring_size=100, store=store)
    for seq in range(250):
        logger.end("all_reduce", "g", seq, 0.0, 1e-4, 8, None, False)
        if seq % 50 == 49:
            logger.flush()  # the flush thread's job, once a second
    assert len(logger.records()) == 100
    assert list(logger.records()["seq"])[:2] == [150, 151]
    assert store.value(catalog.COMM_RECORDS_DROPPED) == 150
    assert store.value(catalog.COMM_OPS, ("all_reduce", "g")) == 250


def test_wrappers_pass_errors_through_and_keep_no_record(tmp_path):
    port = free_port()
    init_rank(0, 1, port)
    try:
        logger = trainhealth.comm.install()
        with pytest.raises((RuntimeError, ValueError, TypeError)):
            dist.all_reduce("not a tensor")
        dist.all_reduce(torch.ones(2))
        logger.flush()  # the ring is kept by the flush thread
        assert [r[1] for r in logger._ring] == ["all_reduce"] and logger._current is None
    finally:
        trainhealth.comm.uninstall()
        dist.destroy_process_group()
