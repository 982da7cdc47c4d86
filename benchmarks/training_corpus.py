"""Training-signal detectors on a corpus of real training runs: sharp events, divergences, shifts, false alarms.

    python benchmarks/training_corpus.py [--corpus DIR] [--calibrate]

Without ``--corpus`` the corpus is generated first (``trainhealth-lab corpus``,
seeds 0-5, into a temporary directory; about 20 minutes on 2 cores). Thresholds
were chosen on the calibration seeds (0-2) and the figures that count are those
of the held-out seeds (3-5); both tables are printed. ``--calibrate`` also prints
the threshold sweep on the calibration seeds and the threshold its rule picks (the
next value above the smallest one with no false alarm). Rows: single detectors, the
Monitor's defaults on loss, gradient norm and both, before issue 21 and now, and
``trainhealth detect``'s defaults on columns named loss and grad_norm (the Monitor's; run from the
first value). Scoring is described
in trainhealth_lab.bench.training_corpus.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from trainhealth._internal.config import DEFAULT_DETECTORS
from trainhealth_lab.bench.training_corpus import SHARP_STEPS, CorpusScore, score_corpus
from trainhealth_lab.corpus import CorpusRun, load_corpus

CALIBRATION_SEEDS = (0, 1, 2)
HELD_OUT_SEEDS = (3, 4, 5)
#: The Monitor's defaults for loss and gradient norm before issue 21, for comparison.
PREVIOUS_DEFAULTS = "loss=zscore(direction=up),spike,nonfinite;grad_norm=zscore(direction=up),spike,nonfinite"
#: ``trainhealth detect``'s default detectors before issue 21 (run offline from the first value).
PREVIOUS_OFFLINE = ("zscore", "iqr", "level_shift", "nonfinite")
DETECTORS = (
    "zscore(direction=up)",
    "spike",
    "nonfinite",
    "level_shift(direction=up)",
    "divergence",
    "bocpd(direction=up,log=true)",
)
SWEEPS = {
    "zscore(direction=up)": (3, 4, 6, 8, 12, 16),
    "divergence": (4, 6, 8, 12, 16, 24),
    "bocpd(direction=up,log=true)": (0.5, 0.8, 0.95, 0.99),
}


def training_defaults() -> str:
    """The Monitor's default detectors for loss and gradient norm."""
    return ";".join(part for part in DEFAULT_DETECTORS.split(";") if part.split("=")[0] in ("loss", "grad_norm"))


def candidates() -> list[tuple[str, str, int | None]]:
    """(name, detectors setting, values skipped at the start: None for the Monitor's detector_warmup)."""
    rows: list[tuple[str, str, int | None]] = [
        (f"{item} / {signal}", f"{signal}={item}", None) for item in DETECTORS for signal in ("loss", "grad_norm")
    ]
    rows.append(("divergence / both", "loss=divergence;grad_norm=divergence", None))
    for name, setting in (("defaults before #21", PREVIOUS_DEFAULTS), ("defaults", training_defaults())):
        parts = dict(part.split("=", 1) for part in setting.split(";"))
        rows += [(f"{name} / {signal}", f"{signal}={parts[signal]}", None) for signal in ("loss", "grad_norm")]
        rows.append((f"{name} / both", setting, None))
    rows += [
        (f"detect before #21 / {signal}", f"{signal}={','.join(PREVIOUS_OFFLINE)}", 0)
        for signal in ("loss", "grad_norm")
    ]
    # trainhealth detect runs the Monitor's defaults on a column named after one of its signals
    # (trainhealth._internal.detectors.offline.default_detectors), from the first value
    monitored = dict(part.split("=", 1) for part in training_defaults().split(";"))
    rows += [(f"detect defaults / {signal}", f"{signal}={monitored[signal]}", 0) for signal in ("loss", "grad_norm")]
    return rows


def print_table(title: str, scores: Sequence[CorpusScore]) -> None:
    print(title)
    print(
        f"{'candidate / signal':<42}{'sharp':>6}{'<=' + str(SHARP_STEPS) + ' st':>7}{'delay':>6}"
        f"{'cb+ovf':>7}{'<=' + str(SHARP_STEPS) + ' st':>7}{'div':>5}{'lead':>6}{'early':>7}"
        f"{'shift':>6}{'recall':>7}{'delay':>6}{'FA/1k':>7}{'healthy':>8}"
    )
    for s in scores:
        print(
            f"{s.candidate:<42}{s.sharp.events:>6}{s.sharp.recall:>7.2f}{s.sharp.median_delay:>6.0f}"
            f"{s.corrupted_or_overflow.events:>7}{s.corrupted_or_overflow.recall:>7.2f}"
            f"{s.divergence.collapsing:>5}{s.divergence.median_lead:>6.0f}{s.divergence.share_before_collapse:>7.2f}"
            f"{s.shift.events:>6}{s.shift.recall:>7.2f}{s.shift.median_delay:>6.0f}{s.false_alarms_per_1000:>7.2f}"
            f"{s.healthy_steps:>8}"
        )
    print()


def with_threshold(item: str, threshold: float) -> str:
    return f"{item[:-1]},threshold={threshold})" if "(" in item else f"{item}(threshold={threshold})"


def sweep(runs: Sequence[CorpusRun]) -> None:
    """The threshold sweep, and the rule's choice: the next threshold above the smallest one with no false
    alarm on these runs."""
    print("threshold sweep on the calibration seeds")
    print(
        f"{'detector':<32}{'signal':<11}{'threshold':>10}{'sharp<=2':>9}{'lead':>6}{'early':>7}{'shift':>7}{'FA/1k':>7}"
    )
    for item, thresholds in SWEEPS.items():
        for signal in ("loss", "grad_norm"):
            quiet = []
            for threshold in thresholds:
                s = score_corpus(runs, item, f"{signal}={with_threshold(item, threshold)}")
                quiet.append(s.false_alarms == 0)
                print(
                    f"{item:<32}{signal:<11}{threshold:>10}{s.sharp.recall:>9.2f}{s.divergence.median_lead:>6.0f}"
                    f"{s.divergence.share_before_collapse:>7.2f}{s.shift.recall:>7.2f}"
                    f"{s.false_alarms_per_1000:>7.2f}"
                )
            first = quiet.index(True) if True in quiet else None
            chosen = thresholds[first + 1] if first is not None and first + 1 < len(thresholds) else "none"
            print(f"{'':<43}chosen: {chosen}")
    print()


def generate(directory: Path) -> None:
    command = [
        str(Path(sys.executable).parent / "trainhealth-lab"),
        "corpus",
        "--out",
        str(directory),
        "--seeds",
        "0-5",
        "--workers",
        "2",
    ]
    print("generating the corpus: trainhealth-lab", " ".join(command[1:]), flush=True)
    subprocess.run(command, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, help="a corpus written by trainhealth-lab corpus (default: make one)")
    parser.add_argument("--calibrate", action="store_true", help="also print the threshold sweep")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = args.corpus
        if root is None:
            root = Path(scratch) / "corpus"
            generate(root)
        runs = load_corpus(root)
    split = {
        "calibration": [r for r in runs if r.labels["seed"] in CALIBRATION_SEEDS],
        "held-out": [r for r in runs if r.labels["seed"] in HELD_OUT_SEEDS],
    }
    print(
        f"corpus {root}: {len(runs)} runs; sharp = recall within {SHARP_STEPS} steps of the cause and median "
        f"delay; cb+ovf = corrupted batches and overflows; div = divergences that collapse, lead = median steps "
        f"from the first detection to the collapse (10x the pre-event loss), early = share caught before it; "
        f"FA/1k = false alarms per 1,000 healthy steps"
    )
    if args.calibrate:
        sweep(split["calibration"])
    for part, seeds in (("calibration", CALIBRATION_SEEDS), ("held-out", HELD_OUT_SEEDS)):
        scores = [score_corpus(split[part], name, setting, skip=skip) for name, setting, skip in candidates()]
        print_table(f"{part} seeds {', '.join(map(str, seeds))} ({len(split[part])} runs)", scores)


if __name__ == "__main__":
    main()
