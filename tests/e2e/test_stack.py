"""End to end: ``trainhealth stack up`` runs real Prometheus and Alertmanager binaries on 127.0.0.1 and the demo
(4 real gloo ranks, simulated GPUs); an in-test webhook receives Alertmanager's notifications.

With the demo's faults, each fault must page or ticket with the right rank / host / gpu and the mitigation,
within a bounded delay (printed); the demo's metrics must be in Prometheus and every dashboard panel must
return data. The same Prometheus also scrapes a 127.0.0.1 server that serves a recorded dcgm-exporter page
(tests/fixtures/dcgm-exporter), so the dashboards' dcgm-exporter queries are run against real labels too.
The faulty demo is the package's ``faulty_demo`` (conftest.py): the scale-out stack of test_scale_out scrapes
the same demo at the same time. A fault-free run must page nobody.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.e2e.stack_checks import (
    DCGM_SAMPLE,
    Receiver,
    RecordedExporter,
    assert_every_panel_has_data,
    assert_metrics_present,
    consecutive_free,
    free_ports,
    injections,
    query,
    require_binaries,
    scrape_recorded_dcgm,
    wait_for_exit,
)
from trainhealth._internal import catalog as c
from trainhealth._internal.stack.runner import StackOptions, stack_down, stack_up

pytestmark = pytest.mark.slow  # the slow tier: `pytest -m slow`

MAX_DELAY_S = 90.0


def _run_stack(tmp_path: Path, duration: float, demo_args: tuple[str, ...] = ()):
    require_binaries()
    receiver = Receiver()
    prometheus_port, alertmanager_port, analyzer_port = free_ports(3)
    options = StackOptions(
        directory=tmp_path / "stack",
        prometheus_port=prometheus_port,
        alertmanager_port=alertmanager_port,
        webhook_port=receiver.port,
        ranks=4,
        port_base=consecutive_free(4),
        analyzer_port=analyzer_port,
        scrape_interval_s=1.0,
        max_for_s=5.0,
        demo_duration_s=duration,
        demo_args=("--webhook-port", "0", *demo_args),
    )
    began = time.time()
    started = stack_up(options)
    dcgm = RecordedExporter(DCGM_SAMPLE.read_bytes())
    try:
        scrape_recorded_dcgm(options, started, dcgm.port, options.prometheus_port)
    except BaseException:
        stack_down(options.directory)
        raise
    demo = next(s for s in started if s.name == "demo")
    return receiver, options, demo, began


def test_every_injected_fault_alerts_with_its_labels_and_mitigation(faulty_demo, capsys):
    options, receiver, began = faulty_demo.reference, faulty_demo.reference_receiver, faulty_demo.began
    injected = injections(faulty_demo.out)
    deadline = time.time() + 45  # alerts that fired near the end still travel through Alertmanager
    expected = ("GpuThermalThrottling", "StragglerSuspect", "GpuLost")
    while time.time() < deadline and not all(receiver.firing(name) for name in expected):
        time.sleep(1)
    ended = time.time()

    # the faults, as the ground truth recorded them
    assert set(injected) >= {"thermal_throttle", "delay", "lr_scale", "xid"}
    hot, slow, lost = injected["thermal_throttle"][1], injected["delay"][1], injected["xid"][1]

    delays = {}
    (t, alert), *_ = receiver.firing("GpuThermalThrottling")
    assert alert["labels"]["gpu"] == str(hot["gpu"]) and alert["labels"]["severity"] == "ticket"
    assert "cooling" in alert["annotations"]["mitigation"]
    delays["thermal throttling -> GpuThermalThrottling"] = t - injected["thermal_throttle"][0]

    stragglers = receiver.firing("StragglerSuspect")
    assert stragglers, "the analyzer's suspect never reached Alertmanager"
    t, alert = stragglers[0]
    assert alert["labels"]["rank"] == str(slow["rank"]) and alert["labels"]["kind"] == "gpu"
    assert alert["annotations"]["mitigation"].startswith("Cordon the node of the suspect GPU")
    assert alert["annotations"]["runbook_url"].endswith("docs/runbooks/StragglerSuspect.md")
    delays["straggler -> StragglerSuspect"] = t - injected["delay"][0]

    (t, alert), *_ = receiver.firing("GpuLost")
    assert alert["receiver"] == "page" and alert["labels"]["gpu"] == str(lost["gpu"])
    assert alert["labels"]["rank"] == str(lost["rank"]) and "RMA" in alert["annotations"]["mitigation"]
    delays["XID 79 -> GpuLost (page)"] = t - injected["xid"][0]
    # the XID alert fired in Prometheus; Alertmanager let GpuLost silence it (inhibition) or sent it first
    xids = query(options.prometheus_port, 'max_over_time(ALERTS{alertname="GpuXidCritical",alertstate="firing"}[10m])')
    assert {(r["metric"]["xid"], r["metric"]["gpu"]) for r in xids} == {("79", str(lost["gpu"]))}
    spikes = query(options.prometheus_port, 'max_over_time(ALERTS{alertname="LossSpike",alertstate="firing"}[10m])')
    assert [r["metric"]["severity"] for r in spikes] == ["info"]  # context: routed to nobody

    with capsys.disabled():
        print("\nalert delays (injection -> Alertmanager webhook):")
        for what, seconds in delays.items():
            print(f"  {what}: {seconds:.1f} s")
    assert all(0 < seconds <= MAX_DELAY_S for seconds in delays.values()), delays

    assert_metrics_present(options.prometheus_port)
    assert_every_panel_has_data(options.prometheus_port, began, ended)
    report = json.loads((faulty_demo.out / "report.json").read_text())
    localization = report["localization"]
    # the straggler slows steps 30-60% of the run and recovers: judged over the whole run it is an event that
    # names its rank (a stretch that came and went pages nobody), or a suspect if still ongoing
    named = localization["suspects"] if localization["verdict"] == "compute" else localization["events"]
    assert localization["verdict"] in ("compute", "healthy"), localization
    assert named[0]["ranks"] == [slow["rank"]], localization


def test_a_fault_free_run_pages_nobody(tmp_path):
    receiver, options, demo, _ = _run_stack(tmp_path, duration=40, demo_args=("--no-faults",))
    try:
        wait_for_exit(demo.pid, timeout_s=240)
        time.sleep(15)  # anything pending has been evaluated and routed
        pages = [a for _, a in receiver.notifications if a["labels"].get("severity") == "page"]
        assert pages == []
        firing = query(options.prometheus_port, 'max_over_time(ALERTS{severity="page",alertstate="firing"}[10m])')
        assert firing == []
        # the stack did run: the job's metrics reached Prometheus
        assert query(options.prometheus_port, f"last_over_time({c.TRAIN_LOSS.prometheus_name}[10m])")
    finally:
        stack_down(options.directory)
