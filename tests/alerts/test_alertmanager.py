"""deploy/alertmanager/alertmanager.yml: valid for amtool, routes by severity, inhibitions name real alerts."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.prometheus_server import require_binary
from trainhealth._internal.alerts.rules import ALERTS

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "alertmanager" / "alertmanager.yml"


def _amtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([require_binary("amtool"), *args], capture_output=True, text=True, check=False, timeout=30)


def test_amtool_accepts_the_config():
    done = _amtool("check-config", str(CONFIG))
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("severity, receiver", [("page", "page"), ("ticket", "ticket"), ("info", "info")])
def test_each_severity_reaches_its_receiver(severity, receiver):
    done = _amtool(
        "config", "routes", "test", f"--config.file={CONFIG}", f"severity={severity}", "job=train", "host=node-1"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == receiver
    assert any(rule.severity == severity for rule in ALERTS)


def test_inhibitions_and_grouping_name_what_exists():
    config = yaml.safe_load(CONFIG.read_text())
    names = {rule.name for rule in ALERTS}
    assert config["route"]["group_by"] == ["job", "host"]
    for inhibition in config["inhibit_rules"]:
        for matcher in inhibition["source_matchers"] + inhibition["target_matchers"]:
            label, operator, value = re.match(r'(\w+)(=~|!=|=)"(.*)"', matcher).groups()
            if label == "alertname" and operator in ("=", "=~"):
                matched = {n for n in names if re.fullmatch(value, n)}
                assert matched, f"{matcher} matches no alert"
    lost = next(i for i in config["inhibit_rules"] if 'alertname="GpuLost"' in i["source_matchers"])
    silenced = {n for n in names if re.fullmatch("Gpu.+", n) and n != "GpuLost"}
    assert {"GpuXidCritical", "GpuThermalThrottling"} <= silenced and lost["equal"] == ["job", "host", "gpu"]
