"""Importers on real inputs: ByteDance's StragglerAnalysis traces, and a Flight Recorder dump from a real run."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.data import data_dir, needs
from tests.distributed import init_rank, run_ranks
from trainhealth._internal.traces.convert import load_any
from trainhealth._internal.traces.flight_recorder import import_flight_recorder
from trainhealth._internal.traces.straggler_analysis import import_straggler_analysis
from trainhealth.traces import TraceError, read_trace

DATA = data_dir("straggler-analysis")
TRAINHEALTH = str(Path(sys.executable).parent / "trainhealth")


@pytest.mark.parametrize(
    "trial, ranks, parallelism", [("AR", 16, {"dp": 4, "pp": 4, "tp": 4}), ("ST", 8, {"dp": 2, "pp": 4})]
)
@needs("straggler-analysis")
def test_straggler_analysis_traces_become_consistent_v1(trial, ranks, parallelism):
    trace = import_straggler_analysis(DATA / f"trace-{trial}.parquet")
    records = trace.records
    assert records["rank"].nunique() == ranks
    assert trace.topology.parallelism == parallelism | ({"tp": 4} if trial == "AR" else {"tp": 1})
    comm = records.dropna(subset=["group"])
    instances = comm.groupby(["group", "seq"])
    sizes = instances["rank"].nunique()
    # a data-parallel collective has one member per replica; a pipeline transfer a sender and a receiver
    dp_groups = sizes[sizes.index.get_level_values("group").str.startswith("dp-")]
    assert (dp_groups == parallelism["dp"]).all()
    pp = comm[comm["group"].str.startswith("pp-")]
    for (_, _), pair in pp.groupby(["group", "seq"]):
        assert sorted(pair["op"]) == ["recv", "send"]
        assert pair["peer"].iloc[0] == pair["rank"].iloc[1] and pair["peer"].iloc[1] == pair["rank"].iloc[0]
    # per rank, the clock runs forward across the sampled steps
    first = records.groupby(["rank", "step"])["start"].min().groupby("rank").is_monotonic_increasing
    assert first.all()


@needs("straggler-analysis")
def test_the_straggler_of_trace_ar_shows_in_the_imported_records():
    """In trace-AR, dp_rank 0 / stage 0 was slowed: its compute takes longer than its stage peers'."""
    records = import_straggler_analysis(DATA / "trace-AR.parquet").records
    stage0 = records[(records["stage"] == 0) & (records["op"] == "forward")]
    by_replica = stage0.groupby("dp_rank")["duration"].median()
    assert by_replica.idxmax() == 0 and by_replica[0] > 1.2 * by_replica.drop(0).max()


@needs("straggler-analysis")
def test_cli_converts_and_describes(tmp_path):
    result = subprocess.run(
        [TRAINHEALTH, "trace", "convert", str(DATA / "trace-ST.parquet"), "-o", str(tmp_path / "st")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "st").iterdir()) == ["topology.json", "trace.parquet"]
    info = subprocess.run(
        [TRAINHEALTH, "trace", "info", "--json", str(tmp_path / "st")], capture_output=True, text=True, timeout=120
    )
    summary = json.loads(info.stdout)
    assert summary["records"] == 6784 and summary["ranks"] == list(range(8))
    ops = {entry["op"]: entry["count"] for entry in summary["ops"]}
    assert ops["forward"] == ops["backward"] == 1024 and ops["send"] == ops["recv"] == 1536
    assert read_trace([tmp_path / "st"]).topology.parallelism["pp"] == 4


def _dump_flight_recorder(rank: int, world: int, port: int, out: str) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "64"
    init_rank(rank, world, port)
    t = torch.ones(256)
    for _ in range(3):
        dist.all_reduce(t)
    dist.all_gather([torch.zeros(256) for _ in range(world)], t)
    dist.broadcast(torch.ones(32, dtype=torch.float64), 0)
    dist.barrier()
    data = torch._C._distributed_c10d._dump_fr_trace()
    Path(out, f"fr_trace_rank_{rank}").write_bytes(data)
    dist.destroy_process_group()


def test_a_flight_recorder_dump_from_a_real_gloo_run(tmp_path):
    """torch writes Flight Recorder dumps on CPU too: gloo records each collective as scheduled, without timings."""
    run_ranks(_dump_flight_recorder, 2, str(tmp_path), timeout_s=120)  # no steps: a few collectives
    trace, skipped = import_flight_recorder(sorted(tmp_path.iterdir()))
    records = trace.records
    assert skipped == {}
    assert sorted(records["rank"].unique()) == [0, 1]
    rank0 = records[records["rank"] == 0].sort_values("seq")
    assert list(rank0["op"]) == ["all_reduce"] * 3 + ["all_gather", "broadcast", "barrier"]
    assert list(rank0["seq"]) == [1, 2, 3, 4, 5, 6]
    assert list(rank0["bytes"])[:5] == [1024, 1024, 1024, 1024, 256]
    assert set(records["group"]) == {"0"} and trace.topology.groups == {"0": (0, 1)}
    assert set(records["state"]) == {"scheduled"} and (records["duration"] == 0).all()
    per_instance = records.groupby(["group", "seq"])["rank"].nunique()
    assert (per_instance == 2).all()
    # auto-detection through the CLI's loader
    auto, _ = load_any(sorted(tmp_path.iterdir()))
    assert len(auto.records) == len(records)


class _Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_a_dump_that_would_run_code_is_refused(tmp_path):
    (tmp_path / "evil_rank_0").write_bytes(pickle.dumps({"entries": [_Payload()]}))
    with pytest.raises(TraceError, match="refusing to load"):
        import_flight_recorder([tmp_path / "evil_rank_0"])
    (tmp_path / "cut_rank_1").write_bytes(pickle.dumps({"entries": []})[:-3])
    with pytest.raises(TraceError, match="not a readable Flight Recorder dump"):
        import_flight_recorder([tmp_path / "cut_rank_1"])
