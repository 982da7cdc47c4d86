"""GPU exporter costs on 8 simulated GPUs: sampling CPU, /metrics latency, memory over time.

    python benchmarks/gpu_exporter.py [--passes 10000] [--seconds 30]

Targets (issue 3): one sampling pass over 8 GPUs <= 5 ms CPU; /metrics p99 <= 10 ms
under 50 scrapes/s from a real HTTP client; memory flat over 10,000 passes.

The simulated backend answers the same pynvml calls the real path makes, so the
sampler's own work is measured; on hardware, NVML's calls add their driver time
(nvmlDeviceGetPcieThroughput alone samples for 20 ms per direction).
The HTTP client runs in a separate process, keeping connections alive as
Prometheus does. Scrapes are measured twice: with the default 5 s sampling
interval, and with the store changing before nearly every scrape (sampling
every 20 ms), which defeats the rendering cache and shows the worst case.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import subprocess
import sys
import time
import tracemalloc

from trainhealth._internal.config import Settings
from trainhealth._internal.events import EventLog
from trainhealth._internal.exporters.gpu.sampler import GpuSampler
from trainhealth._internal.exporters.gpu.simulated import (
    SimulatedFault,
    SimulatedFaultKind,
    SimulatedNvml,
    SimulatedProfiler,
)
from trainhealth._internal.exporters.gpu.telemetry import GpuTelemetry
from trainhealth._internal.exporters.gpu.xid_watcher import XidWatcher
from trainhealth._internal.identity import Identity
from trainhealth._internal.sinks.service import Sinks
from trainhealth._internal.store import MetricStore

CLIENT = r"""
import http.client, sys, time, urllib.parse
url, rate, seconds = urllib.parse.urlsplit(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
latencies, start = [], time.perf_counter()
for i in range(int(rate * seconds)):
    time.sleep(max(0.0, start + i / rate - time.perf_counter()))
    begin = time.perf_counter()
    connection.request("GET", url.path, headers={"Accept": "text/plain"})
    response = connection.getresponse()
    body = response.read()
    latencies.append(time.perf_counter() - begin)
    assert response.status == 200 and body
print(" ".join(f"{x:.6f}" for x in latencies))
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def sampling_cpu(passes: int) -> list[float]:
    store, sim = MetricStore(), SimulatedNvml(gpus=8)
    sampler = GpuSampler(store, sim, backend="simulated", profiler=SimulatedProfiler(sim))
    sampler.start(thread=False)
    times = []
    for _ in range(passes):
        begin = time.thread_time()
        sampler.sample_once()
        times.append(time.thread_time() - begin)
    sampler.close()
    return times


def scrape_latencies(interval_s: float, rate: float, seconds: float) -> tuple[list[float], int]:
    settings = Settings.resolve(
        env={},
        gpu_backend="simulated",
        gpu_sample_interval=interval_s,
        dcgm=True,
        prometheus_addr="127.0.0.1",
        prometheus_port=0,
        otel=False,
    )
    store, identity = MetricStore(), Identity.node({}, settings)
    sinks = Sinks.start(store, identity, settings, env={})
    telemetry = GpuTelemetry.start(store, EventLog(logger=None), settings, identity, role="node", env={})
    try:
        result = subprocess.run(
            [sys.executable, "-c", CLIENT, sinks.metrics_url, str(rate), str(seconds)],
            capture_output=True,
            text=True,
            check=True,
        )
        series = sum(len(family.samples) for family in store.snapshot())
    finally:
        telemetry.close()
        sinks.close()
    return [float(x) for x in result.stdout.split()], series


def memory_growth(passes: int) -> list[tuple[int, float, float]]:
    """(passes done, traced heap MB, RSS MB) after 10%, 50% and 100% of the passes, with faults and XIDs throughout."""
    store, sim, events = MetricStore(), SimulatedNvml(gpus=8), EventLog(logger=None)
    sampler = GpuSampler(store, sim, backend="simulated", events=events, profiler=SimulatedProfiler(sim))
    sampler.start(thread=False)
    watcher = XidWatcher(store, sim, sampler.gpus, backend="simulated", events=events, on_xid=lambda *_: None)
    watcher.start()
    chooser = random.Random(0)
    kinds = [
        SimulatedFaultKind.THERMAL_THROTTLE,
        SimulatedFaultKind.POWER_THROTTLE,
        SimulatedFaultKind.SLOW_CLOCKS,
        SimulatedFaultKind.PCIE_REPLAYS,
        SimulatedFaultKind.NVLINK_CRC,
        SimulatedFaultKind.ECC_CORRECTABLE,
        SimulatedFaultKind.GPU_LOST,
        SimulatedFaultKind.RECOVER,
    ]
    tracemalloc.start()
    marks = []
    for index in range(passes):
        if index % 5 == 0:  # 2,000 faults and XIDs in 10,000 passes: the event log (1,000) fills up
            gpu = chooser.randrange(8)
            kind = chooser.choice(kinds)
            sim.inject(SimulatedFault(kind, gpu=gpu, link=chooser.randrange(18), active=chooser.random() < 0.5))
            sim.inject(SimulatedFault(SimulatedFaultKind.XID, gpu=gpu, xid=chooser.choice([13, 31, 43, 63, 94])))
        sampler.sample_once()
        if index + 1 in (passes // 10, passes // 2, passes):
            gc.collect()
            marks.append((index + 1, tracemalloc.get_traced_memory()[0] / 1e6, _rss() / 1e6))
    tracemalloc.stop()
    watcher.close()
    sampler.close()
    return marks


def _rss() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return float(line.split()[1]) * 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each scrape phase")
    parser.add_argument("--rate", type=float, default=50.0, help="scrapes per second")
    args = parser.parse_args()

    cpu = sampling_cpu(1000)
    print(
        f"sampling pass, 8 simulated GPUs (1000 passes): CPU median {statistics.median(cpu) * 1e3:.2f} ms, "
        f"p99 {percentile(cpu, 0.99) * 1e3:.2f} ms, max {max(cpu) * 1e3:.2f} ms"
    )

    for label, interval in (("default 5 s sampling", 5.0), ("sampling every 20 ms (cache defeated)", 0.02)):
        latencies, series = scrape_latencies(interval, args.rate, args.seconds)
        print(
            f"/metrics, {series} series, {args.rate:g} scrapes/s for {args.seconds:g} s, {label}: "
            f"{len(latencies)} scrapes, p50 {percentile(latencies, 0.5) * 1e3:.2f} ms, "
            f"p99 {percentile(latencies, 0.99) * 1e3:.2f} ms, max {max(latencies) * 1e3:.2f} ms"
        )

    marks = memory_growth(args.passes)
    print(
        f"memory over {args.passes} passes with faults throughout (traced heap of the sampler and store, process RSS):"
    )
    for done, heap, rss in marks:
        print(f"  after {done:>6} passes: heap {heap:.3f} MB, RSS {rss:.1f} MB")


if __name__ == "__main__":
    main()
