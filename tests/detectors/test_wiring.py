"""Detectors on a process's own signals: anomalies become metrics, events and OTLP log records."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.helpers import scrape
from tests.otlp import OtlpReceiver, attributes
from trainhealth import ConfigError, Monitor
from trainhealth._internal import catalog
from trainhealth._internal.detectors.runner import SignalDetectors
from trainhealth._internal.detectors.spec import parse_setting, parse_spec
from trainhealth._internal.exporters.collectives.logger import CollectiveLogger
from trainhealth._internal.store import MetricStore

SERVE = {"prometheus_addr": "127.0.0.1", "prometheus_port": 0, "otel": False, "gpu_backend": "off"}
TRAINHEALTH = str(Path(sys.executable).parent / "trainhealth")


def test_a_loss_spike_and_a_nan_become_anomaly_metrics_and_events():
    rng = np.random.default_rng(0)
    with Monitor(env={}, **SERVE) as mon:
        for step in range(80):
            mon.step(loss=2.0 + rng.normal(0, 0.01), step=step)
        mon.step(loss=2.6, step=80)
        for step in range(81, 90):
            mon.step(loss=2.0 + rng.normal(0, 0.01), step=step)
        mon.step(loss=float("nan"), step=90)
        mon.flush()
        got = scrape(mon.metrics_url)
    assert got.value("trainhealth_anomalies_total", detector="zscore", signal="loss") == 1
    assert got.value("trainhealth_anomalies_total", detector="nonfinite", signal="loss") == 1
    assert (
        abs(got.value("trainhealth_anomalies_last_timestamp_seconds", detector="zscore", signal="loss") - time.time())
        < 60
    )
    assert got.value("trainhealth_anomalies_active", detector="nonfinite", signal="loss") == 1
    spike = next(e for e in mon.events.recent("anomaly") if e.attributes["detector"] == "zscore")
    assert spike.attributes["step"] == 80 and spike.attributes["value"] == 2.6
    assert spike.attributes["expected"] == pytest.approx(2.0, abs=0.01)
    assert spike.severity.value == "critical"  # 60 sigma


def test_slow_steps_in_a_row_are_delta_irregular_and_a_lone_one_is_counted():
    with Monitor(env={}, **SERVE) as mon:  # the first 20 steps are the detectors' warm-up (detector_warmup)
        for step in range(70):
            time.sleep(0.12 if step in (40, 60, 61) else 0.02)  # a lone slow step, then two in a row
            mon.step(loss=1.0, step=step)
        mon.flush()
        events = mon.events.recent("anomaly")
        got = scrape(mon.metrics_url)
    slow = [e.attributes["step"] for e in events if e.attributes["detector"] == "delta"]
    assert slow == [61]  # the default asks for two in a row: one slow step proves nothing
    # three irregular steps among the 49 judged (69 step times, the first 20 the warm-up)
    assert got.value("trainhealth_train_irregularity_ratio", signal="step_time") == pytest.approx(3 / 49)


def test_the_warm_up_reaches_only_the_non_finite_check():
    detectors = SignalDetectors(parse_spec("loss=zscore,nonfinite;step_time=delta"), warmup=20)
    opened = []
    for step in range(60):  # compile-slow, high-loss first steps, then a steady job
        loss, seconds = (50.0 - step, 5.0) if step < 20 else (1.0 + 0.001 * (step % 3), 0.1)
        opened += detectors.observe("loss", float("nan") if step == 3 else loss, step=step)
        opened += detectors.observe("step_time", seconds, step=step)
    assert [(a.detector, a.step) for a in opened] == [("nonfinite", 3)]
    without = SignalDetectors(parse_spec("loss=zscore;step_time=delta"))
    late = [without.observe("step_time", 0.1 if step else 5.0, step=step) for step in range(40)]
    late += [without.observe("step_time", 5.0, step=40)]
    assert late[-1] and late[-1][0].detector == "delta"  # the warm-up hides nothing after it ends


def test_the_step_that_includes_a_checkpoint_is_not_a_straggler():
    with Monitor(env={}, detectors="step_time=delta;throughput=level_shift(direction=down)", **SERVE) as mon:
        for step in range(50):
            time.sleep(0.02)
            mon.step(loss=1.0, tokens=100, step=step)
        mon.checkpoint_saved(49, 0.15)
        time.sleep(0.15)  # the save, inside step 50's time
        mon.step(loss=1.0, tokens=100, step=50)
        for step in range(51, 56):
            time.sleep(0.02)
            mon.step(loss=1.0, tokens=100, step=step)
        time.sleep(0.15)  # the same pause without a checkpoint is irregular
        mon.step(loss=1.0, tokens=100, step=56)
        mon.flush()
        got = scrape(mon.metrics_url)
        slow = [e.attributes["step"] for e in mon.events.recent("anomaly") if e.attributes["detector"] == "delta"]
    assert slow == [56]
    assert got.value("trainhealth_train_step_duration_seconds_count") == 56  # the metric still has every step


def test_collective_durations_are_watched_per_group():
    store = MetricStore()
    detectors = SignalDetectors(parse_spec("comm_duration=level_shift(direction=up)"), store=store)
    logger = CollectiveLogger(rank=0, store=store, detectors=detectors)
    rng = np.random.default_rng(1)
    for seq in range(200):
        for _ in range(4):
            slow = 0.02 if seq >= 150 else 0.0
            logger.end("all_reduce", "dp:1", seq, 0.0, 0.010 + slow + rng.normal(0, 0.0005), 1024, None, False)
        logger.end("broadcast", "dp:1", seq, 0.0, 0.001 + rng.normal(0, 0.0001), 64, None, False)
        logger.flush()
    assert store.value(catalog.ANOMALIES, ("level_shift", "comm_duration")) == 1
    (active,) = detectors.active()
    assert active.series == "all_reduce/dp:1" and active.start_step is not None


def test_anomalies_reach_opentelemetry_as_log_records_with_an_event_name(monkeypatch):
    receiver = OtlpReceiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    try:
        mon = Monitor(env={}, otel=True, prometheus=False, gpu_backend="off", detectors="loss=nonfinite")
        mon.step(loss=1.0, step=0)
        mon.step(loss=float("inf"), step=1)
        mon.close()
        records = [r for r in receiver.log_records() if r.event_name == "trainhealth.anomaly"]
        assert len(records) == 1
        (record,) = records
        fields = attributes(record.attributes)
        assert fields["detector"] == "nonfinite" and fields["signal"] == "loss" and fields["step"] == 1
        assert record.severity_text == "CRITICAL" and "nonfinite anomaly on loss" in record.body.string_value
    finally:
        receiver.close()


@pytest.mark.parametrize(
    "spec, message",
    [
        ("loss=zscore(window=5)", "zscore for loss: window must be >= warmup"),
        ("los=zscore", "unknown signal 'los'"),
        ("loss=zscore(threshold=high)", "zscore for loss"),
        ("loss=", "no detector named for loss"),
    ],
)
def test_a_bad_detector_setting_fails_at_once(spec, message):
    with pytest.raises(ConfigError) as error:
        Monitor(env={"TRAINHEALTH_DETECTORS": spec}, **SERVE)
    assert error.value.setting == "detectors" and message in str(error.value)
    with pytest.raises(ConfigError) as error:
        parse_setting(spec)
    assert error.value.setting == "detectors" and message in str(error.value)


def test_detectors_off():
    with Monitor(env={}, detectors="off", **SERVE) as mon:
        mon.step(loss=float("nan"))
        mon.flush()
        assert mon.events.recent("anomaly") == []


def test_trainhealth_detect_watches_each_series_of_a_long_table(tmp_path):
    rng = np.random.default_rng(2)
    rows = []
    for step in range(120):
        for rank in range(4):
            seconds = 1.0 + rng.normal(0, 0.005) + (0.8 if rank == 2 and step >= 100 else 0.0)
            rows.append({"step": step, "rank": f"rank{rank}", "step_time": seconds})
    path = tmp_path / "steps.parquet"
    pd.DataFrame(rows).to_parquet(path)
    result = subprocess.run(
        [
            TRAINHEALTH,
            "detect",
            str(path),
            "--column",
            "step_time",
            "--series-column",
            "rank",
            "--time-column",
            "step",
            "--detector",
            "delta",
            "--json",
            "--out",
            str(tmp_path / "a.csv"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    anomalies = json.loads(result.stdout)
    assert [(a["detector"], a["series"], a["start_step"]) for a in anomalies] == [("delta", "rank2", 100)]
    assert list(pd.read_csv(tmp_path / "a.csv")["series"]) == ["rank2"]


def test_trainhealth_detect_rejects_bad_input_in_one_line(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("loss\n1.0\nbanana\n")
    result = subprocess.run(
        [TRAINHEALTH, "detect", str(path), "--column", "loss"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr == "trainhealth: error: column 'loss', row 2: not a number: 'banana'\n"
