"""NAB scores of the detectors: `trainhealth-lab nab`, run and printed, then scored as NAB's code does.

    python benchmarks/nab.py [--out /tmp/nab-results] [--detector SPEC ...]

Runs the shipped detectors (trainhealth_lab.bench.nab.NAB_DETECTORS) over the
Numenta Anomaly Benchmark in $TRAINHEALTH_DATA/nab (default ../shared/data/nab)
and prints two tables. The first is `trainhealth-lab nab --split`:
trainhealth's normalisation (trainhealth_lab.bench.nab.score_corpus, written
from NAB's description) per profile, with the split columns: the standard score
on the files at even positions, where the threshold is chosen, and on those at
odd positions, with that threshold. The second scores the event-level result
files the run wrote as NAB's own code does (nab_score: true positives divided
by their maximum, a false positive's distance in window lengths less one, every
distinct score a candidate threshold, perfect = the number of windows), with
the same split. The last detector calibrates: a z-score over a 6,400-point
window without protection is NAB's Windowed Gaussian detector, published at
39.6. Published standard-profile scores for context: Windowed Gaussian 39.6,
Random Cut Forest 51.7, Numenta HTM 70.1, ARTime 74.9.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from trainhealth_lab.bench.nab import (
    NAB_DETECTORS,
    PROFILES,
    load_corpus,
    nab_score,
    read_results,
    result_names,
    split_score,
)
from trainhealth_lab.cli import main as trainhealth_lab

CALIBRATION = "zscore(window=6400,warmup=50,protect=false)"


def figure(score: float) -> str:
    return "insufficient data" if math.isnan(score) else f"{score:.1f}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/nab-results")
    parser.add_argument(
        "--detector",
        action="append",
        metavar="SPEC",
        help="a detector (repeatable; default: the shipped set and the calibration row)",
    )
    args = parser.parse_args()
    root = os.environ.get("TRAINHEALTH_DATA") or Path(__file__).resolve().parents[1].parent / "shared" / "data"
    data = Path(root) / "nab"
    detectors = args.detector or [*NAB_DETECTORS, CALIBRATION]
    code = trainhealth_lab(
        [
            "nab",
            "--data",
            str(data),
            "--out",
            args.out,
            "--split",
            *[argument for item in detectors for argument in ("--detector", item)],
        ]
    )
    if code:
        sys.exit(code)
    files = load_corpus(data)
    width = max(len(item) for item in detectors) + 2
    print(f"\nNAB's own scoring (nab_score) of the event scores written to {args.out}")
    print(
        f"{'detector':<{width}}"
        + "".join(f"{name:>20}" for name in PROFILES)
        + f"{'even files (tuned)':>20}{'odd files (held out)':>22}"
    )
    for item, name in zip(detectors, result_names(detectors)):
        scores = read_results(args.out, name, files)
        split = split_score(files, scores, scorer=nab_score)
        print(
            f"{item:<{width}}"
            + "".join(f"{nab_score(files, scores, profile)[0]:>20.1f}" for profile in PROFILES)
            + f"{figure(split.tuned):>20}{figure(split.held_out):>22}"
        )
