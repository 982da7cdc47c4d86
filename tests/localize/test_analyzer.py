"""``trainhealth analyze``: over trace files, and over a real Prometheus scraping real gloo ranks."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
import torch
import torch.distributed as dist

from tests.distributed import init_rank, join, start_ranks
from tests.helpers import scrape
from tests.prometheus_server import start_prometheus
from trainhealth import Monitor
from trainhealth._internal.simulator.cluster import ClusterLayout
from trainhealth._internal.simulator.scenario import Scenario, cluster_fault
from trainhealth._internal.simulator.simulate import simulate
from trainhealth._internal.traces.io import write_trace

TRAINHEALTH = str(Path(sys.executable).parent / "trainhealth")
SERVE = ["--addr", "127.0.0.1", "--port", "0", "--interval", "0.5"]


def _start(*args: str) -> tuple[subprocess.Popen, str]:
    """Start the analyzer service; returns it and its metrics URL (from its first line of output)."""
    process = subprocess.Popen(
        [TRAINHEALTH, "analyze", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    line = process.stdout.readline()
    assert "suspects at http" in line, line + process.stderr.read()
    return process, line.rsplit(" ", 1)[-1].strip()


def _suspects(url: str, timeout_s: float = 30.0, want: str | None = None) -> dict[tuple, float]:
    """Poll the analyzer until it has published (and, with ``want``, reached that verdict)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        samples = scrape(url).samples()
        verdicts = {
            dict(labels)["verdict"]: value
            for (name, labels), value in samples.items()
            if name == "trainhealth_analysis_verdict"
        }
        if verdicts and (want is None or verdicts.get(want) == 1.0):
            return {labels: value for (name, labels), value in samples.items() if name == "trainhealth_suspect_score"}
        time.sleep(0.3)
    raise TimeoutError(f"the analyzer never published verdict {want}")


def _drop_rank_files(directory: Path, severity: float | None) -> None:
    """What ranks running trainhealth.comm leave behind: one trace file per rank (and a topology)."""
    layout = ClusterLayout(dp=4, pp=2, tp=2)
    faults = (cluster_fault(layout, "gpu", 13, severity, step=5),) if severity else ()
    trace = simulate(Scenario(layout, steps=12, seed=5, faults=faults))
    for rank, records in trace.records.groupby("rank"):
        write_trace(records, directory / f"rank-{rank}.parquet")
    (directory / "topology.json").write_text(json.dumps(trace.topology))


def test_analyzer_over_trace_files_is_stateless(tmp_path):
    _drop_rank_files(tmp_path, severity=1.5)
    (tmp_path / "rank-99.parquet").write_bytes(b"half-written garbage")  # skipped with a warning, not fatal
    process, url = _start("--traces", str(tmp_path), *SERVE)
    try:
        first = _suspects(url, want="compute")
    finally:
        process.kill()  # killed, not stopped: it must not matter
        process.wait()
    top = max(first, key=first.get)
    assert dict(top) == {
        "job": "trainhealth",
        "rank": "13",
        "host": "sim-node-0001",
        "gpu": "5",
        "kind": "gpu",
        "component": "gpu:rank-13",
    }
    assert first[top] > 0.9

    process, url = _start("--traces", str(tmp_path), *SERVE)  # restarted: the same answer from the same files
    try:
        again = _suspects(url, want="compute")
        assert max(again, key=again.get) == top
        _drop_rank_files(tmp_path, severity=None)  # the ranks' next traces are healthy
        assert _suspects(url, want="healthy") == {}
        samples = scrape(url).samples()
        assert samples[("trainhealth_analysis_ranks", (("job", "trainhealth"),))] == 16  # the job judged
        assert (
            "trainhealth_analysis_stale",
            (("host", socket.gethostname()), ("job", "trainhealth"), ("rank", "")),
        ) in (samples)  # the analyzer's own series: its own identity
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    assert "skipped" in process.stderr.read()


# --- a real job: gloo ranks serving metrics, Prometheus scraping them -------------------------
def _job(rank: int, world: int, port: int, out: str, slow_rank: int) -> None:
    init_rank(rank, world, port)
    monitor = Monitor(
        comm=True,
        gpu_backend="off",
        comm_flush_interval=0.2,
        prometheus_addr="127.0.0.1",
        prometheus_port=0,
        otel=False,
        run_id="e2e",  # the job label (TRAINHEALTH_RUN_ID)
    )
    Path(out, f"url-{rank}.txt").write_text(monitor.metrics_url)
    data, stop = torch.ones(4096), torch.zeros(1)
    deadline = time.monotonic() + 120
    for step in range(100_000):
        time.sleep(0.04 if rank == slow_rank else 0.01)  # rank 2's GPU computes four times as long
        dist.all_reduce(data)
        stop[0] = float(Path(out, "stop").exists() or time.monotonic() > deadline)
        dist.all_reduce(stop)  # everyone stops at the same step
        monitor.step(loss=1.0, step=step)
        if stop[0] > 0:
            break
    monitor.close()
    dist.destroy_process_group()


@pytest.mark.slow
def test_analyzer_over_prometheus_names_the_slow_rank(tmp_path):
    context = start_ranks(_job, 4, str(tmp_path), 2)
    prometheus = None
    try:
        urls = [tmp_path / f"url-{rank}.txt" for rank in range(4)]
        deadline = time.monotonic() + 60
        while not all(u.exists() for u in urls) and time.monotonic() < deadline:
            time.sleep(0.2)
        targets = [urlparse(u.read_text()).netloc for u in urls]
        prometheus = start_prometheus(tmp_path / "prometheus", targets)
        prometheus.wait_for('count_over_time(trainhealth_comm_op_duration_seconds_count{rank="2"}[30s]) >= 14')

        once = subprocess.run(
            [
                TRAINHEALTH,
                "analyze",
                "--prometheus",
                prometheus.url,
                "--job",
                "e2e",
                "--window",
                "12",
                "--step",
                "2",
                "--once",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert once.returncode == 0, once.stderr
        (result,) = json.loads(once.stdout)["jobs"]
        assert result["job"] == "e2e" and result["verdict"] == "compute", result
        assert result["suspects"][0]["component"] == "gpu:rank-2"
        assert result["window"]["ranks"] == 4

        process, url = _start("--prometheus", prometheus.url, "--job", "e2e", "--window", "12", "--step", "2", *SERVE)
        try:
            suspects = _suspects(url, want="compute")
        finally:
            process.terminate()
            process.wait(timeout=30)
        top = dict(max(suspects, key=suspects.get))
        assert top == {
            "job": "e2e",
            "rank": "2",
            "host": socket.gethostname(),
            "gpu": "2",
            "kind": "gpu",
            "component": "gpu:rank-2",
        }
    finally:
        (tmp_path / "stop").write_text("done")
        join(context, timeout_s=90)
        if prometheus is not None:
            prometheus.stop()


def test_analyzer_errors_are_one_line(tmp_path):
    missing = subprocess.run(
        [TRAINHEALTH, "analyze", "--traces", str(tmp_path / "nope"), "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2 and "no such directory" in missing.stderr
    unreachable = subprocess.run(
        [TRAINHEALTH, "analyze", "--prometheus", "http://127.0.0.1:9", "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert unreachable.returncode == 2 and "cannot query Prometheus at http://127.0.0.1:9" in unreachable.stderr
    both = subprocess.run(
        [TRAINHEALTH, "analyze", "--prometheus", "http://x", "--traces", "d"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    assert all("Traceback" not in r.stderr for r in (missing, unreachable, both))


def test_analyzer_ends_on_sigterm_before_its_duration(tmp_path):
    """Kubernetes stops the service with SIGTERM: it exits 0 at once, not when --duration runs out."""
    process, _ = _start("--traces", str(tmp_path), "--duration", "120", *SERVE)
    time.sleep(0.5)
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        returncode = process.wait(timeout=30)
    finally:
        process.kill()
    assert returncode == 0, process.stderr.read()
    assert time.monotonic() - sent < 30
