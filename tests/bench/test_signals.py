"""The labelled training-signal generator and the scoring of detectors on it."""

from __future__ import annotations

import numpy as np

from trainhealth_lab.bench.signals import evaluate, generate


def test_generation_is_seeded_and_labelled():
    a, b = generate(3, 2000), generate(3, 2000)
    for name in a.signals:
        np.testing.assert_array_equal(a.signals[name], b.signals[name])
    assert a.events == b.events
    spike = next(e for e in a.events if e.kind == "grad_spike")
    assert a.signals["grad_norm"][spike.start] > 2.5 * np.median(a.signals["grad_norm"])
    degradation = next(e for e in a.events if e.kind == "degradation")
    before = a.signals["step_time"][degradation.start - 200 : degradation.start]
    after = a.signals["step_time"][degradation.start : degradation.start + 200]
    assert np.median(after) / np.median(before) > 1.05


def test_a_detector_that_sees_every_spike_scores_full_recall():
    runs = [generate(seed, 3000) for seed in range(3)]
    zscore = evaluate(runs, "zscore(direction=up)", "grad_norm", "grad_spike")
    assert zscore.recall == 1.0 and zscore.median_delay == 0
    blind = evaluate(runs, "zscore(direction=up,threshold=1000)", "grad_norm", "grad_spike")
    assert blind.recall == 0.0 and blind.anomalies == 0
