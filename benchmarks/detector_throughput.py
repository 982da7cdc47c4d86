"""Detector throughput, side by side with river and with per-point STL refits, in one run.

    pip install river   # only for this comparison
    python benchmarks/detector_throughput.py

For 1, 1,000 and 16,384 series, samples per second of one streaming step —
score, decide (threshold with protection), learn — for trainhealth's vectorised
detectors, against river with one object per series:
``anomaly.StandardAbsoluteDeviation`` and ``anomaly.GaussianScorer`` for the
z-score, and two ``stats.RollingQuantile`` per series for Tukey's fences.
STL (period 24, window 192, refit every 64 points) is measured amortised over
two refits after its first fit, against statsmodels' STL refitted for every
point (measured on one series: its cost per point does not depend on the
number of series). Targets (issue 5): z-score and IQR >= 10x river and
>= 1M samples/s at 16,384 series; STL >= 100k samples/s amortised at 16,384. The divergence
detector and BOCPD (run lengths up to 200 per series; measured over 30 steps) have no river
counterpart here.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from trainhealth._internal.detectors.bocpd import BOCPD
from trainhealth._internal.detectors.decision import Decision
from trainhealth._internal.detectors.divergence import Divergence
from trainhealth._internal.detectors.iqr import IQR
from trainhealth._internal.detectors.robust_z import RobustZ
from trainhealth._internal.detectors.stl import STLDetector
from trainhealth._internal.detectors.zscore import ZScore

WINDOW = 100


def ours(detector, data: np.ndarray, warm: int) -> float:
    decision = Decision(detector.default_threshold)
    for row in data[:warm]:
        detector.learn(row)
    begin = time.perf_counter()
    for row in data[warm:]:
        scores = detector.score(row)
        flagged = decision.step(scores).flagged
        detector.learn(row, ~flagged)
    elapsed = time.perf_counter() - begin
    return data[warm:].size / elapsed


def river_zscore(data: np.ndarray, kind: str) -> float:
    from river import anomaly

    models = [
        anomaly.StandardAbsoluteDeviation() if kind == "sad" else anomaly.GaussianScorer(window_size=WINDOW)
        for _ in range(data.shape[1])
    ]
    for row in data[:WINDOW]:
        for model, y in zip(models, row):
            model.learn_one(None, y)
    begin = time.perf_counter()
    for row in data[WINDOW:]:
        for model, y in zip(models, row):
            if model.score_one(None, y) < 0.999:  # the decision, as river's ThresholdFilter would take it
                model.learn_one(None, y)
    return data[WINDOW:].size / (time.perf_counter() - begin)


def river_iqr(data: np.ndarray) -> float:
    from river import stats

    quartiles = [
        (stats.RollingQuantile(0.25, WINDOW), stats.RollingQuantile(0.75, WINDOW)) for _ in range(data.shape[1])
    ]
    for row in data[:WINDOW]:
        for (q1, q3), y in zip(quartiles, row):
            q1.update(y)
            q3.update(y)
    begin = time.perf_counter()
    for row in data[WINDOW:]:
        for (q1, q3), y in zip(quartiles, row):
            low, high = q1.get(), q3.get()
            spread = max(high - low, 1e-12)
            score = (y - high) / spread if y > high else (low - y) / spread if y < low else 0.0
            if score < 3.0:
                q1.update(y)
                q3.update(y)
    return data[WINDOW:].size / (time.perf_counter() - begin)


def stl_per_point(data: np.ndarray, points: int = 200) -> float:
    from statsmodels.tsa.seasonal import STL

    series = data[:, 0]
    begin = time.perf_counter()
    for end in range(192, 192 + points):
        STL(series[end - 192 : end], period=24).fit()
    return points / (time.perf_counter() - begin)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, nargs="*", default=[1, 1000, 16384])
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    header = f"{'series':>7} {'detector':<28} {'samples/s':>14} {'vs river':>10}"
    print(header)
    print("-" * len(header))
    for n in args.series:
        steps = WINDOW + max(30, min(3000, 400_000 // n))
        t = np.arange(steps)[:, None]
        data = 10 + np.sin(2 * np.pi * t / 24) + rng.normal(0, 0.1, (steps, n))
        river_steps = WINDOW + max(10, min(2000, 60_000 // n))
        sad = river_zscore(data[:river_steps], "sad")
        gaussian = river_zscore(data[:river_steps], "gaussian")
        quantiles = river_iqr(data[:river_steps])
        rows = [
            ("river StandardAbsoluteDeviation", sad, None),
            ("river GaussianScorer", gaussian, None),
            ("trainhealth zscore", ours(ZScore(window=WINDOW), data, WINDOW), max(sad, gaussian)),
            ("river RollingQuantile IQR", quantiles, None),
            ("trainhealth iqr", ours(IQR(window=WINDOW), data, WINDOW), quantiles),
            ("trainhealth robust_z", ours(RobustZ(window=WINDOW), data, WINDOW), None),
            ("trainhealth divergence", ours(Divergence(), data, WINDOW), None),
            ("trainhealth bocpd (max_run 200)", ours(BOCPD(), data[: WINDOW + 30], WINDOW), None),
        ]
        for name, rate, reference in rows:
            ratio = f"{rate / reference:>9.1f}x" if reference else ""
            print(f"{n:>7} {name:<28} {rate:>14,.0f} {ratio:>10}", flush=True)
    n = max(args.series)
    steps = 192 + 128
    data = 10 + np.sin(2 * np.pi * np.arange(steps)[:, None] / 24) + rng.normal(0, 0.1, (steps, n))
    stl = STLDetector(period=24, window=192, refit_every=64)
    warm = STLDetector(period=24, window=192, refit_every=64)
    begin = time.perf_counter()
    for row in data[:193]:  # fill the windows and make the first fit
        warm.update(row)
    first_fit = time.perf_counter() - begin
    rate = ours(stl, data, 193)
    per_point = stl_per_point(data)
    print(f"{n:>7} {'trainhealth stl (amortised)':<28} {rate:>14,.0f} {rate / per_point:>9.0f}x")
    print(f"{1:>7} {'statsmodels STL per point':<28} {per_point:>14,.0f}")
    print(f"(the first STL fit of all {n} series took {first_fit:.1f} s)")


if __name__ == "__main__":
    main()
