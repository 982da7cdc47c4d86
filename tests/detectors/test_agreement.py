"""Scores agree with the same statistics computed by pandas / numpy, point by point."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from trainhealth._internal.detectors.delta import DeltaIrregularity
from trainhealth._internal.detectors.iqr import IQR
from trainhealth._internal.detectors.peer import PeerOutlier
from trainhealth._internal.detectors.robust_z import RobustZ
from trainhealth._internal.detectors.spike import SpikeScore
from trainhealth._internal.detectors.zscore import ZScore

RNG = np.random.default_rng(42)
DATA = RNG.standard_t(3, size=(400, 3)) + np.array([0.0, 10.0, -5.0])


def test_zscore_is_the_distance_from_the_previous_window():
    window = 50
    detector = ZScore(window=window, warmup=window)
    got = np.array([detector.update(row) for row in DATA])
    frame = pd.DataFrame(DATA)
    mean, std = frame.rolling(window).mean().shift(1), frame.rolling(window).std().shift(1)
    expected = ((frame - mean) / std).abs().to_numpy()
    np.testing.assert_allclose(got[window:], expected[window:], rtol=1e-7)


def test_iqr_uses_numpys_quartiles_of_the_previous_window():
    window = 40
    detector = IQR(window=window, warmup=window)
    for t, row in enumerate(DATA):
        scores = detector.score(row)
        if t >= window:
            q1, q3 = np.percentile(DATA[t - window : t], [25, 75], axis=0)
            spread = q3 - q1
            expected = np.where(row > q3, (row - q3) / spread, np.where(row < q1, (q1 - row) / spread, 0.0))
            np.testing.assert_allclose(scores, expected, rtol=1e-9, atol=1e-12)
        detector.learn(row)


def test_robust_z_uses_median_and_mad():
    window = 31
    detector = RobustZ(window=window, warmup=window)
    for t, row in enumerate(DATA[:200]):
        scores = detector.score(row)
        if t >= window:
            past = DATA[t - window : t]
            median = np.median(past, axis=0)
            mad = np.median(np.abs(past - median), axis=0)
            np.testing.assert_allclose(scores, np.abs(row - median) / (1.4826 * mad), rtol=1e-9)
        detector.learn(row)


def test_spike_score_is_olmo_2s_definition():
    rng = np.random.default_rng(7)
    values = rng.normal(1.0, 0.05, 3000)
    values[[1200, 1900, 2500]] += [1.0, 2.0, -1.5]
    # inside the first window: not judged itself, but it widens the standard deviation of the next
    # 1000 values enough that the +1.0 at 1200 is no longer 7 sigma out
    values[400] += 5.0
    detector = SpikeScore()
    for v in values:
        detector.update([v])
    s = pd.Series(values)
    mean, std = s.rolling(1000).mean().shift(1), s.rolling(1000).std().shift(1)
    judged = mean.notna()
    spikes = ((s - mean).abs() >= 7 * std) & judged
    assert detector.evaluated[0] == judged.sum() == 2000
    assert detector.spikes[0] == spikes.sum() == 2
    assert detector.spike_score[0] == pytest.approx(spikes.sum() / judged.sum())


def test_delta_is_the_ratio_to_the_window_average():
    detector = DeltaIrregularity(window=20, warmup=20)
    times = np.abs(DATA[:, 0]) + 1.0
    for t, value in enumerate(times):
        score = detector.score([value])[0]
        if t >= 20:
            assert score == pytest.approx(value / times[t - 20 : t].mean(), rel=1e-9)
        detector.learn([value])


def test_peer_outlier_is_a_cross_sectional_robust_z():
    step_times = np.array([1.00, 1.02, 0.98, 1.01, 1.60, 0.99, 1.00, 1.03])
    scores = PeerOutlier(direction="up").score(step_times)
    median = np.median(step_times)
    scale = max(1.4826 * np.median(np.abs(step_times - median)), 0.03 * median)
    np.testing.assert_allclose(scores, np.maximum((step_times - median) / scale, 0.0))
    assert int(np.argmax(scores)) == 4 and scores[4] > 5 > np.delete(scores, 4).max()
