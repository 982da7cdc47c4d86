"""Detectors on labelled training signals: precision, recall and detection delay.

    python benchmarks/training_signals.py [--seeds 10] [--steps 5000]

The seeded generator of trainhealth_lab.bench.signals makes loss, gradient-norm and
step-time series with labelled loss spikes, gradient spikes, delta-irregular
steps and a persistent step-time degradation; each detector runs on the signal
it is meant for, with its default decision step. An anomaly opening within 5
steps after a labelled event's end detects it; one detecting nothing is a false
positive (anomalies on events of another kind on the same signal count as neither).
"""

from __future__ import annotations

import argparse

from trainhealth_lab.bench.signals import evaluate, generate

CASES = [
    ("zscore(direction=up)", "loss", "loss_spike"),
    ("robust_z(direction=up)", "loss", "loss_spike"),
    ("iqr(direction=up)", "loss", "loss_spike"),
    ("stl(direction=up)", "loss", "loss_spike"),
    ("spike", "loss", "loss_spike"),
    ("zscore(direction=up)", "grad_norm", "grad_spike"),
    ("spike", "grad_norm", "grad_spike"),
    ("delta", "step_time", "irregular_step"),
    ("zscore(direction=up)", "step_time", "irregular_step"),
    ("level_shift(direction=up)", "step_time", "degradation"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=5000)
    args = parser.parse_args()
    runs = [generate(seed, args.steps) for seed in range(args.seeds)]
    print(f"{args.seeds} seeded runs of {args.steps} steps")
    print(f"{'detector':<28}{'signal':<11}{'events':<16}{'n':>5}{'recall':>8}{'precision':>11}{'median delay':>14}")
    for detector, signal, kind in CASES:
        r = evaluate(runs, detector, signal, kind)
        print(
            f"{detector:<28}{signal:<11}{kind:<16}{r.events:>5}{r.recall:>8.2f}{r.precision:>11.2f}"
            f"{r.median_delay:>12.0f} steps"
        )


if __name__ == "__main__":
    main()
