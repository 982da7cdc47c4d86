"""What the end-to-end tests of ``trainhealth stack up`` share: free ports, the webhook that receives
Alertmanager's notifications, a recorded dcgm-exporter served on 127.0.0.1, queries, and the checks that the
demo's metrics and every dashboard query have data in whatever answers the Prometheus API."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from trainhealth._internal import catalog as c
from trainhealth._internal._ports import free_port
from trainhealth._internal.alerts.rules import ALERTS
from trainhealth._internal.dashboards.render import build_dashboards, panels
from trainhealth._internal.errors import UsageError
from trainhealth._internal.stack.runner import StackOptions, Started, find_binary
from trainhealth._internal.stack.topology import config_names, needed_binaries

DCGM_SAMPLE = Path(__file__).resolve().parents[1] / "fixtures/dcgm-exporter/gpu-operator-v25.10.0-rtx4000ada.prom"
#: Panels whose queries compare with a baseline hours back (ThroughputDrop, ThroughputDegraded): a run of
#: minutes has none, so they must run without error and may be empty.
NEEDS_HOURS_OF_HISTORY = {"Throughput against its baseline"}
#: panels that draw only what went wrong, and the demo injects no such fault (the recording they read is
#: checked by its alert's promtool test, tests/alerts/test_rules.py)
SHOWS_ONLY_FAULTS = {"NVLink errors per minute"}
#: dcgm-exporter fields the recorded page lacks (not in its default counters; no NVLink on that GPU).
NOT_IN_DCGM_SAMPLE = {"DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES"}


def require_binaries(options: StackOptions | None = None) -> None:
    try:
        for name in needed_binaries(options or StackOptions()):
            find_binary(name)
    except UsageError as exc:
        if os.environ.get("TRAINHEALTH_REQUIRE_BINARIES"):
            pytest.fail(str(exc))
        pytest.skip(str(exc))


def free_ports(count: int) -> list[int]:
    return [free_port() for _ in range(count)]


def consecutive_free(count: int) -> int:
    for base in range(21450, 30000, 17):
        try:
            probes = []
            for offset in range(count):
                probe = socket.socket()
                probe.bind(("127.0.0.1", base + offset))
                probes.append(probe)
            for probe in probes:
                probe.close()
            return base
        except OSError:
            for probe in probes:
                probe.close()
    raise RuntimeError("no free ports")


class Receiver:
    """Alertmanager's webhook: every alert notification, with the time it arrived."""

    def __init__(self) -> None:
        self.notifications: list[tuple[float, dict]] = []
        received = self.notifications

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                for alert in body["alerts"]:
                    received.append((time.time(), dict(alert, receiver=body["receiver"])))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def firing(self, alertname: str) -> list[tuple[float, dict]]:
        return [
            (t, a) for t, a in self.notifications if a["labels"]["alertname"] == alertname and a["status"] == "firing"
        ]


class RecordedExporter:
    """dcgm-exporter's /metrics as recorded, on 127.0.0.1: what a real one would answer, labels included."""

    def __init__(self, page: bytes) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                if self.path == "/metrics":
                    self.wfile.write(page)

            def log_message(self, *args) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class RulerWatch:
    """Every second, the alerts a ruler's ``/api/v1/alerts`` shows firing (Prometheus and vmalert both serve it):
    each one's annotations by its labels, numbers masked (the two evaluate at different instants, so the values
    they quote differ), and when it was first seen."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/api/v1/alerts"
        self.annotations: dict[frozenset, dict[str, str]] = {}
        self.first_seen: dict[frozenset, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            try:
                with urllib.request.urlopen(self.url, timeout=5) as response:
                    alerts = json.loads(response.read())["data"]["alerts"] or []  # vmalert: null when none
            except OSError:
                continue  # not up yet, or already stopped
            for alert in alerts:
                if alert["state"] == "firing":
                    labels = frozenset(alert["labels"].items())
                    self.first_seen.setdefault(labels, time.time())
                    self.annotations[labels] = {
                        name: re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", text)
                        for name, text in alert["annotations"].items()
                    }

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def scrape_recorded_dcgm(options: StackOptions, started: Sequence[Started], port: int, query_port: int) -> None:
    """Add the recorded exporter to every scraper of the stack (its config, then SIGHUP: Prometheus reloads; a
    shard keeps it only if it hashes there) and wait until ``query_port`` answers for it."""
    scrapers = [name for name in config_names(options) if name.startswith(("prometheus", "shard-"))]
    for name in scrapers:
        path = options.directory / name
        config = yaml.safe_load(path.read_text())
        job = {"job_name": "dcgm-exporter", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
        relabel = config["scrape_configs"][0].get("relabel_configs")
        config["scrape_configs"].append({**job, **({"relabel_configs": relabel} if relabel else {})})
        path.write_text(yaml.safe_dump(config, sort_keys=False))
    processes = [s for s in started if f"{s.name}.yml" in scrapers]
    deadline = time.monotonic() + 90
    reloaded = 0.0
    while time.monotonic() < deadline:
        try:  # SIGHUP only once Prometheus is ready: before its handler is installed, SIGHUP would stop it
            ready = all(_ready(options.prometheus_port + n) for n in range(len(processes)))
            if ready and time.monotonic() - reloaded > 15:
                for process in processes:
                    os.kill(process.pid, signal.SIGHUP)
                reloaded = time.monotonic()
            if query(query_port, 'up{job="dcgm-exporter"} == 1'):
                return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError("the recorded dcgm-exporter page never reached the store")


def _ready(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=5) as response:
        return response.status == 200


def query(port: int, promql: str, start: float | None = None, end: float | None = None) -> list[dict]:
    params = {"query": promql}
    path = "query"
    if start is not None:
        path, params = "query_range", {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "2"}
    url = f"http://127.0.0.1:{port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())["data"]["result"]


def all_series(port: int, start: float) -> set[frozenset[tuple[str, str]]]:
    """Every series ``port`` (Prometheus or the store) has held since ``start``: each as its labels, name included."""
    params = urllib.parse.urlencode({"match[]": '{__name__=~".+"}', "start": f"{start:.3f}"})
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/series?{params}", timeout=30) as response:
        return {frozenset(labels.items()) for labels in json.loads(response.read())["data"]}


def wait_for_exit(pid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        if not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z":
            return
        time.sleep(1)
    raise TimeoutError(f"the demo (pid {pid}) still runs after {timeout_s} s")


def injections(out: Path) -> dict[str, tuple[float, dict]]:
    first: dict[str, tuple[float, dict]] = {}
    for line in (out / "faults.jsonl").read_text().splitlines():
        entry = json.loads(line)
        key = entry.get("fault") or entry["kind"]
        if key not in first or entry["time"] < first[key][0]:
            first[key] = (entry["time"], entry)
    return first


DEMO_METRICS = (
    c.TRAIN_LOSS,
    c.TRAIN_GRAD_NORM,
    c.TRAIN_THROUGHPUT,
    c.TRAIN_MFU,
    c.TRAIN_LEARNING_RATE,
    c.TRAIN_UPDATE_RATIO,
    c.TRAIN_LAST_STEP_DURATION,
    c.TRAIN_GOODPUT,
    c.CHECKPOINT_LAST_STEP,
    c.COMM_OPS,
    c.COMM_STARTED_SEQ,
    c.ANOMALIES,
    c.TRAIN_IRREGULARITY,
    c.GPU_UP,
    c.GPU_TEMPERATURE,
    c.GPU_CLOCKS_EVENT_ACTIVE,
    c.GPU_XID_ERRORS,
    c.SDC_SUSPECT,
    c.TRAIN_LOCAL_GRAD_NORM,
    c.MODEL_ATTENTION_MAX_LOGIT,
    c.MODEL_ATTENTION_ENTROPY,
    c.MODEL_OUTPUT_LOG_Z,
    c.SUSPECT_SCORE,
    c.ANALYSIS_VERDICT,
    c.RANK_INFO,
)


def assert_metrics_present(port: int) -> None:
    missing = []
    for spec in DEMO_METRICS:
        name = spec.prometheus_name + ("_count" if spec.kind is c.MetricKind.HISTOGRAM else "")
        if not query(port, f"last_over_time({name}[15m])"):
            missing.append(name)
    assert missing == [], missing


def substitute(expr: str) -> str:
    """The dashboard's variables as Grafana sends them with All selected (``allValue`` .*)."""
    for variable in ("job", "host", "rank", "gpu"):
        expr = expr.replace(f"${{{variable}}}", ".*").replace(f"${variable}", ".*")
    assert "$" not in expr, expr
    return expr


def assert_every_panel_has_data(port: int, start: float, end: float) -> None:
    empty, dcgm_checked, ran = [], set(), 0
    for uid, dashboard in build_dashboards(ALERTS).items():
        for panel in panels(dashboard):
            exprs = [substitute(t["expr"]) for t in panel.get("targets", []) if t.get("expr")]
            if not exprs:
                continue  # text panels and rows
            results = [query(port, expr, start, end) for expr in exprs]  # an invalid query raises here
            ran += len(exprs)
            if not any(results) and panel["title"] not in NEEDS_HOURS_OF_HISTORY | SHOWS_ONLY_FAULTS:
                empty.append(f"{uid}: {panel['title']}")
            for expr in exprs:  # each dcgm selector matches the recorded exporter's series
                for selector in re.findall(r"\bDCGM_FI_\w+\{[^}]*\}", expr):
                    metric = selector.split("{")[0]
                    if metric not in NOT_IN_DCGM_SAMPLE:
                        assert query(port, selector, start, end), f"{uid}: {panel['title']}: {selector}"
                        dcgm_checked.add(metric)
    assert empty == [], empty
    assert ran > 60 and len(dcgm_checked) >= 11, (ran, dcgm_checked)
