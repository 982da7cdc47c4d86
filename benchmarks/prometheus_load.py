"""A real Prometheus scraping many trainhealth GPU exporters on 127.0.0.1: scrape duration, ingestion, memory.

    python benchmarks/prometheus_load.py                      # 256 endpoints x 8 simulated GPUs, ~3 minutes
    python benchmarks/prometheus_load.py --endpoints 64 --seconds 60

Each endpoint is what ``trainhealth export --backend simulated`` runs (a MetricStore,
the simulated NVML sampler with 8 GPUs and XID watcher, the /metrics server),
hosted 32 to a process so 256 of them fit on a laptop. Prometheus (the binary
on PATH) scrapes every endpoint every 5 s for ``--seconds``, then the script
reads its own metrics through the HTTP API: scrape duration (mean, p99), samples
per scrape, ingestion rate, head series, Prometheus's memory; and the exporter
processes' resident memory, per endpoint.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

PER_PROCESS = 32


def _serve(first_port: int, count: int, ready: multiprocessing.Queue, stop: multiprocessing.Event) -> None:
    from trainhealth._internal.config import Settings
    from trainhealth._internal.events import EventLog
    from trainhealth._internal.exporters.gpu.telemetry import GpuTelemetry
    from trainhealth._internal.identity import Identity
    from trainhealth._internal.sinks.service import Sinks
    from trainhealth._internal.store import MetricStore

    running = []
    for offset in range(count):
        port = first_port + offset
        settings = Settings.resolve(
            env={},
            gpu_backend="simulated",
            simulated_gpus=8,
            gpus="all",
            otel=False,
            prometheus_addr="127.0.0.1",
            prometheus_port=port,
            run_id="load-test",  # the job label: one run
            host=f"node-{port}",
            gpu_sample_interval=5.0,
        )
        identity = Identity.node(settings=settings)
        store = MetricStore(settings.store.max_series_per_metric)
        sinks = Sinks.start(store, identity, settings)
        running.append((sinks, GpuTelemetry.start(store, EventLog(logger=None), settings, identity, role="node")))
    ready.put(count)
    stop.wait()
    for sinks, telemetry in running:
        if telemetry is not None:
            telemetry.close()
        sinks.close()


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _query(port: int, promql: str) -> float:
    url = f"http://127.0.0.1:{port}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(url, timeout=30) as response:
        result = json.loads(response.read())["data"]["result"]
    return float(result[0]["value"][1]) if result else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoints", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=150.0, help="how long Prometheus scrapes (default 150)")
    parser.add_argument("--first-port", type=int, default=31000)
    parser.add_argument("--prometheus-port", type=int, default=30990)
    args = parser.parse_args()
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        sys.exit("prometheus_load: the prometheus binary is not on PATH")

    context = multiprocessing.get_context("spawn")
    ready, stop = context.Queue(), context.Event()
    workers = []
    for first in range(0, args.endpoints, PER_PROCESS):
        count = min(PER_PROCESS, args.endpoints - first)
        worker = context.Process(target=_serve, args=(args.first_port + first, count, ready, stop))
        worker.start()
        workers.append(worker)
    started = sum(ready.get(timeout=300) for _ in workers)
    print(f"{started} endpoints x 8 simulated GPUs in {len(workers)} processes", flush=True)

    with tempfile.TemporaryDirectory() as directory:
        targets = [f"127.0.0.1:{args.first_port + i}" for i in range(args.endpoints)]
        config = {
            "global": {"scrape_interval": "5s", "scrape_timeout": "4s", "evaluation_interval": "5s"},
            "scrape_configs": [
                {"job_name": "trainhealth-node", "honor_labels": True, "static_configs": [{"targets": targets}]},
                {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{args.prometheus_port}"]}]},
            ],
        }
        Path(directory, "prometheus.yml").write_text(json.dumps(config))
        server = subprocess.Popen(
            [
                prometheus,
                f"--config.file={directory}/prometheus.yml",
                f"--storage.tsdb.path={directory}/data",
                f"--web.listen-address=127.0.0.1:{args.prometheus_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(args.seconds)
            port = args.prometheus_port
            up = _query(port, 'sum(up{job="trainhealth-node"})')
            mean = _query(port, 'avg(avg_over_time(scrape_duration_seconds{job="trainhealth-node"}[1m]))')
            p99 = _query(port, 'quantile(0.99, max_over_time(scrape_duration_seconds{job="trainhealth-node"}[1m]))')
            samples = _query(port, 'avg(scrape_samples_scraped{job="trainhealth-node"})')
            ingestion = _query(port, "rate(prometheus_tsdb_head_samples_appended_total[1m])")
            series = _query(port, "prometheus_tsdb_head_series")
            prometheus_rss = _query(port, 'process_resident_memory_bytes{job="prometheus"}') / 2**20
            exporters = [_rss_mib(w.pid) for w in workers]
        finally:
            server.terminate()
            server.wait(timeout=30)
    stop.set()
    for worker in workers:
        worker.join(timeout=60)
    total = sum(exporters)
    print(f"targets up: {up:.0f} of {args.endpoints}")
    print(f"scrape duration: mean {mean * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms (interval 5 s)")
    print(f"samples per scrape: {samples:.0f} (8 GPUs: {samples / 8:.0f} per GPU)")
    print(f"ingestion: {ingestion:,.0f} samples/s; head series {series:,.0f}; Prometheus RSS {prometheus_rss:.0f} MiB")
    print(
        f"exporter memory: {total:.0f} MiB in {len(workers)} processes = {total / args.endpoints:.1f} MiB per "
        f"endpoint, {total / len(workers):.0f} MiB per process of {PER_PROCESS}"
    )
    print("per-process RSS (MiB): " + ", ".join(f"{r:.0f}" for r in exporters))


if __name__ == "__main__":
    main()
