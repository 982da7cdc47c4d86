"""GPU telemetry through the simulated backend (labelled as such), scraped over real HTTP.

The sampler, the XID watcher and the exporters run exactly as on hardware; only
the NVML library is replaced by the simulated backend, which answers the same
calls with pynvml's own structures and exceptions.
"""

from __future__ import annotations

import math
import time

import pytest

from tests.helpers import scrape
from trainhealth._internal import catalog
from trainhealth._internal.config import Settings
from trainhealth._internal.events import EventLog
from trainhealth._internal.exporters.gpu.sampler import GpuSampler
from trainhealth._internal.exporters.gpu.simulated import (
    SimulatedFault,
    SimulatedFaultKind,
    SimulatedNvml,
    SimulatedProfiler,
)
from trainhealth._internal.exporters.gpu.xid_watcher import XidWatcher
from trainhealth._internal.identity import Identity
from trainhealth._internal.sinks.service import Sinks
from trainhealth._internal.store import MetricStore

GPU_SPECS = [spec for spec in catalog.CATALOG if spec.labels[:2] == catalog.GPU_LABELS]
SAMPLER_SPECS = [spec for spec in catalog.CATALOG if spec.name.startswith("exporter.gpu")]


class Node:
    """A simulated node: backend, store, sampler (driven by hand), XID watcher and a /metrics endpoint."""

    def __init__(self, gpus: int = 8, **sim_options) -> None:
        self.sim = SimulatedNvml(gpus=gpus, **sim_options)
        self.store = MetricStore()
        self.events = EventLog(logger=None)
        self.sampler = GpuSampler(
            self.store, self.sim, backend="simulated", events=self.events, profiler=SimulatedProfiler(self.sim)
        )
        assert self.sampler.start(thread=False)
        self.watcher = XidWatcher(
            self.store, self.sim, self.sampler.gpus, backend="simulated", events=self.events, wait_ms=50
        )
        assert self.watcher.start()
        settings = Settings.resolve(env={}, prometheus_addr="127.0.0.1", prometheus_port=0, otel=False)
        self.sinks = Sinks.start(self.store, Identity.node({}, settings), settings, env={})

    def xid(self, gpu: int, xid: int, total: int) -> None:
        self.sim.inject(SimulatedFault(SimulatedFaultKind.XID, gpu=gpu, xid=xid))
        assert self.watcher.wait_for(total, timeout_s=10)

    def scrape(self):
        self.sampler.sample_once()
        got = scrape(self.sinks.metrics_url)
        assert got.status == 200
        return got

    def close(self) -> None:
        self.watcher.close()
        self.sampler.close()
        self.sinks.close()


@pytest.fixture
def node():
    node = Node()
    yield node
    node.close()


def gpu(index: int, **labels: str) -> dict[str, str]:
    return {"gpu": str(index), "backend": "simulated", **labels}


def test_every_gpu_metric_is_served_and_marked_simulated():
    node = Node(gpus=2, unsupported=())  # a GPU that supports every reading
    try:
        node.xid(0, 13, total=1)
        got = node.scrape()
        for spec in GPU_SPECS + SAMPLER_SPECS:
            assert got.labels_of(spec.prometheus_name), f"{spec.prometheus_name} was not served"
        for (name, labels), _ in got.samples().items():
            if name.startswith("trainhealth_gpu_"):
                assert dict(labels)["backend"] == "simulated", name
        (info, _) = sorted(got.labels_of("trainhealth_gpu_info"), key=lambda lab: lab["gpu"])
        assert info["model"].endswith("(simulated)") and info["uuid"].startswith("GPU-51a1a7ed")
        assert got.value("trainhealth_gpu_memory_total_bytes", **gpu(1)) == 81_559 * 2**20
        assert got.value("trainhealth_gpu_clock_max_hertz", **gpu(1, clock="sm")) == 1.98e9
        assert got.value("trainhealth_gpu_power_limit_watts", **gpu(0)) == 700.0
        assert 0 < got.value("trainhealth_gpu_utilization_ratio", **gpu(0)) <= 1
        assert len(got.labels_of("trainhealth_gpu_nvlink_up")) == 2 * 18
        assert got.value("trainhealth_gpu_fan_speed_ratio", **gpu(1)) == 0.45
        assert got.value("trainhealth_exporter_gpu_backend_up", backend="simulated") == 1
        assert got.labels_of("trainhealth_exporter_errors_total") == []
    finally:
        node.close()


def test_not_supported_readings_are_asked_once_and_stay_absent(node):
    for _ in range(5):
        got = node.scrape()
    assert node.sim.calls["nvmlDeviceGetFanSpeed"] == 8  # once per GPU, then remembered
    assert node.sim.calls["nvmlDeviceGetRetiredPages"] == 8
    assert node.sim.calls["nvmlDeviceGetTemperature"] == 8 * 6  # start + five passes
    assert got.labels_of("trainhealth_gpu_fan_speed_ratio") == []
    assert got.labels_of("trainhealth_gpu_retired_pages") == []
    assert got.labels_of("trainhealth_exporter_errors_total") == []


def test_energy_is_a_growing_counter(node):
    first = node.scrape().value("trainhealth_gpu_energy_joules_total", **gpu(0))
    time.sleep(0.05)
    assert node.scrape().value("trainhealth_gpu_energy_joules_total", **gpu(0)) > first


def test_xids_are_a_stream_with_meaning_and_action(node):
    for total in (1, 2, 3):
        node.xid(2, 13, total=total)
    node.xid(5, 48, total=4)
    got = node.scrape()
    assert got.value("trainhealth_gpu_xid_errors_total", **gpu(2, xid="13")) == 3  # repeats counted
    assert got.value("trainhealth_gpu_xid_errors_total", **gpu(5, xid="48")) == 1
    assert abs(got.value("trainhealth_gpu_xid_last_timestamp_seconds", **gpu(2, xid="13")) - time.time()) < 60
    events = node.events.recent("gpu.xid")
    assert [(e.attributes["gpu"], e.attributes["xid"]) for e in events] == [(2, 13), (2, 13), (2, 13), (5, 48)]
    assert events[0].attributes["meaning"] == "graphics engine exception"
    assert events[0].attributes["action"] == "restart the application (usually an application bug)"
    assert events[3].severity.value == "critical" and "reset the GPU or reboot" in events[3].attributes["action"]
    # a double-bit ECC error also shows in the memory-error counters
    assert (
        got.value("trainhealth_gpu_ecc_errors_total", **gpu(5, error_type="uncorrected", counter_type="volatile")) == 1
    )
    assert got.value("trainhealth_gpu_remapped_rows", **gpu(5, error_type="uncorrectable")) == 1


def test_a_gpu_that_falls_off_the_bus_keeps_its_series_and_recovers(node):
    before = node.scrape()
    assert before.value("trainhealth_gpu_up", **gpu(3)) == 1
    node.xid(3, 79, total=1)
    lost = node.scrape()
    assert lost.value("trainhealth_gpu_up", **gpu(3)) == 0
    assert lost.value("trainhealth_gpu_state", **gpu(3, state="lost")) == 1
    assert lost.value("trainhealth_gpu_state", **gpu(3, state="ok")) == 0
    assert math.isnan(lost.value("trainhealth_gpu_temperature_celsius", **gpu(3)))  # present, value unknown
    assert (
        lost.value("trainhealth_gpu_ecc_errors_total", **gpu(3, error_type="corrected", counter_type="aggregate")) == 0
    )
    assert lost.labels_of("trainhealth_gpu_info") == before.labels_of("trainhealth_gpu_info")
    for other in (0, 1, 2, 4, 5, 6, 7):  # the other GPUs keep being served
        assert lost.value("trainhealth_gpu_up", **gpu(other)) == 1
        assert not math.isnan(lost.value("trainhealth_gpu_temperature_celsius", **gpu(other)))
    node.sim.inject(SimulatedFault(SimulatedFaultKind.RECOVER, gpu=3))
    back = node.scrape()
    assert back.value("trainhealth_gpu_up", **gpu(3)) == 1
    assert back.value("trainhealth_gpu_state", **gpu(3, state="ok")) == 1
    assert not math.isnan(back.value("trainhealth_gpu_temperature_celsius", **gpu(3)))
    assert [e.name for e in node.events.recent() if e.name != "gpu.xid"] == ["gpu.down", "gpu.recovered"]


def test_an_uncontained_ecc_error_requires_a_reset(node):
    node.xid(1, 95, total=1)
    got = node.scrape()
    assert got.value("trainhealth_gpu_state", **gpu(1, state="reset_required")) == 1
    assert got.value("trainhealth_gpu_up", **gpu(1)) == 0
    node.sim.inject(SimulatedFault(SimulatedFaultKind.RECOVER, gpu=1))
    got = node.scrape()
    assert got.value("trainhealth_gpu_up", **gpu(1)) == 1
    # the reset cleared the volatile counter; the lifetime one keeps the error
    assert (
        got.value("trainhealth_gpu_ecc_errors_total", **gpu(1, error_type="uncorrected", counter_type="volatile")) == 0
    )
    assert (
        got.value("trainhealth_gpu_ecc_errors_total", **gpu(1, error_type="uncorrected", counter_type="aggregate")) == 1
    )


def test_the_recovery_action_the_driver_asks_for_is_an_event(node):
    node.xid(6, 154, total=1)
    got = node.scrape()
    assert got.value("trainhealth_gpu_recovery_action", **gpu(6)) == 1
    (event,) = node.events.recent("gpu.recovery_action")
    assert event.attributes["action"] == "reset the GPU" and event.attributes["gpu"] == 6


FAULTS = [
    (
        SimulatedFault(SimulatedFaultKind.THERMAL_THROTTLE, gpu=4),
        [
            ("trainhealth_gpu_clocks_event_active", gpu(4, reason="hw_thermal_slowdown"), lambda v: v == 1),
            ("trainhealth_gpu_clocks_event_active", gpu(4, reason="sw_thermal_slowdown"), lambda v: v == 1),
            ("trainhealth_gpu_temperature_celsius", gpu(4), lambda v: v >= 90),
            ("trainhealth_gpu_memory_temperature_celsius", gpu(4), lambda v: v >= 90),
            ("trainhealth_gpu_clock_hertz", gpu(4, clock="sm"), lambda v: v < 1.98e9 * 0.7),
        ],
    ),
    (
        SimulatedFault(SimulatedFaultKind.POWER_THROTTLE, gpu=4),
        [
            ("trainhealth_gpu_clocks_event_active", gpu(4, reason="sw_power_cap"), lambda v: v == 1),
            ("trainhealth_gpu_power_watts", gpu(4), lambda v: v >= 690),
        ],
    ),
    (
        SimulatedFault(SimulatedFaultKind.SLOW_CLOCKS, gpu=4, factor=0.5),
        [
            ("trainhealth_gpu_clock_hertz", gpu(4, clock="sm"), lambda v: v == 0.99e9),
            ("trainhealth_gpu_clocks_event_active", gpu(4, reason="hw_slowdown"), lambda v: v == 1),
        ],
    ),
    (
        SimulatedFault(SimulatedFaultKind.ECC_UNCORRECTABLE, gpu=4, count=2),
        [
            (
                "trainhealth_gpu_ecc_errors_total",
                gpu(4, error_type="uncorrected", counter_type="aggregate"),
                lambda v: v == 2,
            ),
        ],
    ),
    (
        SimulatedFault(SimulatedFaultKind.ECC_CORRECTABLE, gpu=4, count=7),
        [
            (
                "trainhealth_gpu_ecc_errors_total",
                gpu(4, error_type="corrected", counter_type="volatile"),
                lambda v: v == 7,
            ),
        ],
    ),
    (
        SimulatedFault(SimulatedFaultKind.ROW_REMAP_FAILURE, gpu=4),
        [
            ("trainhealth_gpu_row_remap_failure", gpu(4), lambda v: v == 1),
        ],
    ),
    (
        SimulatedFault(SimulatedFaultKind.PCIE_REPLAYS, gpu=4, count=12),
        [
            ("trainhealth_gpu_pcie_replays_total", gpu(4), lambda v: v == 12),
        ],
    ),
    (
        SimulatedFault(SimulatedFaultKind.NVLINK_CRC, gpu=4, link=7, count=5),
        [
            ("trainhealth_gpu_nvlink_errors_total", gpu(4, link="7", error_type="crc_flit"), lambda v: v == 5),
            ("trainhealth_gpu_nvlink_errors_total", gpu(4, link="6", error_type="crc_flit"), lambda v: v == 0),
        ],
    ),
    (
        SimulatedFault(SimulatedFaultKind.NVLINK_DOWN, gpu=4, link=2),
        [
            ("trainhealth_gpu_nvlink_up", gpu(4, link="2"), lambda v: v == 0),
            ("trainhealth_gpu_nvlink_up", gpu(4, link="3"), lambda v: v == 1),
        ],
    ),
    (
        SimulatedFault(SimulatedFaultKind.GPU_LOST, gpu=4),
        [
            ("trainhealth_gpu_up", gpu(4), lambda v: v == 0),
            ("trainhealth_gpu_state", gpu(4, state="lost"), lambda v: v == 1),
        ],
    ),
    (
        SimulatedFault(SimulatedFaultKind.RESET_REQUIRED, gpu=4),
        [
            ("trainhealth_gpu_state", gpu(4, state="reset_required"), lambda v: v == 1),
        ],
    ),
    (
        SimulatedFault(SimulatedFaultKind.XID, gpu=4, xid=64),
        [
            ("trainhealth_gpu_row_remap_failure", gpu(4), lambda v: v == 1),
        ],
    ),
    (
        SimulatedFault(SimulatedFaultKind.XID, gpu=4, xid=63),
        [
            ("trainhealth_gpu_remapped_rows", gpu(4, error_type="correctable"), lambda v: v == 1),
            ("trainhealth_gpu_row_remap_pending", gpu(4), lambda v: v == 1),
        ],
    ),
    (
        SimulatedFault(SimulatedFaultKind.XID, gpu=4, xid=94),
        [
            (
                "trainhealth_gpu_ecc_errors_total",
                gpu(4, error_type="uncorrected", counter_type="volatile"),
                lambda v: v == 1,
            ),
            ("trainhealth_gpu_up", gpu(4), lambda v: v == 1),
        ],
    ),
    (
        SimulatedFault(SimulatedFaultKind.XID, gpu=4, xid=74),
        [
            ("trainhealth_gpu_nvlink_errors_total", gpu(4, link="0", error_type="replay"), lambda v: v == 1),
        ],
    ),
]


def _fault_id(value: object) -> str:
    if isinstance(value, SimulatedFault):
        return value.kind.value + (f"-{value.xid}" if value.xid else "")
    return ""


@pytest.mark.parametrize("fault, checks", FAULTS, ids=_fault_id)
def test_each_scripted_fault_shows_in_the_scrape(node, fault, checks):
    healthy = node.scrape()
    node.sim.inject(fault)
    if fault.kind is SimulatedFaultKind.XID:
        assert node.watcher.wait_for(1, timeout_s=10)
    got = node.scrape()
    for name, labels, holds in checks:
        value = got.value(name, **labels)
        assert holds(value), f"{name}{labels} = {value}"
    # the fault touched GPU 4 only (sensor readings are noisy, so compare the discrete ones)
    for name, labels, _ in checks:
        if not name.endswith(("_celsius", "_watts")):
            other = dict(labels, gpu="5")
            assert got.value(name, **other) == healthy.value(name, **other)


@pytest.mark.parametrize(
    "kind", [SimulatedFaultKind.THERMAL_THROTTLE, SimulatedFaultKind.POWER_THROTTLE, SimulatedFaultKind.SLOW_CLOCKS]
)
def test_a_condition_that_ends_restores_the_clocks(node, kind):
    node.sim.inject(SimulatedFault(kind, gpu=0))
    assert node.scrape().value("trainhealth_gpu_clock_hertz", **gpu(0, clock="sm")) < 1.98e9
    node.sim.inject(SimulatedFault(kind, gpu=0, active=False))
    cleared = node.scrape()
    assert cleared.value("trainhealth_gpu_clock_hertz", **gpu(0, clock="sm")) == 1.98e9
    assert (
        sum(
            cleared.value("trainhealth_gpu_clocks_event_active", **gpu(0, reason=reason))
            for reason in ("hw_thermal_slowdown", "sw_thermal_slowdown", "sw_power_cap", "hw_slowdown")
        )
        == 0
    )


def test_the_sampler_thread_samples_on_its_own():
    sim, store = SimulatedNvml(gpus=1), MetricStore()
    sampler = GpuSampler(store, sim, backend="simulated", interval_s=0.05)
    sampler.start()
    try:
        first = store.value(catalog.EXPORTER_GPU_SAMPLE_TIMESTAMP, ("simulated",))
        deadline = time.monotonic() + 10
        while store.value(catalog.EXPORTER_GPU_SAMPLE_TIMESTAMP, ("simulated",)) == first:
            assert time.monotonic() < deadline, "the sampler thread never sampled again"
            time.sleep(0.01)
        assert store.value(catalog.EXPORTER_GPU_SAMPLE_DURATION, ("simulated",)) < 1.0
    finally:
        sampler.close()
