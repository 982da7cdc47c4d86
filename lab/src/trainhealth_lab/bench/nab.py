"""The Numenta Anomaly Benchmark: run detectors over its corpus and score them as NAB does.

Two scorers. :func:`score_corpus`, trainhealth's own, written from NAB's README
and whitepaper (Lavin & Ahmad, "Evaluating Real-time Anomaly Detection
Algorithms", 2015), gives the figures ``trainhealth-lab nab`` prints:

* each data file has labelled anomaly windows; the first 15% of a file (at most
  750 records) is probationary and not scored;
* a record is a detection when its anomaly score reaches the threshold;
* in each window only the first detection counts, weighted by the scaled
  sigmoid ``2 / (1 + exp(5 y)) - 1`` of its position ``y`` in the window (-1 at
  the window's start, 0 at its end): early detections earn up to ~0.99 of the
  true-positive weight;
* a detection outside every window is a false positive weighted by the same
  sigmoid of its distance after the preceding window, in window lengths (-1
  beyond three window lengths, or when no window precedes it), times the
  profile's false-positive weight; a window without a detection costs the
  false-negative weight;
* per profile and detector the threshold is the best of about 200 quantiles of
  the scores, and totals are normalised so the null detector (no detections)
  scores 0 and the perfect one (every window caught at its first record, worth
  ~0.99 each) 100.

:func:`nab_score` scores as NAB's own code does (``nab/sweeper.py`` and the
normalisation in ``nab/runner.py``, as recalled, not read beside this code):
a true positive's sigmoid is divided by its value at the window's start, so the
first record earns the whole true-positive weight; a false positive's distance
after the preceding window is divided by that window's length less one; the
threshold is the best of every distinct score; the null detector's total counts
the windows with a record past the probationary period, and the perfect total
is the true-positive weight times the number of windows.

Each detector runs with its decision step (protection, cooldown), at half its
default threshold so that NAB's threshold search has room below the default.
Two sets of anomaly scores are scored: ``events`` — the score where an event
opens and 0 elsewhere, what trainhealth reports — and ``points``, every record's
score. Scores are mapped to [0, 1) by ``score / (score + threshold)`` (0.5 at
the detector's default threshold; still telling apart scores a million times it). The ``events`` scores are written in NAB's
layout, ``<out>/<detector>/<category>/<detector>_<file>.csv`` with columns
``timestamp, value, anomaly_score, label`` (:func:`read_results` reads them back).
:func:`split_score` keeps a threshold choice honest: chosen on the files at even
positions, judged on the others.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from trainhealth._internal.detectors.spec import WatchSpec, parse_item
from trainhealth._internal.detectors.watch import Watch

__all__ = [
    "NAB_DETECTORS",
    "PROFILES",
    "NabFile",
    "NabResult",
    "SplitScore",
    "load_corpus",
    "nab_score",
    "read_results",
    "result_names",
    "run_nab",
    "scaled_sigmoid",
    "score_corpus",
    "split_score",
]

#: The detectors run by ``trainhealth-lab nab`` by default, with NAB-sized windows.
NAB_DETECTORS = (
    "zscore(window=1000,warmup=50)",
    "robust_z(window=1000,warmup=50)",
    "iqr(window=1000,warmup=50)",
    "level_shift(window=400,warmup=100)",
    "stl(window=576,refit_every=96)",
    # decides at 3 (half of 6); chosen on NAB, the odd files' score seen (docs/detectors.md): not held out
    "rarity(history=8192,threshold=6,cooldown=50,max_protected_share=0.02)",
)

#: NAB's scoring profiles (config/profiles.json): weights of true/false positives and negatives.
PROFILES = {
    "standard": {"tp": 1.0, "fp": 0.11, "fn": 1.0},
    "reward_low_FP_rate": {"tp": 1.0, "fp": 0.22, "fn": 1.0},
    "reward_low_FN_rate": {"tp": 1.0, "fp": 0.11, "fn": 2.0},
}


@dataclass(frozen=True)
class NabFile:
    """One NAB data file: its name (category/file.csv), records and windows (as record index ranges)."""

    name: str
    timestamps: pd.Series
    values: np.ndarray
    windows: tuple[tuple[int, int], ...]

    @property
    def probation(self) -> int:
        return min(math.floor(0.15 * len(self.values)), 750)

    @property
    def labels(self) -> np.ndarray:
        label = np.zeros(len(self.values), dtype=np.int64)
        for left, right in self.windows:
            label[left : right + 1] = 1
        return label


def load_corpus(root: str | os.PathLike[str]) -> list[NabFile]:
    """The NAB data files under ``root`` (with data/ and labels/combined_windows.json)."""
    root = Path(root)
    windows_file = root / "labels" / "combined_windows.json"
    if not windows_file.is_file():
        raise FileNotFoundError(f"{root} is not a NAB directory: {windows_file} is missing")
    windows = json.loads(windows_file.read_text(encoding="utf-8"))
    files = []
    for name in sorted(windows):
        frame = pd.read_csv(root / "data" / name)
        stamps = pd.to_datetime(frame["timestamp"])
        ranges = []
        for start, end in windows[name]:
            inside = np.flatnonzero((stamps >= pd.Timestamp(start)) & (stamps <= pd.Timestamp(end)))
            if len(inside):
                ranges.append((int(inside[0]), int(inside[-1])))
        files.append(NabFile(name, frame["timestamp"], frame["value"].to_numpy(dtype=np.float64), tuple(ranges)))
    return files


def scaled_sigmoid(position: float) -> float:
    """NAB's weight: ~1 at a window's start, 0 at its end, towards -1 for late false positives."""
    if position > 3.0:
        return -1.0
    return 2.0 / (1.0 + math.exp(5.0 * position)) - 1.0


def _file_score(file: NabFile, detected: np.ndarray, weights: dict[str, float]) -> float:
    detected = detected.copy()
    detected[: file.probation] = False
    score = 0.0
    covered = np.zeros(len(detected), dtype=bool)
    for left, right in file.windows:
        covered[left : right + 1] = True
        hits = np.flatnonzero(detected[left : right + 1])
        if len(hits):
            length = right - left + 1
            position = -(right - (left + hits[0]) + 1) / length
            score += weights["tp"] * scaled_sigmoid(position)
        else:
            score -= weights["fn"]
    for index in np.flatnonzero(detected & ~covered):
        previous = [(left, right) for left, right in file.windows if right < index]
        if previous:
            left, right = previous[-1]
            position = (index - right) / (right - left + 1)
            score += weights["fp"] * scaled_sigmoid(position)
        else:
            score -= weights["fp"]
    return score


def score_corpus(
    files: Sequence[NabFile],
    scores: Sequence[np.ndarray],
    profile: str = "standard",
    thresholds: Iterable[float] | None = None,
) -> tuple[float, float]:
    """(normalised score, best threshold) of one detector's anomaly scores over the corpus.

    The threshold is the best of ``thresholds``, by default of about 200 quantiles of the scores or one
    above every score (the null detector); given ``thresholds`` are scored as they are, below 0 if worse
    than no detection (a threshold held out from its choice).
    """
    weights = PROFILES[profile]
    optimised = thresholds is None
    windows = sum(len(f.windows) for f in files)
    null = -weights["fn"] * windows
    perfect = weights["tp"] * windows * scaled_sigmoid(-1.0)
    if thresholds is None:
        pooled = np.concatenate([s[f.probation :] for f, s in zip(files, scores)])
        pooled = pooled[np.isfinite(pooled)]
        thresholds = np.unique(
            np.quantile(pooled, np.r_[np.linspace(0.5, 0.99, 50), 1 - np.geomspace(1e-2, 1e-6, 150)])
        )
    best, best_threshold = -math.inf, 1.0
    for threshold in thresholds:
        raw = sum(_file_score(f, s >= threshold, weights) for f, s in zip(files, scores))
        if raw > best:
            best, best_threshold = raw, float(threshold)
    if optimised:
        best = max(best, null)  # a threshold above every score is the null detector
    return 100.0 * (best - null) / (perfect - null), best_threshold


def _nab_points(
    file: NabFile, scores: np.ndarray, weights: dict[str, float], first_window: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(score, weighted NAB score, window number or -1) of the file's records past its probationary period,
    as NAB's ``Sweeper.calcSweepScore`` weighs them; windows are numbered from ``first_window``."""
    index = np.arange(len(file.values))
    weight = np.full(len(index), -weights["fp"])  # before any window: -1 times the false-positive weight
    window = np.full(len(index), -1)
    max_tp = scaled_sigmoid(-1.0)
    for number, (left, right) in enumerate(file.windows):
        width = right - left + 1
        inside = slice(left, right + 1)
        position = -(right - index[inside] + 1) / width
        weight[inside] = weights["tp"] * (2.0 / (1.0 + np.exp(5.0 * position)) - 1.0) / max_tp
        window[inside] = first_window + number
        end = file.windows[number + 1][0] if number + 1 < len(file.windows) else len(index)
        if end > right + 1:
            if width == 1:
                raise ValueError(f"{file.name}: a window of one record; NAB's scorer divides by its length less one")
            after = slice(right + 1, end)
            position = (index[after] - right) / (width - 1)
            sigmoid = np.where(position >= 3.0, -1.0, 2.0 / (1.0 + np.exp(5.0 * np.minimum(position, 3.0))) - 1.0)
            weight[after] = weights["fp"] * sigmoid
    scored = slice(file.probation, None)
    return np.asarray(scores, dtype=np.float64)[scored], weight[scored], window[scored]


def nab_score(
    files: Sequence[NabFile],
    scores: Sequence[np.ndarray],
    profile: str = "standard",
    thresholds: Iterable[float] | None = None,
) -> tuple[float, float]:
    """(normalised score, best threshold) as NAB's code computes them, from the threshold sweep to the normalisation.

    Every record past the probationary period is weighted as NAB's ``Sweeper.calcSweepScore`` does; a
    window earns the largest weight among its detections (its earliest), ``-fn`` without one, and the
    false positives add theirs (``Sweeper.calcScoreByThreshold``). The threshold is the best of
    ``thresholds``, by default of every distinct score, the highest of equal totals (NAB's optimiser;
    ``inf`` where no detection beats none). The score is ``100 * (raw - null) / (perfect - null)``, with
    ``null = -fn x`` the windows that have a record past the probationary period and ``perfect = tp x``
    the windows (``Runner.normalize``).

    >>> import pandas as pd
    >>> stamps = pd.Series(pd.date_range("2024-01-01", periods=1000, freq="5min").astype(str))
    >>> files = [NabFile("x/a.csv", stamps, np.zeros(1000), ((400, 449),))]
    >>> scores = np.zeros(1000)
    >>> scores[400] = 0.9  # the window's first record: the whole true-positive weight
    >>> nab_score(files, [scores])
    (100.0, 0.9)
    """
    weights = PROFILES[profile]
    parts, first = [], 0
    for file, file_scores in zip(files, scores):
        parts.append(_nab_points(file, file_scores, weights, first))
        first += len(file.windows)
    score = np.concatenate([part[0] for part in parts]) if parts else np.zeros(0)
    weight = np.concatenate([part[1] for part in parts]) if parts else np.zeros(0)
    window = np.concatenate([part[2] for part in parts]) if parts else np.zeros(0, dtype=np.int64)
    scorable = len(np.unique(window[window >= 0]))
    keep = np.isfinite(score)  # NaN is no detection at any threshold
    score, weight, window = score[keep], weight[keep], window[keep]
    null = -weights["fn"] * scorable
    perfect = weights["tp"] * first
    # what each record adds to the total once the threshold reaches it: a false positive its weight, a
    # window's record what it raises the window's best weight by (from -fn), highest scores first
    gain = np.where(window < 0, weight, 0.0)
    in_window = np.flatnonzero(window >= 0)
    order = in_window[np.lexsort((-score[in_window], window[in_window]))]
    for number in np.unique(window[order]):
        records = order[window[order] == number]
        best = np.maximum.accumulate(weight[records])
        gain[records] = best - np.r_[-weights["fn"], best[:-1]]
    descending = np.argsort(-score, kind="stable")
    ranked, total = score[descending], null + np.cumsum(gain[descending])
    if thresholds is None:
        candidates = np.unique(ranked)[::-1]  # from the highest: of equal totals, NAB keeps the highest threshold
    else:
        candidates = np.asarray(list(thresholds), dtype=np.float64)
    reached = np.searchsorted(-ranked, -candidates, side="right")  # the records at or above each threshold
    totals = np.where(reached > 0, total[np.maximum(reached - 1, 0)], null)
    if len(totals) == 0 or (thresholds is None and totals.max() <= null):
        best_total, best_threshold = null, math.inf
    else:
        chosen = int(np.argmax(totals))
        best_total, best_threshold = float(totals[chosen]), float(candidates[chosen])
    return 100.0 * (best_total - null) / (perfect - null), best_threshold


def detector_scores(files: Sequence[NabFile], spec: WatchSpec) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(events, points) per file: the detector's scores, mapped to [0, 1) (0 where it had no verdict).

    ``events`` keeps the score only where an event opened; ``points`` keeps every record's. The files
    run side by side as the series of one detector (each series' state is its own), padded with NaN,
    which no detector learns or judges, after a file's last record.
    """
    decision = replace(spec, threshold=spec.threshold / 2).decision()
    watch = Watch(spec.signal, spec.detector.clone(), decision=decision, series=[str(i) for i in range(len(files))])
    lengths = [len(file.values) for file in files]
    values = np.full((max(lengths), len(files)), np.nan)
    for column, file in enumerate(files):
        values[: len(file.values), column] = file.values
    points, events = np.zeros_like(values), np.zeros_like(values)
    for index, row in enumerate(values):
        update = watch.update(row, step=index, time=float(index))
        scores = update.scores
        with np.errstate(invalid="ignore"):
            points[index] = np.where(np.isfinite(scores), scores / (scores + spec.threshold), 0.0)
        opened = [int(anomaly.series) for anomaly in update.opened]
        events[index, opened] = points[index, opened]
    return (
        [events[:length, column] for column, length in enumerate(lengths)],
        [points[:length, column] for column, length in enumerate(lengths)],
    )


@dataclass(frozen=True)
class SplitScore:
    """A threshold chosen on half the corpus and judged on the other half (standard profile).

    ``tuned`` is the score on the files at even positions (sorted by name) with the threshold
    NAB's rule picks there; ``held_out`` the score on the files at odd positions with that
    same threshold, so the threshold's choice did not see them (whether the detector's own
    settings were chosen without seeing them is for the caller to say). A half without anomaly windows cannot be scored (NaN:
    insufficient data), nor can a threshold be chosen on it.
    """

    tuned: float
    held_out: float
    threshold: float


def split_score(
    files: Sequence[NabFile],
    scores: Sequence[np.ndarray],
    profile: str = "standard",
    scorer: Callable[..., tuple[float, float]] = score_corpus,
) -> SplitScore:
    """The threshold chosen on the even-position files, scored on the odd-position ones.

    ``scorer`` is :func:`score_corpus` (trainhealth's normalisation) or :func:`nab_score` (NAB's).

    >>> import pandas as pd
    >>> stamps = pd.Series(pd.date_range("2024-01-01", periods=100, freq="5min").astype(str))
    >>> files = [NabFile(f"x/{i}.csv", stamps, np.zeros(100), ((50, 59),)) for i in range(4)]
    >>> scores = [np.where(np.arange(100) == (50 if i % 2 == 0 else 90), 0.9, 0.0) for i in range(4)]
    >>> result = split_score(files, scores)  # caught in the even files; missed in the odd ones, with a false positive
    >>> round(result.tuned), round(result.held_out)  # the held-out half worse than no detection
    (100, -6)
    """
    even, odd = files[0::2], files[1::2]
    if not any(file.windows for file in even):
        return SplitScore(math.nan, math.nan, math.nan)
    tuned, threshold = scorer(even, scores[0::2], profile)
    if not any(file.windows for file in odd):
        return SplitScore(tuned, math.nan, threshold)
    return SplitScore(tuned, scorer(odd, scores[1::2], profile, thresholds=[threshold])[0], threshold)


@dataclass(frozen=True)
class NabResult:
    """Normalised scores per profile, for event-level and point-level anomaly scores, and the
    standard profile's split of the event-level scores into tuned and held-out halves.

    ``detector`` names the results directory; ``spec`` is the detector as given.
    """

    detector: str
    spec: str
    events: dict[str, float]
    points: dict[str, float]
    split: SplitScore


def read_results(out: str | os.PathLike[str], detector: str, files: Sequence[NabFile]) -> list[np.ndarray]:
    """The event-level anomaly scores :func:`run_nab` wrote for ``detector`` (its results directory's name),
    one array per file, read back from NAB's results layout under ``out``."""
    scores = []
    for file in files:
        category, csv_name = file.name.split("/")
        frame = pd.read_csv(Path(out) / detector / category / f"{detector}_{csv_name}")
        if len(frame) != len(file.values):
            raise ValueError(f"{detector}_{csv_name}: {len(frame)} records, the data file has {len(file.values)}")
        scores.append(frame["anomaly_score"].to_numpy(dtype=np.float64))
    return scores


def result_names(detectors: Sequence[str]) -> list[str]:
    """The results directory of each detector spec: its name, ``_2``, ``_3``... for the same detector again."""
    names: list[str] = []
    for item in detectors:
        base = parse_item(item, "value").detector.name
        name, suffix = base, 2
        while name in names:  # the same detector twice, with other parameters
            name = f"{base}_{suffix}"
            suffix += 1
        names.append(name)
    return names


def run_nab(
    root: str | os.PathLike[str], out: str | os.PathLike[str], detectors: Sequence[str] = NAB_DETECTORS
) -> list[NabResult]:
    """Run ``detectors`` over the corpus, write NAB's results layout, and return the scores."""
    files = load_corpus(root)
    out = Path(out)
    results = []
    for item, name in zip(detectors, result_names(detectors)):
        spec = parse_item(item, "value")
        event_scores, point_scores = detector_scores(files, spec)
        for file, events in zip(files, event_scores):
            category, csv_name = file.name.split("/")
            target = out / name / category / f"{name}_{csv_name}"
            target.parent.mkdir(parents=True, exist_ok=True)
            pd.DataFrame(
                {"timestamp": file.timestamps, "value": file.values, "anomaly_score": events, "label": file.labels}
            ).to_csv(target, index=False)
        results.append(
            NabResult(
                name,
                item,
                {profile: score_corpus(files, event_scores, profile)[0] for profile in PROFILES},
                {profile: score_corpus(files, point_scores, profile)[0] for profile in PROFILES},
                split_score(files, event_scores),
            )
        )
    return results
