"""Production noise in the cluster simulator, asserted on generated traces; one control run localized."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from trainhealth._internal.simulator.cluster import ClusterLayout
from trainhealth._internal.simulator.noise import HiccupKind, ProductionNoise, realise_noise
from trainhealth._internal.simulator.scenario import Scenario, Timing, cluster_fault, recurrent_fault
from trainhealth._internal.simulator.simulate import simulate
from trainhealth_lab.bench.production import Pattern, ProductionCase, evaluate

LAYOUT = ClusterLayout(dp=4, pp=2, tp=8)  # 64 GPUs, 8 hosts; no expert parallelism, so no MoE skew
STEPS = 1000
NOISE = ProductionNoise()


@pytest.fixture(scope="module")
def traces() -> tuple[pd.DataFrame, pd.DataFrame, object]:
    """The same seed with and without production noise (the noise draws from its own stream)."""
    noisy = simulate(Scenario(LAYOUT, steps=STEPS, microbatches=1, seed=11, noise=NOISE))
    plain = simulate(Scenario(LAYOUT, steps=STEPS, microbatches=1, seed=11))
    return noisy.records, plain.records, noisy


def _first_forward(records: pd.DataFrame) -> pd.DataFrame:
    return records[records["op"] == "forward"].sort_values(["step", "rank"])


def test_noise_is_drawn_as_documented_on_the_trace(traces):
    noisy, plain, trace = traces
    realised = realise_noise(NOISE, LAYOUT, STEPS, 1, seed=11)
    assert trace.hiccups == realised.hiccups
    forward, base = _first_forward(noisy), _first_forward(plain)
    step, rank = forward["step"].to_numpy(), forward["rank"].to_numpy()
    replica = (rank % LAYOUT.per_stage) // LAYOUT.tp
    before = base["duration"].to_numpy()
    expected = (
        before * realised.work[step, 0, replica] * realised.compute_factor[step, rank]
        + realised.compute_extra[step, rank]
    )
    differs = ~np.isclose(forward["duration"].to_numpy(), expected)
    assert differs.mean() < 1e-3 and (before[differs] > 1.5 * Timing().forward).all()  # the timing model's own GC
    assert trace.ground_truth["simulated"] and noisy["simulated"].all()
    assert trace.ground_truth["noise"]["hiccups"] == realised.counts()


def test_work_is_heavy_tailed_per_replica(traces):
    noisy, plain, _ = traces
    realised = realise_noise(NOISE, LAYOUT, STEPS, 1, seed=11)
    quiet = (realised.compute_extra == 0) & (realised.compute_factor == 1)  # no stall, no checkpoint
    backward = noisy[noisy["op"] == "backward"].sort_values(["step", "rank"])
    ratio = (
        backward["duration"].to_numpy()
        / plain[plain["op"] == "backward"].sort_values(["step", "rank"])["duration"].to_numpy()
    )
    ratio = ratio[quiet[backward["step"].to_numpy(), backward["rank"].to_numpy()]]
    assert np.std(np.log(ratio)) == pytest.approx(NOISE.work_sigma, rel=0.1)
    assert np.quantile(ratio, 0.999) > np.exp(2.5 * NOISE.work_sigma)  # one pass in a thousand 1.22x or more


def test_hiccups_come_at_the_documented_rates(traces):
    _, _, trace = traces
    counts = trace.ground_truth["noise"]["hiccups"]
    per_100 = STEPS / 100
    for kind, expected in (
        ("gc_pause", NOISE.gc_rate * LAYOUT.world * per_100),
        ("page_cache_miss", NOISE.page_cache_rate * LAYOUT.world * per_100),
        ("data_stall", NOISE.data_stall_rate * LAYOUT.dp * per_100),
        ("congestion", NOISE.congestion_rate * LAYOUT.world * per_100),
    ):
        assert abs(counts[kind] - expected) < 4 * np.sqrt(expected), kind  # Poisson, 4 sigma
    assert counts["checkpoint"] == STEPS // NOISE.checkpoint_every
    lengths = {
        kind: sorted({h.end_step - h.start_step for h in trace.hiccups if h.kind is kind and h.end_step < STEPS})
        for kind in HiccupKind
    }
    assert lengths[HiccupKind.GC_PAUSE] == [1, 2, 3] and lengths[HiccupKind.PAGE_CACHE_MISS] == [1]
    assert set(lengths[HiccupKind.CONGESTION]) <= {3, 4, 5, 6}
    assert all(
        h.start_step % NOISE.checkpoint_every == NOISE.checkpoint_every - 1
        for h in trace.hiccups
        if h.kind is HiccupKind.CHECKPOINT
    )


def test_congestion_slows_the_transfers_through_its_nic(traces):
    noisy, plain, _ = traces
    realised = realise_noise(NOISE, LAYOUT, STEPS, 1, seed=11)
    dp = (noisy["op"] == "all_reduce") & noisy["group"].astype(str).str.startswith("dp")
    # the last arrival's duration is the transfer time; jitter is drawn alike with and without noise
    shortest = noisy[dp].groupby(["group", "seq"], observed=True)["duration"].min()
    base = plain[dp].groupby(["group", "seq"], observed=True)["duration"].min()
    members = noisy[dp].groupby(["group", "seq"], observed=True).agg(step=("step", "first"), ranks=("rank", list))
    expected = [realised.path_factor[step, ranks].max() for step, ranks in zip(members["step"], members["ranks"])]
    assert np.allclose((shortest / base).to_numpy(), expected)
    assert max(expected) >= NOISE.congestion_factor[0]


def test_faults_inside_the_noise_slow_their_device_only():
    gpu = recurrent_fault(LAYOUT, "gpu", 21, 1.5, [(20, 23), (60, 62), (100, 104)])
    nic = cluster_fault(LAYOUT, "nic", 40, 2.0, step=80)
    with_faults = simulate(Scenario(LAYOUT, steps=150, microbatches=1, seed=4, faults=gpu + (nic,), noise=NOISE))
    without = simulate(Scenario(LAYOUT, steps=150, microbatches=1, seed=4, noise=NOISE)).records
    assert [f["component"] for f in with_faults.ground_truth["faults"]] == ["gpu:rank-21"] * 3 + ["nic:rank-40"]
    records = with_faults.records
    passes = records["op"].isin(["forward", "backward"]).to_numpy()
    ratio = records["duration"].to_numpy()[passes] / without["duration"].to_numpy()[passes]
    step, rank = records["step"].to_numpy()[passes], records["rank"].to_numpy()[passes]
    slow = (rank == 21) & np.isin(step, [s for f in gpu for s in range(f.step, (f.until or 0) + 1)])
    stalled = realise_noise(NOISE, LAYOUT, 150, 1, seed=4).compute_extra[step, rank] > 0  # a stall is not slower
    assert slow.sum() == 2 * 12 and np.allclose(ratio[slow & ~stalled], 1.5) and (ratio[slow] > 1.05).all()
    assert np.allclose(ratio[~slow], 1.0)
    dp = (records["op"] == "all_reduce") & records["group"].astype(str).str.startswith("dp")
    shortest = (
        records[dp]
        .groupby(["group", "seq"], observed=True)
        .agg(duration=("duration", "min"), step=("step", "first"), nic=("rank", lambda r: 40 in set(r)))
    )
    base = without[dp].groupby(["group", "seq"], observed=True)["duration"].min()
    touched = (shortest["nic"] & (shortest["step"] >= 80)).to_numpy()
    ratio = (shortest["duration"] / base).to_numpy()
    assert touched.sum() == 70 and np.allclose(ratio[touched], 2.0, rtol=0.15)  # x2, or a congestion on top
    assert np.median(ratio[~touched]) == pytest.approx(1.0)


def test_bad_noise_settings_are_refused():
    with pytest.raises(ValueError, match="gc_rate"):
        ProductionNoise(gc_rate=-1)
    with pytest.raises(ValueError, match="congestion_steps"):
        ProductionNoise(congestion_steps=(4, 2))
    with pytest.raises(ValueError, match="separate"):
        recurrent_fault(LAYOUT, "gpu", 0, 1.5, [(10, 13), (14, 17)])


@pytest.mark.slow
def test_a_production_noise_control_blames_nobody():
    outcome = evaluate(ProductionCase(Pattern.CONTROL, LAYOUT, STEPS, seed=1000))
    assert len(outcome.windows) == STEPS // 20
    assert not outcome.blamed, outcome.evidence
    assert [w for w in outcome.windows if w.blamed] == []
