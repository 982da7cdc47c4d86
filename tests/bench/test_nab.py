"""NAB scoring, checked on hand-made cases, and `trainhealth bench nab` on real NAB files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.data import data_dir, needs
from trainhealth.detectors.spec import parse_item
from trainhealth.lab.bench.nab import NabFile, detector_scores, load_corpus, scaled_sigmoid, score_corpus, split_score

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
    low_fp = score_corpus(files, [detections(1000, 400, 990)], "reward_low_FP_rate", thresholds=[0.5])[0]
    assert low_fp < score_corpus(files, [detections(1000, 400, 990)], thresholds=[0.5])[0]


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
    result = subprocess.run([str(Path(sys.executable).parent / "trainhealth"), "bench", "nab", "--data", str(tmp_path / "nab"),
                             "--out", str(tmp_path / "out"), "--detector", "zscore(window=400,warmup=50)", "--split"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    written = tmp_path / "out" / "zscore" / "realKnownCause" / "zscore_machine_temperature_system_failure.csv"
    frame = pd.read_csv(written)
    assert list(frame.columns) == ["timestamp", "value", "anomaly_score", "label"]
    assert frame["label"].sum() > 0 and frame["anomaly_score"].between(0, 1).all()
    line = next(line for line in result.stdout.splitlines() if line.startswith("zscore"))
    standard = float(line.split()[1])
    assert 0.0 <= standard <= 100.0
    # the even half is the anomaly-free file: no threshold can be chosen there
    assert line.split()[-4:] == ["insufficient", "data", "insufficient", "data"]


def synthetic(name: str, length: int, spike: int, seed: int) -> tuple[NabFile, np.ndarray]:
    """A noisy daily cycle with one spike, labelled with a window starting at it."""
    rng = np.random.default_rng(seed)
    values = np.round(10 + 3 * np.sin(np.arange(length) * 2 * np.pi / 96) + rng.normal(0, 0.5, length), 1)
    values[spike] += 12.0
    stamps = pd.Series(pd.date_range("2024-01-01", periods=length, freq="5min").astype(str))
    return NabFile(name, stamps, values, ((spike, spike + length // 20),)), values


def test_files_run_side_by_side_as_when_run_alone():
    files = [synthetic(f"x/{i}.csv", length, spike, i)[0] for i, (length, spike) in
             enumerate([(300, 200), (500, 420), (400, 250)])]
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
    # the held-out half does not choose its own threshold: above every odd-file score it scores 0
    shifted = [scores if i % 2 == 0 else scores * 0.5 for i, scores in enumerate(events)]
    assert split_score(files, shifted).held_out == 0.0
