"""NAB scores of the detectors: `trainhealth bench nab`, run and printed.

    python benchmarks/nab.py [--out /tmp/nab-results]

Runs the shipped detectors (trainhealth.lab.bench.nab.NAB_DETECTORS) over the
Numenta Anomaly Benchmark in ../shared/data/nab and prints the normalised scores
per profile (see trainhealth.lab.bench.nab for the scoring, written here from
NAB's description), with the split columns: the standard score on the files at
even positions, where the threshold is chosen, and on those at odd positions,
with that threshold held out. The last row calibrates: a z-score over a
6,400-point window without protection is NAB's Windowed Gaussian detector,
published at 39.6. Published standard-profile scores for context: Windowed
Gaussian 39.6, Random Cut Forest 51.7, Numenta HTM 70.1, ARTime 74.9.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainhealth.cli import main as trainhealth

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/nab-results")
    args = parser.parse_args()
    data = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "nab"
    from trainhealth.lab.bench.nab import NAB_DETECTORS

    calibration = "zscore(window=6400,warmup=50,protect=false)"
    detectors = [argument for item in (*NAB_DETECTORS, calibration) for argument in ("--detector", item)]
    sys.exit(trainhealth(["bench", "nab", "--data", str(data), "--out", args.out, "--split", *detectors]))
