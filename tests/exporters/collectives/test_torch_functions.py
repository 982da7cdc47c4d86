"""The c10d functions torch 2.13 added or that FSDP2 calls, recorded in real 2-rank gloo runs.

torch 2.13 deprecates ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` for
``all_gather_single`` / ``reduce_scatter_single``, which ``fully_shard`` (FSDP2) calls; before they
were wrapped, an FSDP2 run left no collective record at all.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import trainhealth.comm
from tests.distributed import init_rank, run_ranks
from trainhealth.traces import read_trace

STEPS = 3
NEW_IN_213 = ("all_gather_single", "reduce_scatter_single")


def _count_calls_reaching_torch(names: tuple[str, ...], calls: Counter) -> None:
    """Count, below trainhealth's wrappers, the calls that reach torch's functions ``names``."""
    for name in names:
        original = getattr(c10d, name)

        @functools.wraps(original)  # keeps torch's signature, which the wrappers read
        def counting(*args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        setattr(c10d, name, counting)
        setattr(dist, name, counting)


def _fsdp2(rank: int, world: int, port: int, out: str) -> None:
    from torch.distributed.fsdp import fully_shard

    init_rank(rank, world, port)
    calls: Counter = Counter()
    _count_calls_reaching_torch(NEW_IN_213, calls)
    logger = trainhealth.comm.install(trace_dir=out)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        logger.step = step
        model(torch.randn(4, 8)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    trainhealth.comm.uninstall()
    Path(out, f"calls-{rank}.json").write_text(json.dumps(calls))
    dist.destroy_process_group()


def _direct(rank: int, world: int, port: int, out: str) -> None:
    init_rank(rank, world, port)
    trainhealth.comm.install(trace_dir=out)
    t = torch.ones(100)
    dist.all_gather_single(torch.zeros(100 * world), t)
    dist.reduce_scatter_single(torch.zeros(100), torch.ones(100 * world))
    dist.all_gather_into_tensor(torch.zeros(100 * world), t)  # runs all_gather_single: one record, not two
    dist.reduce_scatter_tensor(torch.zeros(100), torch.ones(100 * world))
    dist.all_gather_single(torch.zeros(100 * world), t, async_op=True).wait()
    dist.gather(t, [torch.zeros(100) for _ in range(world)] if rank == 0 else None, dst=0)
    dist.scatter(torch.zeros(100), [torch.ones(100) for _ in range(world)] if rank == 0 else None, src=0)
    dist.all_reduce_coalesced([torch.ones(10), torch.ones(20)])
    dist.all_gather_coalesced([[torch.zeros(10)] for _ in range(world)], [torch.ones(10)])
    dist.monitored_barrier()
    trainhealth.comm.uninstall()
    dist.destroy_process_group()


def test_fsdp2_fully_shard_collectives_are_recorded_once_each(tmp_path):
    pytest.importorskip("torch.distributed.fsdp")
    run_ranks(_fsdp2, 2, str(tmp_path), steps=STEPS)
    records = read_trace([tmp_path]).records
    collectives = records[records["op"].isin(["all_gather", "reduce_scatter"])]
    for rank in (0, 1):
        calls = json.loads((tmp_path / f"calls-{rank}.json").read_text())
        mine = collectives[collectives["rank"] == rank]
        # every all-gather and reduce-scatter FSDP2 ran is one record, in the step it ran in
        assert calls["all_gather_single"] > 0 and calls["reduce_scatter_single"] > 0
        assert (mine["op"] == "all_gather").sum() == calls["all_gather_single"]
        assert (mine["op"] == "reduce_scatter").sum() == calls["reduce_scatter_single"]
        per_step = mine.groupby("step").size()
        assert list(per_step.index) == list(range(STEPS)) and per_step.nunique() == 1
    per_instance = collectives.groupby(["group", "seq"]).agg(ranks=("rank", "nunique"), ops=("op", "nunique"))
    assert (per_instance["ranks"] == 2).all() and (per_instance["ops"] == 1).all()
    assert (collectives["bytes"] > 0).all()


def test_torch_213_functions_and_rooted_collectives_are_recorded(tmp_path):
    run_ranks(_direct, 2, str(tmp_path), timeout_s=120)  # no steps: one call of each function
    records = read_trace([tmp_path]).records
    for rank in (0, 1):
        ops = records[records["rank"] == rank].sort_values("seq")["op"].tolist()
        assert ops == [
            "all_gather",
            "reduce_scatter",
            "all_gather",
            "reduce_scatter",
            "all_gather",
            "reduce",  # gather: the trace format's many-to-one collective
            "broadcast",  # scatter: its one-to-many collective
            "all_reduce",
            "all_gather",
            "barrier",
        ]
    per_instance = records.groupby(["group", "seq"])["rank"].nunique()
    assert (per_instance == 2).all() and len(per_instance) == 10
    coalesced = records[(records["op"] == "all_reduce")]
    assert set(coalesced["bytes"]) == {120}  # both tensors of all_reduce_coalesced
