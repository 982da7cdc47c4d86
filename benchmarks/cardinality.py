"""Series per rank and per GPU: the cardinality budget of docs/scale.md, counted on real endpoints.

    python benchmarks/cardinality.py

Starts a training rank's Monitor (a TinyGPT with 2 layers, the collective logger,
the default detectors and model signals) and a node exporter with 8 simulated
GPUs, scrapes both /metrics endpoints over HTTP and counts the series by metric
family. The per-metric limit (``max_series_per_metric``, default 1000) caps
every family: label sets beyond it are dropped and counted in
``trainhealth_exporter_errors_total``.
"""

from __future__ import annotations

import urllib.request
from collections import Counter

import torch
from prometheus_client.parser import text_string_to_metric_families

from trainhealth._internal.config import Settings
from trainhealth._internal.demo.tiny_gpt import TinyGPT, synthetic_batch
from trainhealth._internal.events import EventLog
from trainhealth._internal.exporters.gpu.telemetry import GpuTelemetry
from trainhealth._internal.exporters.monitor import Monitor
from trainhealth._internal.identity import Identity
from trainhealth._internal.sinks.service import Sinks
from trainhealth._internal.store import MetricStore


def count(url: str) -> Counter:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    series: Counter = Counter()
    for family in text_string_to_metric_families(text):
        series[family.name] += len(family.samples)
    return series


def main() -> None:
    torch.manual_seed(0)
    model = TinyGPT(vocab=64, width=32, layers=2, heads=2, context=16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with Monitor(
        model,
        optimizer,
        prometheus_addr="127.0.0.1",
        prometheus_port=0,
        gpu_backend="off",
        comm=False,
        otel=False,
        stats_every=1,
        env={},
    ) as monitor:
        for step in range(30):
            loss = model.loss(synthetic_batch(64, 16, 4, seed=step))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            monitor.step(loss=loss, tokens=64, step=step)
        monitor.flush()
        rank = count(monitor.metrics_url)

    settings = Settings.resolve(
        env={},
        gpu_backend="simulated",
        simulated_gpus=8,
        gpus="all",
        otel=False,
        prometheus_addr="127.0.0.1",
        prometheus_port=0,
    )
    identity = Identity.node(settings=settings)
    store = MetricStore()
    sinks = Sinks.start(store, identity, settings)
    telemetry = GpuTelemetry.start(store, EventLog(logger=None), settings, identity, role="node")
    try:
        import time

        time.sleep(1.0)
        node = count(sinks.metrics_url)
    finally:
        if telemetry is not None:
            telemetry.close()
        sinks.close()

    gpu_families = {name: n for name, n in node.items() if name.startswith("trainhealth_gpu")}
    groups = rank.get("trainhealth_train_layer_grad_norm", 0)
    print(
        f"training rank (TinyGPT, 2 blocks, {groups} layer groups, model signals, no collectives): "
        f"{sum(rank.values())} series in {len(rank)} families"
    )
    for name, n in rank.most_common(8):
        print(f"  {name}: {n}")
    print(
        f"node exporter, 8 simulated GPUs: {sum(node.values())} series; GPU families "
        f"{sum(gpu_families.values())} = {sum(gpu_families.values()) / 8:.0f} per GPU"
    )
    for name, n in Counter(gpu_families).most_common(6):
        print(f"  {name}: {n}")


if __name__ == "__main__":
    main()
