"""GPU telemetry wired into the Monitor and into ``trainhealth export``; failing soft without hardware."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest
import torch

from tests.helpers import scrape
from trainhealth import ConfigError, Monitor, Settings
from trainhealth._internal.exporters.gpu.dcgm import DcgmProfiler, DcgmUnavailable
from trainhealth._internal.exporters.gpu.simulated import SimulatedFault, SimulatedFaultKind

SERVE = {"prometheus_addr": "127.0.0.1", "prometheus_port": 0, "otel": False}


def _nvml_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_a_rank_samples_its_own_simulated_gpu_and_joins_on_its_uuid():
    env = {"RANK": "6", "LOCAL_RANK": "2", "WORLD_SIZE": "8"}
    with Monitor(torch.nn.Linear(2, 1), env=env, gpu_backend="simulated", **SERVE) as mon:
        mon.step(loss=1.0)
        mon.flush()
        got = scrape(mon.metrics_url)
    (gpu_info,) = got.labels_of("trainhealth_gpu_info")
    assert gpu_info["gpu"] == "2" and gpu_info["backend"] == "simulated"
    (rank_info,) = got.labels_of("trainhealth_rank_info")
    assert rank_info["gpu_uuid"] == gpu_info["uuid"]  # the join key with dcgm-exporter's UUID label
    assert got.value("trainhealth_gpu_up", gpu="2", rank="6") == 1
    assert got.value("trainhealth_train_loss", rank="6") == 1.0  # model metrics beside the GPU's


def test_the_demo_can_script_faults_on_a_ranks_simulated_gpu():
    with Monitor(torch.nn.Linear(2, 1), env={}, gpu_backend="simulated", **SERVE) as mon:
        simulator = mon.gpu.simulator
        simulator.inject(SimulatedFault(SimulatedFaultKind.XID, gpu=0, xid=79))
        assert mon.gpu.watcher.wait_for(1, timeout_s=10)
        mon.gpu.sampler.sample_once()
        mon.flush()
        got = scrape(mon.metrics_url)
    assert got.value("trainhealth_gpu_xid_errors_total", gpu="0", xid="79") == 1
    assert got.value("trainhealth_gpu_up", gpu="0") == 0
    assert [e.attributes["xid"] for e in mon.events.recent("gpu.xid")] == [79]


@pytest.mark.skipif(_nvml_present(), reason="NVML is present on this machine")
def test_without_a_driver_the_real_backend_fails_soft(caplog):
    caplog.set_level(logging.WARNING, logger="trainhealth")
    with Monitor(torch.nn.Linear(2, 1), env={}, gpu_backend="nvml", **SERVE) as mon:
        mon.step(loss=2.5)
        mon.gpu.sampler.sample_once()  # a later pass neither retries loudly nor raises
        mon.flush()
        got = scrape(mon.metrics_url)
    warnings = [r.getMessage() for r in caplog.records if "NVML is not available" in r.getMessage()]
    assert len(warnings) == 1 and "TRAINHEALTH_GPU_BACKEND=off" in warnings[0]
    assert got.value("trainhealth_train_loss") == 2.5
    assert got.value("trainhealth_exporter_gpu_backend_up", backend="nvml") == 0
    assert got.labels_of("trainhealth_gpu_up") == []  # nothing simulated stands in for the missing GPU


def test_gpu_backend_off_samples_nothing():
    with Monitor(torch.nn.Linear(2, 1), env={}, gpu_backend="off", **SERVE) as mon:
        assert mon.gpu is None
        mon.flush()
        got = scrape(mon.metrics_url)
    assert not [name for (name, _), _ in got.samples().items() if "gpu" in name]


def test_dcgm_absence_is_one_clear_message():
    if any(
        Path(d, "pydcgm.py").exists()
        for d in ("/usr/share/datacenter-gpu-manager-4/bindings/python3", "/usr/local/dcgm/bindings/python3")
    ):
        pytest.skip("DCGM bindings are installed here")
    with pytest.raises(DcgmUnavailable, match=r"^DCGM is not present: .*datacenter-gpu-manager"):
        DcgmProfiler()


@pytest.mark.parametrize(
    "env, setting",
    [
        ({"TRAINHEALTH_GPU_BACKEND": "fake"}, "gpu_backend"),
        ({"TRAINHEALTH_GPUS": "first"}, "gpus"),
        ({"TRAINHEALTH_GPU_SAMPLE_INTERVAL": "0"}, "gpu_sample_interval"),
    ],
)
def test_gpu_settings_are_validated(env, setting):
    with pytest.raises(ConfigError) as error:
        Settings.resolve(env=env)
    assert error.value.setting == setting


def test_trainhealth_export_serves_a_simulated_node_until_stopped():
    command = [
        str(Path(sys.executable).parent / "trainhealth"),
        "export",
        "--backend",
        "simulated",
        "--simulated-gpus",
        "4",
        "--addr",
        "127.0.0.1",
        "--port",
        "0",
        "--interval",
        "0.2",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINHEALTH_")}
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**env, "RANK": "3"}
    )
    try:
        line = process.stdout.readline()
        url = re.search(r"metrics at (http://\S+)", line).group(1)
        got = scrape(url)
        assert sorted(info["gpu"] for info in got.labels_of("trainhealth_gpu_info")) == ["0", "1", "2", "3"]
        assert {labels["rank"] for labels in got.labels_of("trainhealth_gpu_up")} == {""}  # a node, not a rank
        assert got.value("trainhealth_gpu_sm_active_ratio", gpu="1") > 0  # simulated profiling fields
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "Traceback" not in err


def test_trainhealth_export_rejects_a_bad_option_in_one_line():
    result = subprocess.run(
        [str(Path(sys.executable).parent / "trainhealth"), "export", "--backend", "imaginary"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "imaginary" in result.stderr
