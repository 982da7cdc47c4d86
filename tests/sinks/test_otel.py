"""OTLP/HTTP export received by a real HTTP server on 127.0.0.1 and decoded from protobuf."""

from __future__ import annotations

import math
import socket
import threading
import time

import pytest
import torch

from tests.helpers import BATCH, SEQ, TinyGPT, lm_loss, scrape
from tests.otlp import OtlpReceiver, attributes
from trainhealth import Monitor
from trainhealth._internal import catalog
from trainhealth._internal.config import Settings
from trainhealth._internal.exporters.gpu.sampler import GpuSampler
from trainhealth._internal.exporters.gpu.simulated import SimulatedFault, SimulatedFaultKind, SimulatedNvml
from trainhealth._internal.identity import Identity
from trainhealth._internal.sinks.service import Sinks
from trainhealth._internal.store import MetricStore


@pytest.fixture
def receiver(monkeypatch):
    receiver = OtlpReceiver()
    # the OpenTelemetry SDK reads these itself, from the process environment
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "600000")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "pretrain-7b")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
    yield receiver
    receiver.close()


def test_otlp_export_carries_the_same_values_as_the_scrape(receiver):
    torch.manual_seed(0)
    model = TinyGPT()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    env = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "TORCHELASTIC_RUN_ID": "run-9",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
    }
    steps = 5
    mon = Monitor(model, optimizer, env=env, prometheus_addr="127.0.0.1", prometheus_port=0)
    assert mon.settings.otel.active(env)
    for step in range(steps):
        loss = lm_loss(model, step)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        mon.step(loss=loss, tokens=BATCH * SEQ)
    mon.flush()
    scraped = scrape(mon.metrics_url)
    mon.close()  # pushes the final export

    assert receiver.requests, "no OTLP request arrived"
    resource = attributes(receiver.requests[-1].resource_metrics[0].resource.attributes)
    assert resource["service.name"] == "pretrain-7b"
    assert resource["deployment.environment"] == "test"
    assert resource["trainhealth.rank"] == 3 and resource["trainhealth.job"] == "run-9"

    (loss_point,) = receiver.last_points(catalog.TRAIN_LOSS.otel_name)
    assert loss_point.as_double == scraped.value("trainhealth_train_loss") == pytest.approx(mon.latest.loss)
    (norm_point,) = receiver.last_points(catalog.TRAIN_GRAD_NORM.otel_name)
    assert norm_point.as_double == scraped.value("trainhealth_train_grad_norm")
    (steps_point,) = receiver.last_points(catalog.TRAIN_STEPS.otel_name)
    assert steps_point.as_double == steps == scraped.value("trainhealth_train_steps_total")
    (tokens_point,) = receiver.last_points(catalog.TRAIN_TOKENS.otel_name)
    assert tokens_point.as_double == steps * BATCH * SEQ

    (histogram,) = receiver.last_points(catalog.TRAIN_STEP_DURATION.otel_name)
    assert list(histogram.explicit_bounds) == list(catalog.TRAIN_STEP_DURATION.buckets)
    assert histogram.count == steps - 1 == scraped.value("trainhealth_train_step_duration_seconds_count")
    assert histogram.sum == pytest.approx(scraped.value("trainhealth_train_step_duration_seconds_sum"))

    lr_points = receiver.last_points(catalog.TRAIN_LEARNING_RATE.otel_name)
    assert [(attributes(p.attributes), p.as_double) for p in lr_points] == [({"param_group": "0"}, 0.05)]

    (rank_info,) = receiver.last_points("trainhealth.rank.info")  # named so that translation adds nothing
    assert attributes(rank_info.attributes)["world_size"] == "4" and rank_info.as_double == 1
    assert receiver.last_metric(catalog.TRAIN_LOSS.otel_name).unit == ""  # not a ratio: no unit "1"


def _by_hw_id(points) -> dict[str, tuple[dict, float]]:
    out = {}
    for point in points:
        attrs = attributes(point.attributes)
        out[attrs["hw.id"]] = (attrs, point.as_double)
    return out


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def test_gpu_metrics_go_out_under_the_hardware_semantic_conventions(receiver):
    """Two simulated GPUs, one fallen off the bus: the OTLP request against the /metrics scrape of the same store."""
    sim, store = SimulatedNvml(gpus=2), MetricStore()
    sampler = GpuSampler(store, sim, backend="simulated")
    assert sampler.start(thread=False)
    sim.inject(SimulatedFault(SimulatedFaultKind.XID, gpu=1, xid=79))
    sampler.sample_once()
    settings = Settings.resolve(env={}, prometheus_addr="127.0.0.1", prometheus_port=0, otel=True)
    sinks = Sinks.start(store, Identity("job-a", "node-x", 0, 0, 1), settings, env={})
    try:
        scraped = scrape(sinks.metrics_url)
    finally:
        sinks.close()  # pushes the export the receiver decodes
        sampler.close()

    names = receiver.metric_names()
    assert {
        "hw.gpu.utilization",
        "hw.gpu.memory.usage",
        "hw.gpu.memory.limit",
        "hw.status",
        "hw.power",
        "hw.energy",
        "hw.errors",
        "hw.temperature",
    } <= names
    assert not {"trainhealth.gpu.utilization", "trainhealth.gpu.state", "trainhealth.gpu.power"} & names
    assert "trainhealth.gpu.clock" in names  # no convention: trainhealth's own name

    def prom(name: str, gpu: int, **labels: str) -> float:
        return scraped.value(name, gpu=str(gpu), backend="simulated", **labels)

    utilization = _by_hw_id(receiver.last_points("hw.gpu.utilization"))
    attrs, value = utilization["gpu0"]
    assert attrs == {"hw.id": "gpu0", "hw.type": "gpu", "hw.gpu.task": "general", "trainhealth.backend": "simulated"}
    assert 0 <= value <= 1 and value == prom("trainhealth_gpu_utilization_ratio", 0)  # a ratio, as on /metrics
    # the lost GPU's gauges are NaN on /metrics; the SDK drops non-finite values, hw.status says why
    assert "gpu1" not in utilization and math.isnan(prom("trainhealth_gpu_utilization_ratio", 1))
    assert receiver.last_metric("hw.gpu.utilization").unit == "1"

    for otel_name, prometheus_name in (
        ("hw.gpu.memory.usage", "trainhealth_gpu_memory_used_bytes"),
        ("hw.gpu.memory.limit", "trainhealth_gpu_memory_total_bytes"),
        ("hw.power", "trainhealth_gpu_power_watts"),
    ):
        metric = receiver.last_metric(otel_name)
        if otel_name.startswith("hw.gpu.memory"):  # UpDownCounters: non-monotonic sums
            assert metric.WhichOneof("data") == "sum" and not metric.sum.is_monotonic
        assert _same(_by_hw_id(receiver.last_points(otel_name))["gpu0"][1], prom(prometheus_name, 0))
    assert receiver.last_metric("hw.gpu.memory.usage").unit == "By"
    assert receiver.last_metric("hw.gpu.memory.usage").description == "GPU memory used."

    energy = receiver.last_metric("hw.energy")
    assert energy.sum.is_monotonic and energy.unit == "J"
    assert _by_hw_id(energy.sum.data_points)["gpu0"][1] == prom("trainhealth_gpu_energy_joules_total", 0)

    # hw.status is a state set: one point per GPU and state, 1 for the GPU's state
    status = {}
    for point in receiver.last_points("hw.status"):
        attrs = attributes(point.attributes)
        assert attrs["hw.type"] == "gpu"
        status[(attrs["hw.id"], attrs["hw.state"])] = point.as_double
    assert status == {
        ("gpu0", "ok"): 1,
        ("gpu0", "degraded"): 0,
        ("gpu0", "failed"): 0,
        ("gpu1", "ok"): 0,
        ("gpu1", "degraded"): 0,
        ("gpu1", "failed"): 1,
    }
    assert prom("trainhealth_gpu_state", 1, state="lost") == 1 and prom("trainhealth_gpu_state", 0, state="ok") == 1

    # the die and memory sensors of each GPU share hw.temperature, told apart by hw.id
    temperature = _by_hw_id(receiver.last_points("hw.temperature"))
    die, memory = temperature["gpu0_die_temperature"], temperature["gpu0_memory_temperature"]
    assert die[0]["hw.parent"] == "gpu0" and die[0]["hw.sensor_location"] == "GPU_DIE"
    assert die[1] == prom("trainhealth_gpu_temperature_celsius", 0)
    assert memory[1] == prom("trainhealth_gpu_memory_temperature_celsius", 0)
    assert "gpu1_die_temperature" not in temperature and "gpu1_memory_temperature" not in temperature

    errors = [attributes(p.attributes) | {"value": p.as_double} for p in receiver.last_points("hw.errors")]
    assert {e["error.type"] for e in errors} == {"corrected", "uncorrected"}
    for e in errors:
        assert e["value"] == prom(
            "trainhealth_gpu_ecc_errors_total",
            int(e["hw.id"][3:]),
            error_type=e["error.type"],
            counter_type=e["trainhealth.counter_type"],
        )
    assert len(errors) == len(
        [line for line in scraped.text.splitlines() if line.startswith("trainhealth_gpu_ecc_errors_total{")]
    )


def test_failed_exports_are_counted(monkeypatch):
    closed = OtlpReceiver()
    endpoint = closed.endpoint
    closed.close()  # nothing listens there any more
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    mon = Monitor(torch.nn.Linear(2, 1), env={}, otel=True, prometheus=False)
    mon.step(loss=1.0)
    mon.close()
    assert mon.store.value(catalog.EXPORTER_ERRORS, ("otel",)) >= 1


def _closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (connections are refused at once)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class _SilentServer:
    """Accepts connections on 127.0.0.1 and never answers (holds them open)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.held.append(self.listener.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.listener.close()
        for connection in self.held:
            connection.close()


@pytest.mark.parametrize("endpoint", ["refused", "silent"])
def test_close_returns_in_bounded_time_whatever_the_otlp_endpoint_does(monkeypatch, endpoint):
    silent = _SilentServer() if endpoint == "silent" else None
    port = silent.port if silent is not None else _closed_port()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "600000")  # only the push at close
    try:
        model = torch.nn.Linear(2, 1)
        mon = Monitor(
            model, torch.optim.SGD(model.parameters(), lr=0.1), env={}, otel=True, prometheus=False, gpu_backend="off"
        )
        for _ in range(3):
            model(torch.ones(1, 2)).sum().backward()
            mon.step(loss=1.0)
        began = time.monotonic()
        mon.close()
        took = time.monotonic() - began
        print(f"Monitor.close() with an OTLP endpoint that is {endpoint}: {took:.2f} s")
        assert took < 5  # otel_close_timeout is 1.5 s; generous for a loaded machine
        assert mon.store.value(catalog.EXPORTER_ERRORS, ("otel",)) >= 1  # the lost push is counted
        assert mon.store.value(catalog.TRAIN_STEPS) == 3  # and everything else was recorded
    finally:
        if silent is not None:
            silent.close()


def test_the_close_timeout_is_a_setting(monkeypatch):
    silent = _SilentServer()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{silent.port}")
    try:
        mon = Monitor(
            torch.nn.Linear(2, 1), env={}, otel=True, prometheus=False, gpu_backend="off", otel_close_timeout=0.2
        )
        mon.step(loss=1.0)
        began = time.monotonic()
        mon.close()
        assert time.monotonic() - began < 3
        assert mon.store.value(catalog.EXPORTER_ERRORS, ("otel",)) >= 1
    finally:
        silent.close()
