"""How often `rarity` scores fresh draws >= 3 and >= 5, on the heavy-tailed and quantised data it is for.

    python benchmarks/rarity_calibration.py                     # seeds 5-9: the table of docs/detectors.md
    python benchmarks/rarity_calibration.py --seeds 0 1 2 3 4   # the seeds the tail-shape limit was chosen on

Per seed, 100 series each learn their own 4,096 values (the detector's default history), then
score 5,000 new draws each, never learnt: 500,000 scores per seed and distribution. A score of 3
claims a 1-in-1,000 value, 5 a 1-in-100,000 one; a calibrated detector scores >= 3 about 0.1% of
fresh draws of any distribution. Poisson counts can only be as rare as their values allow.
Normal data is the reference.
"""

from __future__ import annotations

import argparse

import numpy as np

from trainhealth._internal.detectors.rarity import Rarity

HISTORY = 4096


def draw(kind: str, rng: np.random.Generator, size: tuple[int, ...] | int) -> np.ndarray:
    if kind == "t2":
        return rng.standard_t(2, size)
    if kind == "lognormal":
        return rng.lognormal(0.0, 1.0, size)
    if kind == "pareto":
        return rng.pareto(1.5, size) + 1.0
    if kind == "poisson":
        return rng.poisson(2.0, size).astype(float)
    return rng.normal(size=size)


def rates(kind: str, seed: int, series: int, fresh: int) -> tuple[int, int, int]:
    """(scores >= 3, scores >= 5, scores) of ``fresh`` new draws of ``series`` series after their history."""
    rng = np.random.default_rng(seed)
    detector = Rarity()
    for row in draw(kind, rng, (HISTORY, series)):
        detector.learn(row)
    scores = np.concatenate([detector.score(draw(kind, rng, series)) for _ in range(fresh)])
    return int(np.count_nonzero(scores >= 3)), int(np.count_nonzero(scores >= 5)), scores.size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[5, 6, 7, 8, 9])
    parser.add_argument(
        "--kinds",
        nargs="+",
        default=["t2", "lognormal", "pareto", "poisson", "normal"],
        choices=["t2", "lognormal", "pareto", "poisson", "normal"],
    )
    parser.add_argument("--series", type=int, default=100)
    parser.add_argument("--fresh", type=int, default=5000, help="new draws scored per series")
    args = parser.parse_args()
    print("| data | scores | share >= 3 | share >= 5 | per seed >= 3 |")
    print("|---|---|---|---|---|")
    for kind in args.kinds:
        above3 = above5 = total = 0
        per_seed = []
        for seed in args.seeds:
            a, b, n = rates(kind, seed, args.series, args.fresh)
            above3, above5, total = above3 + a, above5 + b, total + n
            per_seed.append(f"{100 * a / n:.3f}%")
        print(
            f"| {kind} | {total:,} | {100 * above3 / total:.4f}% ({above3}) | {100 * above5 / total:.5f}% "
            f"({above5}) | {', '.join(per_seed)} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
