"""/metrics under slow and stalled clients: a normal scraper's latency and the server's threads.

    python benchmarks/metrics_slow_clients.py [--stalled 150] [--trickling 50] [--seconds 10] [--rate 20]

A real MetricsServer on 127.0.0.1 serves a store of about 250 series (rendered once per
change, as in a training process). A normal scraper (its own process, a new connection
per scrape as Prometheus does against a server that closes connections) scrapes at
``--rate`` per second for ``--seconds``, twice in the same run: alone, then while another
process holds ``--stalled`` clients that connect and send nothing plus ``--trickling``
clients that send their request a byte every 0.2 s, reconnecting whenever the server drops
them. Printed: the scraper's p50, p99 and max latency and failures, the server process's
thread count (most seen while the scraper ran) and, with the slow clients, how often the
server dropped one.

Target (issue 17): the server's threads stay bounded (a fixed pool, whatever the clients
do) and the normal scraper's p99 stays within 50 ms with the slow clients.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time

from prometheus_client import CollectorRegistry

from trainhealth._internal import catalog
from trainhealth._internal.identity import Identity
from trainhealth._internal.sinks.prometheus import MetricsServer, StoreCollector
from trainhealth._internal.store import MetricStore

SCRAPER = r"""
import http.client, sys, time
port, rate, seconds = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
latencies, failures, start = [], 0, time.perf_counter()
for i in range(int(rate * seconds)):
    time.sleep(max(0.0, start + i / rate - time.perf_counter()))
    begin = time.perf_counter()
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", "/metrics", headers={"Accept": "text/plain"})
        response = connection.getresponse()
        body = response.read()
        connection.close()
        if response.status != 200 or b"trainhealth_train_loss" not in body:
            raise RuntimeError(response.status)
        latencies.append(time.perf_counter() - begin)
    except Exception:
        failures += 1
print(failures, " ".join(f"{x:.6f}" for x in latencies), flush=True)
"""

SLOW_CLIENTS = r"""
import socket, sys, time
port, stalled, trickling = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
REQUEST = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 4000 + b"\r\n\r\n"

def connect():
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setblocking(False)
    return s

clients = [[connect(), 0, kind] for kind in ["stalled"] * stalled + ["trickling"] * trickling]
print("ready", flush=True)
dropped = 0
while True:  # until killed
    for client in clients:
        s, sent, kind = client
        gone = False
        try:
            gone = s.recv(65536) == b""
        except BlockingIOError:
            pass
        except OSError:
            gone = True
        if not gone and kind == "trickling":
            try:
                s.send(REQUEST[sent:sent + 1])
                client[1] = sent + 1
            except BlockingIOError:
                pass
            except OSError:
                gone = True
        if gone:
            dropped += 1
            s.close()
            client[0], client[1] = connect(), 0
    sys.stdout.write(f"{dropped}\n")
    sys.stdout.flush()
    time.sleep(0.2)
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def filled_store() -> MetricStore:
    store = MetricStore()
    store.set(catalog.TRAIN_LOSS, 2.5)
    store.set(catalog.TRAIN_GRAD_NORM, 1.25)
    for step in range(200):
        store.observe(catalog.TRAIN_STEP_DURATION, 0.1 + step * 1e-4)
    for layer in range(64):
        for spec in (catalog.TRAIN_LAYER_GRAD_NORM, catalog.TRAIN_LAYER_PARAM_NORM, catalog.TRAIN_LAYER_UPDATE_RATIO):
            store.set(spec, 0.01 * layer, (f"blocks.{layer}",))
    return store


def scrape_phase(port: int, rate: float, seconds: float) -> tuple[list[float], int, int]:
    """Run the scraper process; return its latencies, its failures and the most threads seen here meanwhile."""
    most_threads = threading.active_count()
    scraper = subprocess.Popen(
        [sys.executable, "-c", SCRAPER, str(port), str(rate), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    while scraper.poll() is None:
        most_threads = max(most_threads, threading.active_count())
        time.sleep(0.05)
    failures, _, rest = scraper.stdout.read().strip().partition(" ")  # type: ignore[union-attr]
    return [float(x) for x in rest.split()], int(failures), most_threads


def report(label: str, latencies: list[float], failures: int, threads: int) -> None:
    if latencies:
        p50, p99, worst = (percentile(latencies, 0.5), percentile(latencies, 0.99), max(latencies))
        figures = f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max {worst * 1000:.1f} ms"
    else:
        figures = "no scrape succeeded"
    print(f"{label}: {len(latencies)} scrapes, {failures} failed; {figures}; server threads {threads}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stalled", type=int, default=150, help="clients that connect and send nothing")
    parser.add_argument("--trickling", type=int, default=50, help="clients that send a byte every 0.2 s")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of scraping per phase")
    parser.add_argument("--rate", type=float, default=20.0, help="normal scrapes per second")
    args = parser.parse_args()

    store = filled_store()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, Identity("bench", "node-a", 0, 0, 1)))
    before = threading.active_count()
    server = MetricsServer(registry, addr="127.0.0.1", port=0, version=lambda: store.version)
    print(f"threads before the server {before}, with it idle {threading.active_count()}", flush=True)
    try:
        report("alone", *scrape_phase(server.port, args.rate, args.seconds))
        slow = subprocess.Popen(
            [sys.executable, "-c", SLOW_CLIENTS, str(server.port), str(args.stalled), str(args.trickling)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert slow.stdout is not None
            if slow.stdout.readline().strip() != "ready":
                raise SystemExit("the slow clients did not connect")
            time.sleep(1.0)  # every slow client is in the server's hands
            latencies, failures, threads = scrape_phase(server.port, args.rate, args.seconds)
        finally:
            slow.kill()
            lines = slow.stdout.read().split() if slow.stdout else []
            slow.wait()
        report(f"with {args.stalled} stalled + {args.trickling} trickling clients", latencies, failures, threads)
        print(f"slow clients dropped by the server and reconnected: {lines[-1] if lines else 0}", flush=True)
    finally:
        server.close()


if __name__ == "__main__":
    main()
