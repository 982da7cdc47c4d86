"""The cluster trace simulator: its timing model, injected faults and labels."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trainhealth._internal.faults import Fault
from trainhealth._internal.injectors import schedule_file  # noqa: F401  (declares the injectors' kinds, delay among them)
from trainhealth._internal.simulator.cluster import ClusterLayout
from trainhealth._internal.simulator.scenario import Control, Scenario, cluster_fault
from trainhealth._internal.simulator.simulate import simulate
from trainhealth.traces import read_trace

LAYOUT = ClusterLayout(dp=4, pp=4, tp=4, hosts_per_leaf=2)  # 64 GPUs, 8 hosts, 4 leaf switches


def _instances(records):
    comm = records.dropna(subset=["group"])
    return comm.assign(end=comm["start"] + comm["duration"]).groupby(["group", "seq"], observed=True)


def test_everything_written_says_it_is_simulated(tmp_path):
    trace = simulate(Scenario(LAYOUT, steps=3, seed=0))
    trace.write(tmp_path)
    read = read_trace([tmp_path])
    assert read.records["simulated"].all()
    assert read.topology.simulated and json.loads((tmp_path / "topology.json").read_text())["simulated"] is True
    assert json.loads((tmp_path / "ground_truth.json").read_text())["simulated"] is True
    assert read.records["host"].str.startswith("sim-node-").all()


def test_members_of_a_collective_end_together_and_the_last_arrival_waits_least():
    records = simulate(Scenario(LAYOUT, steps=3, seed=1)).records
    spread = _instances(records)["end"].agg(lambda end: end.max() - end.min())
    assert spread.max() < 1e-9
    for _, instance in list(_instances(records))[:200]:
        last = instance["start"].idxmax()
        assert instance.loc[last, "duration"] == instance["duration"].min()


def test_the_1f1b_schedule_and_the_parallel_groups():
    layout = ClusterLayout(dp=2, pp=4, tp=2, cp=2, ep=2)
    records = simulate(Scenario(layout, steps=2, microbatches=6, seed=2)).records
    per_rank_step = records.groupby(["rank", "step"])["op"].value_counts().unstack()
    assert (per_rank_step["forward"] == 6).all() and (per_rank_step["backward"] == 6).all()
    stage0 = records[(records["rank"] == 0) & (records["step"] == 0) & records["op"].isin(["forward", "backward"])]
    assert list(stage0["op"])[:5] == ["forward", "forward", "forward", "forward", "backward"]  # pp-1 warm-up forwards
    last_stage = layout.rank(dp=0, pp=3)
    passes = records[
        (records["rank"] == last_stage) & (records["step"] == 0) & records["op"].isin(["forward", "backward"])
    ]
    assert list(passes["op"])[:4] == ["forward", "backward", "forward", "backward"]
    members = records.dropna(subset=["group"]).groupby("group", observed=True)["rank"].nunique()
    kinds = {name.split("-")[0]: size for name, size in members.items()}
    assert kinds == {"tp": 2, "cp": 2, "ep": 2, "dp": 2, "pp": 2}


@pytest.mark.parametrize("kind", ["gpu", "nic"])
def test_a_fault_slows_its_target_only_while_it_is_active(kind):
    target, start, end = 21, 4, 8
    fault = cluster_fault(LAYOUT, kind, target, 2.0, step=start, until=end - 1)
    faulty = simulate(Scenario(LAYOUT, steps=10, seed=3, faults=(fault,))).records
    healthy = simulate(Scenario(LAYOUT, steps=10, seed=3)).records
    active = faulty["step"].between(start, end - 1)
    if kind == "gpu":
        ops = faulty["op"].isin(["forward", "backward"])
        ratio = faulty.loc[ops, "duration"].to_numpy() / healthy.loc[ops, "duration"].to_numpy()
        mine = (faulty.loc[ops, "rank"] == target).to_numpy()
        assert np.allclose(ratio[mine & active[ops].to_numpy()], 2.0)
        assert np.allclose(ratio[~mine | ~active[ops].to_numpy()], 1.0)
    else:
        # the last arrival's duration is the transfer time: doubled for every inter-host transfer of the target
        def transfer_times(records):
            ends = _instances(records[records["step"].between(start, end - 1)])
            return ends["duration"].min(), ends.apply(lambda i: target in set(i["rank"]) and i["host"].nunique() > 1)

        slow, touched = transfer_times(faulty)
        base, _ = transfer_times(healthy)
        ratio = slow / base
        assert touched.any() and np.allclose(ratio[touched], 2.0, rtol=0.3)
        assert np.median(ratio[~touched]) == pytest.approx(1.0, abs=0.1)


def test_a_switch_fault_slows_the_transfers_of_every_host_under_it():
    fault = cluster_fault(LAYOUT, "switch", 1, 3.0)
    trace = simulate(Scenario(LAYOUT, steps=4, seed=4, faults=(fault,)))
    assert trace.ground_truth["faults"][0]["ranks"] == list(range(16, 32))
    assert trace.ground_truth["faults"][0]["component"] == "switch:leaf-1"
    assert trace.topology["switches"]["16"] == "leaf-1"
    healthy = simulate(Scenario(LAYOUT, steps=4, seed=4)).records
    dp = trace.records[trace.records["op"].eq("all_reduce") & trace.records["group"].astype(str).str.startswith("dp")]
    base = healthy.loc[dp.index]
    crosses = dp["rank"].between(16, 31)
    groups_touching = set(dp.loc[crosses, "group"])
    touching = dp["group"].isin(groups_touching)
    shortest = dp.groupby(["group", "seq"], observed=True)["duration"].min()
    shortest_base = base.groupby(["group", "seq"], observed=True)["duration"].min()
    ratio = shortest / shortest_base
    touched = ratio.index.get_level_values(0).isin(groups_touching)
    assert np.median(ratio[touched]) == pytest.approx(3.0, rel=0.1) and touching.any()
    assert np.median(ratio[~touched]) == pytest.approx(1.0, rel=0.1)


def test_negative_controls():
    plain = simulate(Scenario(LAYOUT, steps=6, seed=5)).records
    longer = simulate(Scenario(LAYOUT, steps=6, seed=5, control=Control.STAGE_IMBALANCE)).records
    stage = plain["rank"] // LAYOUT.per_stage
    forward = plain["op"] == "forward"
    ratio = (longer.loc[forward, "duration"] / plain.loc[forward, "duration"]).groupby(stage[forward]).median()
    assert ratio.round(3).tolist() == [1.0, 1.0, 1.0, 1.5]
    varying = simulate(Scenario(LAYOUT, steps=6, seed=5, control=Control.SEQLEN_IMBALANCE))
    assert varying.ground_truth["verdict"] == "imbalance" and not varying.ground_truth["faults"]
    step_time = varying.records.groupby("step")["duration"].sum()
    assert step_time.std() / step_time.mean() > 3 * (
        plain.groupby("step")["duration"].sum().std() / plain.groupby("step")["duration"].sum().mean()
    )


def test_bad_scenarios_are_refused():
    with pytest.raises(ValueError, match="severity"):
        cluster_fault(LAYOUT, "gpu", 0, 0.9)
    with pytest.raises(ValueError, match="outside the cluster"):
        cluster_fault(LAYOUT, "switch", 9, 2.0)
    with pytest.raises(ValueError, match="outside the cluster"):
        Scenario(LAYOUT, faults=(Fault("gpu", (64,), severity=2.0),))
    with pytest.raises(ValueError, match="the simulator injects gpu, nic, host, switch faults, not delay"):
        Scenario(LAYOUT, faults=(Fault("delay", (1,), severity=0.5),))
    with pytest.raises(ValueError, match="ep must divide dp"):
        ClusterLayout(dp=3, pp=1, ep=2)
