"""NAB scoring, trainhealth's normalisation (score_corpus) and NAB's own (nab_score), checked on hand-made cases,
and `trainhealth-lab nab` on real NAB files."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.data import data_dir, needs
from trainhealth._internal.detectors.spec import parse_item
from trainhealth_lab.bench.nab import (
    NabFile,
    detector_scores,
    load_corpus,
    nab_score,
    read_results,
    scaled_sigmoid,
    score_corpus,
    split_score,
)

NAB = data_dir("nab")


def corpus(length: int = 1000, windows=((400, 449),)) -> list[NabFile]:
    stamps = pd.Series(pd.date_range("2024-01-01", periods=length, freq="5min").astype(str))
    return [NabFile("x/a.csv", stamps, np.zeros(length), tuple(windows))]


def detections(length: int, *indices: int) -> np.ndarray:
    scores = np.zeros(length)
    scores[list(indices)] = 1.0
    return scores


def test_the_scaled_sigmoid():
    assert scaled_sigmoid(-1.0) == pytest.approx(0.9866, abs=1e-4)
    assert scaled_sigmoid(0.0) == 0.0
    assert scaled_sigmoid(3.5) == -1.0


def test_null_perfect_and_late_detections():
    files = corpus()
    assert score_corpus(files, [np.zeros(1000)], thresholds=[0.5])[0] == 0.0
    assert score_corpus(files, [detections(1000, 400)], thresholds=[0.5])[0] == pytest.approx(100.0)
    # a detection at the window's last record earns almost nothing, but beats missing it
    late = score_corpus(files, [detections(1000, 449)], thresholds=[0.5])[0]
    assert 0.0 < late < 55.0
    # only the first detection in a window counts
    assert score_corpus(files, [detections(1000, 400, 420, 440)], thresholds=[0.5])[0] == pytest.approx(100.0)


def test_false_positives_cost_the_profile_weight():
    files = corpus()
    # one detection long after the window: fp weight x -1; with TP at the window start
    raw_tp = 0.9866142981514305
    expected = 100 * ((raw_tp - 0.11) - (-1.0)) / (raw_tp - (-1.0))
    assert score_corpus(files, [detections(1000, 400, 990)], thresholds=[0.5])[0] == pytest.approx(expected, rel=1e-6)
    # a detection in the probationary period (first 15%) is not scored at all
    assert score_corpus(files, [detections(1000, 100, 400)], thresholds=[0.5])[0] == pytest.approx(100.0)
    # a given threshold is scored as it is: a false positive before the window and the window missed
    expected = 100 * ((-0.11 - 1.0) - (-1.0)) / (raw_tp - (-1.0))
    assert score_corpus(files, [detections(1000, 200)], thresholds=[0.5])[0] == pytest.approx(expected, rel=1e-6)
    low_fp = score_corpus(files, [detections(1000, 400, 990)], "reward_low_FP_rate", thresholds=[0.5])[0]
    assert low_fp < score_corpus(files, [detections(1000, 400, 990)], thresholds=[0.5])[0]


# NAB's own formulas, written out here (nab/sweeper.py): a window's credit is its earliest detection's
# scaledSigmoid(-(right - i + 1) / width) / scaledSigmoid(-1) times tpWeight, a false positive's the
# scaledSigmoid of (i - previous right) / (previous width - 1) times fpWeight, -fpWeight before any window;
# scaledSigmoid(y) = 2 / (1 + exp(5 y)) - 1, and -1 for y > 3. The score is 100 (raw - null) / (perfect - null),
# null = -fnWeight x windows, perfect = tpWeight x windows.
MAX_TP = 2 / (1 + math.exp(-5.0)) - 1


def two_files() -> list[NabFile]:
    """1,000 records (probation 150), one window of 50; 2,000 records (probation 300), windows of 100 and 20."""
    return corpus(1000, ((400, 449),)) + [replace(corpus(2000, ((500, 599), (1500, 1519)))[0], name="x/b.csv")]


def test_nab_score_of_a_hand_made_result():
    files = two_files()
    a = detections(1000, 100, 300, 425, 430, 474) * 0.9
    b = detections(2000, 650, 1500, 1599) * 0.9
    raw = (
        -0.11  # a, 300: before any window
        + (2 / (1 + math.exp(5 * -25 / 50)) - 1) / MAX_TP  # a, 425: halfway into the window (430 is not counted)
        + 0.11 * (2 / (1 + math.exp(5 * 25 / 49)) - 1)  # a, 474: 25 records after a window of 50
        - 1.0  # b: the first window missed
        + 0.11 * (2 / (1 + math.exp(5 * 51 / 99)) - 1)  # b, 650: 51 records after a window of 100
        + 1.0  # b, 1500: the second window's first record
        - 0.11
    )  # b, 1599: 80 records after a window of 20, beyond three lengths
    expected = 100 * (raw - -3.0) / (3.0 - -3.0)
    assert nab_score(files, [a, b], thresholds=[0.5]) == (pytest.approx(expected, abs=1e-9), 0.5)
    # the threshold sweep leaves out the false positive before any window when it scores lower
    a[300] = 0.7
    assert nab_score(files, [a, b]) == (pytest.approx(100 * (raw + 0.11 + 3.0) / 6.0, abs=1e-9), 0.9)
    # reward_low_FN_rate: a missed window costs 2, and so does the null detector's each
    raw_low_fn = raw + 0.11 - 1.0
    assert nab_score(files, [a, b], "reward_low_FN_rate", thresholds=[0.9])[0] == pytest.approx(
        100 * (raw_low_fn + 6.0) / (3.0 + 6.0), abs=1e-9
    )


def test_nab_score_null_perfect_and_one_false_positive():
    files = two_files()
    assert nab_score(files, [np.zeros(1000), np.zeros(2000)]) == (0.0, math.inf)
    perfect = [detections(1000, 400), detections(2000, 500, 1500)]
    assert nab_score(files, perfect)[0] == 100.0
    # one false positive 10 records after the window of 20: 0.11 x scaledSigmoid(10 / 19)
    perfect[1][1529] = 1.0
    cost = 0.11 * (2 / (1 + math.exp(5 * 10 / 19)) - 1)
    assert nab_score(files, perfect)[0] == pytest.approx(100 * (3.0 + cost + 3.0) / 6.0, abs=1e-9)


def test_nab_and_trainhealth_normalisations_differ_as_documented():
    # the window's first record, ten false positives before it and one 25 records after it: NAB gives the whole
    # tpWeight, perfect = tpWeight, and measures 25 / 49; trainhealth's scorer gives scaledSigmoid(-1), perfect =
    # scaledSigmoid(-1), and measures 25 / 50
    files = corpus()
    scores = [detections(1000, *range(200, 210), 400, 474)]
    nab = 100 * (1.0 - 1.1 + 0.11 * (2 / (1 + math.exp(5 * 25 / 49)) - 1) + 1.0) / 2.0
    trainhealth = 100 * (MAX_TP - 1.1 + 0.11 * (2 / (1 + math.exp(5 * 25 / 50)) - 1) + 1.0) / (MAX_TP + 1.0)
    assert nab_score(files, scores, thresholds=[0.5])[0] == pytest.approx(nab, abs=1e-9)
    assert score_corpus(files, scores, thresholds=[0.5])[0] == pytest.approx(trainhealth, abs=1e-9)
    assert nab - trainhealth > 0.3


def test_the_threshold_is_optimised():
    files = corpus()
    scores = np.zeros(1000)
    scores[400] = 0.9  # the true positive
    scores[[600, 700, 800]] = 0.6  # false positives with lower scores
    value, threshold = score_corpus(files, [scores])
    assert value == pytest.approx(100.0) and 0.6 < threshold <= 0.9


@needs("nab")
def test_bench_nab_on_real_nab_files(tmp_path):
    names = ["realKnownCause/machine_temperature_system_failure.csv", "artificialNoAnomaly/art_daily_small_noise.csv"]
    windows = json.loads((NAB / "labels" / "combined_windows.json").read_text())
    (tmp_path / "nab" / "labels").mkdir(parents=True)
    (tmp_path / "nab" / "labels" / "combined_windows.json").write_text(json.dumps({n: windows[n] for n in names}))
    for name in names:
        target = tmp_path / "nab" / "data" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(NAB / "data" / name, target)
    assert [len(f.windows) for f in load_corpus(tmp_path / "nab")] == [0, 4]  # sorted by name
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "trainhealth-lab"),
            "nab",
            "--data",
            str(tmp_path / "nab"),
            "--out",
            str(tmp_path / "out"),
            "--detector",
            "zscore(window=400,warmup=50)",
            "--split",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    written = tmp_path / "out" / "zscore" / "realKnownCause" / "zscore_machine_temperature_system_failure.csv"
    frame = pd.read_csv(written)
    assert list(frame.columns) == ["timestamp", "value", "anomaly_score", "label"]
    assert frame["label"].sum() > 0 and frame["anomaly_score"].between(0, 1).all()
    line = next(line for line in result.stdout.splitlines() if line.startswith("zscore"))
    # the printed figure is the written scores' (trainhealth's normalisation, threshold optimised)
    files = load_corpus(tmp_path / "nab")
    written_scores = read_results(tmp_path / "out", "zscore", files)
    assert float(line.split()[1]) == pytest.approx(score_corpus(files, written_scores)[0], abs=0.05)
    # the even half is the anomaly-free file: no threshold can be chosen there
    assert line.split()[-4:] == ["insufficient", "data", "insufficient", "data"]
    # on the real windows, NAB's normalisation: the perfect detector 100, the null one 0, and one false
    # positive 10 records after the first window costs fpWeight x scaledSigmoid(10 / (its length - 1))
    temperature = files[1]
    perfect = [np.zeros(len(f.values)) for f in files]
    perfect[1][[left for left, _ in temperature.windows]] = 1.0
    assert nab_score(files, perfect) == (100.0, 1.0)
    assert nab_score(files, [np.zeros(len(f.values)) for f in files])[0] == 0.0
    left, right = temperature.windows[0]
    assert temperature.probation < left and right + 10 < temperature.windows[1][0]
    perfect[1][right + 10] = 1.0
    cost = 0.11 * (2 / (1 + math.exp(5 * 10 / (right - left))) - 1)
    assert nab_score(files, perfect)[0] == pytest.approx(100 * (4.0 + cost + 4.0) / 8.0, abs=1e-9)


def synthetic(name: str, length: int, spike: int, seed: int) -> tuple[NabFile, np.ndarray]:
    """A noisy daily cycle with one spike, labelled with a window starting at it."""
    rng = np.random.default_rng(seed)
    values = np.round(10 + 3 * np.sin(np.arange(length) * 2 * np.pi / 96) + rng.normal(0, 0.5, length), 1)
    values[spike] += 12.0
    stamps = pd.Series(pd.date_range("2024-01-01", periods=length, freq="5min").astype(str))
    return NabFile(name, stamps, values, ((spike, spike + length // 20),)), values


def test_files_run_side_by_side_as_when_run_alone():
    files = [
        synthetic(f"x/{i}.csv", length, spike, i)[0]
        for i, (length, spike) in enumerate([(300, 200), (500, 420), (400, 250)])
    ]
    spec = parse_item("rarity(history=200,warmup=50)", "value")
    together = detector_scores(files, spec)
    for index, file in enumerate(files):
        alone = detector_scores([file], spec)
        for kind in (0, 1):  # events, points
            np.testing.assert_array_equal(together[kind][index], alone[kind][0])
    assert all(events[file.windows[0][0]] > 0.5 for file, events in zip(files, together[0]))


def test_the_split_holds_the_threshold_out():
    files = [synthetic(f"x/{i}.csv", 1500, 1000 + 50 * i, i)[0] for i in range(4)]
    spec = parse_item("rarity(history=1000,warmup=100)", "value")
    events, _ = detector_scores(files, spec)
    split = split_score(files, events)
    assert split.tuned > 90.0 and split.held_out > 90.0  # one spike per file, caught where it starts
    # NAB's optimiser keeps the highest of equally good thresholds: the even files' lower spike score
    nab_split = split_score(files, events, scorer=nab_score)
    assert nab_split.tuned == 100.0
    assert nab_split.threshold == min(events[i][files[i].windows[0][0]] for i in (0, 2))
    odd = [files[1], files[3]]
    assert nab_split.held_out == nab_score(odd, [events[1], events[3]], thresholds=[nab_split.threshold])[0]
    # the held-out half does not choose its own threshold: above every odd-file score it scores 0
    shifted = [scores if i % 2 == 0 else scores * 0.5 for i, scores in enumerate(events)]
    assert split_score(files, shifted).held_out == 0.0
