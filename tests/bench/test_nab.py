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
from trainhealth.lab.bench.nab import NabFile, load_corpus, scaled_sigmoid, score_corpus

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
                             "--out", str(tmp_path / "out"), "--detector", "zscore(window=400,warmup=50)"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    written = tmp_path / "out" / "zscore" / "realKnownCause" / "zscore_machine_temperature_system_failure.csv"
    frame = pd.read_csv(written)
    assert list(frame.columns) == ["timestamp", "value", "anomaly_score", "label"]
    assert frame["label"].sum() > 0 and frame["anomaly_score"].between(0, 1).all()
    line = next(line for line in result.stdout.splitlines() if line.startswith("zscore"))
    standard = float(line.split()[1])
    assert 0.0 <= standard <= 100.0
