"""Localization on simulated clusters with known faults, and on the real StragglerAnalysis traces."""

from __future__ import annotations

import re

import pytest

from tests.data import data_dir, needs
from trainhealth._internal.faults import Fault
from trainhealth._internal.localize.localizer import Thresholds, localize
from trainhealth._internal.simulator.cluster import ClusterLayout
from trainhealth._internal.simulator.scenario import Control, Scenario, cluster_fault
from trainhealth._internal.simulator.simulate import simulate
from trainhealth._internal.traces.convert import load_any

LAYOUT = ClusterLayout(dp=4, pp=4, tp=4, hosts_per_leaf=2)  # 64 GPUs on 8 hosts under 4 leaf switches
DATA = data_dir("straggler-analysis")
COMPUTE = ["forward", "backward", "optimizer"]


def _run(
    *faults: Fault,
    seed: int = 11,
    control: Control = Control.NONE,
    collectives_only: bool = False,
    unnumbered: bool = False,
):
    trace = simulate(Scenario(LAYOUT, steps=20, seed=seed, faults=faults, control=control))
    records = trace.records[~trace.records["op"].isin(COMPUTE)] if collectives_only else trace.records
    if unnumbered:  # a collective logger without the Monitor: no step numbers
        records = records.assign(step=0)
    return localize(records, trace.topology), trace.ground_truth


@pytest.mark.parametrize(
    "kind, target, component, verdict",
    [
        ("gpu", 37, "gpu:rank-37", "compute"),
        ("nic", 37, "nic:rank-37", "communication"),
        ("host", 5, "host:sim-node-0005", "communication"),
        ("switch", 2, "switch:leaf-2", "communication"),
    ],
)
@pytest.mark.parametrize("start, end", [(6, None), (8, 13)])
def test_the_injected_fault_is_the_top_suspect(kind, target, component, verdict, start, end):
    result, truth = _run(cluster_fault(LAYOUT, kind, target, 1.3, step=start, until=None if end is None else end - 1))
    assert truth["faults"][0]["component"] == component
    assert result.details["simulated"] is True and "SIMULATED" in result.render()
    if end is not None:  # it came and went: an event with its steps, no faulty device to page on
        assert result.suspects == () and result.verdict in ("healthy", "insufficient_data")
        event = result.details["events"][0]
        assert event["component"] == component and event["shape"] == "transient"
        assert f"in steps {start}-{end - 1}" in event["evidence"] and "an event, not a faulty" in event["evidence"]
        return
    assert result.verdict == verdict
    assert result.suspects[0].component == component
    assert result.suspects[0].score > 0.5
    assert f"in steps {start}-19" in result.suspects[0].evidence
    assert result.advice and result.to_dict()["suspects"][0]["kind"] in ("gpu", "link", "host")


@pytest.mark.parametrize(
    "kind, target, component",
    [("nic", 37, "nic:rank-37"), ("host", 5, "host:sim-node-0005"), ("switch", 2, "switch:leaf-2")],
)
def test_a_slow_links_evidence_names_the_size_of_the_transfers_that_slowed(kind, target, component):
    # the simulator's pipeline sends and receives carry 4 MiB (the trace's `bytes`), the most common transfers
    # across hosts: the sentence names them with their own slowdown, the severity injected
    trace = simulate(Scenario(LAYOUT, steps=20, seed=11, faults=(cluster_fault(LAYOUT, kind, target, 1.3, step=6),)))
    top = localize(trace.records, trace.topology).suspects[0]
    assert top.component == component
    found = re.search(r"; (\d+\.\d+)x on 4 MiB sends and receives\)", top.evidence)
    assert found is not None and 1.25 <= float(found.group(1)) <= 1.35, top.evidence
    # a trace without sizes: the same finding, no size claimed
    unsized = localize(trace.records.drop(columns="bytes"), trace.topology).suspects[0]
    assert unsized.component == component and "x on " not in unsized.evidence


@pytest.mark.parametrize(
    "control, verdict, reason",
    [
        (Control.NONE, "healthy", None),
        (Control.STAGE_IMBALANCE, "imbalance", "uneven stages: ranks 48, 49, 50, 51, 52"),
        (Control.SEQLEN_IMBALANCE, "imbalance", "uneven batches"),
    ],
)
@pytest.mark.parametrize("seed", [1, 2])
def test_negative_controls_blame_no_device(control, verdict, reason, seed):
    result, truth = _run(control=control, seed=seed)
    assert truth["verdict"] == verdict
    assert result.verdict == verdict and result.suspects == ()
    if reason is None:  # healthy is a finding: with the power this window had
        assert result.details["reasons"][0].startswith("healthy: a rank 1.0")
        power = result.details["power"]
        # an onset in the window shows against the rank's own steps; a rank slow all window only against its
        # peers, beyond the 14% healthy GPUs of this simulator differ by
        assert power["onset_in_window"] < 1.1 and power["steps"] == 10 and power["injections"] == 40
        assert 1.1 < power["throughout_window"] < 1.35 and power["slowdown"] == power["throughout_window"]
    else:
        assert result.details["reasons"][0].startswith(reason)
        assert result.advice[0].startswith("No device is to blame")


def test_a_slow_gpu_is_found_from_collectives_alone():
    # numbered steps, every collective blocking: the gaps between collectives are compute (recorded path)
    result, _ = _run(cluster_fault(LAYOUT, "gpu", 21, 1.5, step=6), collectives_only=True)
    assert result.details["evidence_source"] == "collectives"
    assert result.verdict == "compute" and [s.component for s in result.suspects] == ["gpu:rank-21"]
    assert "1.50x as long outside collectives" in result.suspects[0].evidence
    assert "steps 6-19" in result.suspects[0].evidence


def test_collectives_alone_with_steps_unnumbered_are_read_from_inferred_iterations():
    result, _ = _run(cluster_fault(LAYOUT, "gpu", 21, 1.5, step=6), collectives_only=True, unnumbered=True)
    assert result.details["evidence_source"] == "collectives (steps inferred)"
    assert result.verdict == "compute" and result.suspects[0].component == "gpu:rank-21"
    assert result.suspects[0].evidence.startswith("rank 21 computes 1.")


@pytest.mark.parametrize("seed", [1, 2, 11])
def test_uneven_batches_from_collectives_alone_blame_no_device(seed):
    result, _ = _run(control=Control.SEQLEN_IMBALANCE, collectives_only=True, seed=seed)
    assert result.verdict in ("imbalance", "healthy") and result.suspects == ()


@pytest.mark.parametrize("collectives_only", [False, True])
def test_uneven_batches_stay_imbalance_when_one_gpu_also_came_and_went(collectives_only):
    # one GPU's excursion moves its replica's compute for a few steps; the run's uneven batches move every
    # replica in every step: the imbalance is still named, the excursion listed as an event beside it
    excursion = cluster_fault(LAYOUT, "gpu", 21, 1.5, step=8, until=13 - 1)
    result, _ = _run(excursion, control=Control.SEQLEN_IMBALANCE, collectives_only=collectives_only, seed=2)
    assert result.verdict == "imbalance" and result.suspects == ()
    assert result.details["reasons"][0].startswith("uneven batches")
    assert result.details["events"][0]["component"] == "gpu:rank-21"


@pytest.mark.parametrize("seed", [1, 2, 11])
def test_a_clean_run_from_collectives_alone_blames_no_device(seed):
    result, _ = _run(collectives_only=True, seed=seed)
    assert result.verdict == "healthy" and result.suspects == ()


def test_a_fault_below_the_noise_is_not_blamed_on_someone_else():
    result, _ = _run(cluster_fault(LAYOUT, "gpu", 9, 1.02, step=15, until=18 - 1))
    assert all(s.component == "gpu:rank-9" for s in result.suspects[:1])


@needs("straggler-analysis")
def test_trace_ar_blames_the_artificially_slowed_worker():
    trace, _ = load_any([DATA / "trace-AR.parquet"])
    result = localize(trace.records, trace.topology)
    top = result.suspects[0]
    assert result.verdict == "compute" and top.kind == "gpu"
    first = trace.records[trace.records["rank"] == top.ranks[0]].iloc[0]
    assert (first["dp_rank"], first["stage"]) == (0, 0)
    assert "computes 2.4" in top.evidence


@needs("straggler-analysis")
def test_trace_st_is_imbalance_with_no_gpu_blamed():
    trace, _ = load_any([DATA / "trace-ST.parquet"])
    result = localize(trace.records, trace.topology)
    assert result.verdict == "imbalance" and result.suspects == ()
    assert result.details["reasons"][0].startswith("uneven stages: ranks 6, 7 compute 1.6")


def test_thresholds_are_checked():
    with pytest.raises(ValueError, match="gpu_z"):
        Thresholds(gpu_z=0)
    with pytest.raises(ValueError, match="decay"):
        Thresholds(decay=1.5)


def test_a_live_window_is_judged_against_the_runs_history():
    # 60 steps: a 4-step GPU slowdown long before the judged window, a persistent one inside it
    faults = (
        cluster_fault(LAYOUT, "gpu", 9, 1.5, step=10, until=14 - 1),
        cluster_fault(LAYOUT, "gpu", 37, 1.3, step=48),
    )
    trace = simulate(Scenario(LAYOUT, steps=60, seed=11, faults=faults))
    result = localize(trace.records, trace.topology, judge_last=20)
    assert result.details["window"]["steps"] == [40, 59] and result.details["history"]["steps"] == [0, 59]
    assert [s.component for s in result.suspects] == ["gpu:rank-37"] and result.suspects[0].since_step == 48
    assert "gpu:rank-9" not in [e["component"] for e in result.details.get("events", [])]  # before the window
    with pytest.raises(ValueError, match="judge_last"):
        localize(trace.records, trace.topology, judge_last=0)
