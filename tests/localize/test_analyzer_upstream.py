"""``trainhealth analyze`` stays up through every bad answer Prometheus (or what stands in front of it) can give,
serves its last verdict marked stale, and serves a fresh one within two intervals of good answers resuming.

The ranks are four real metric endpoints (the store and the sinks a rank serves /metrics with) fed the timings of
a job whose rank 2 computes three times as long; a real Prometheus scrapes them; the analyzer queries it through
:class:`tests.localize.upstream.Upstream`, which answers each run badly in its own way before passing answers
through again.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest

from tests.helpers import scrape
from tests.localize.upstream import BAD_ANSWERS, Upstream, forward_to
from tests.prometheus_server import start_prometheus
from trainhealth._internal import catalog
from trainhealth._internal.config import Settings
from trainhealth._internal.identity import Identity
from trainhealth._internal.localize.sources import PrometheusClient, PrometheusSource, SourceError
from trainhealth._internal.sinks.service import Sinks
from trainhealth._internal.store import MetricStore

TRAINHEALTH = str(Path(sys.executable).parent / "trainhealth")
#: a job name that breaks a query built by pasting it between double quotes
JOB = 'it\'s "llm-70b"} or {x="\\y\nz'
INTERVAL = 0.4
TIMEOUT = 1.0
RANKS = 4


class Ranks:
    """Four ranks' /metrics, as trainhealth.comm and the Monitor export them; rank 2 computes three times as long."""

    def __init__(self) -> None:
        settings = Settings.resolve(env={}, prometheus_addr="127.0.0.1", prometheus_port=0)
        self.stores, self.sinks = [], []
        for rank in range(RANKS):
            identity = Identity(JOB, "node-0", rank, rank, RANKS)
            store = MetricStore()
            store.set_info(catalog.RANK_INFO, tuple(identity.info_labels.values()))
            self.stores.append(store)
            self.sinks.append(Sinks.start(store, identity, settings, env={}))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._train, daemon=True)
        self._thread.start()

    @property
    def targets(self) -> list[str]:
        return [urlparse(sinks.metrics_url).netloc for sinks in self.sinks]

    def _train(self) -> None:
        rng = np.random.default_rng(0)
        while not self._stop.wait(0.05):
            compute = 0.02 * rng.lognormal(0, 0.05, RANKS)
            compute[2] *= 3
            for rank, store in enumerate(self.stores):
                wait = compute.max() - compute[rank]
                store.observe(catalog.COMM_OP_DURATION, wait + 0.004, ("all_reduce", "dp"))
                store.inc(catalog.TRAIN_STEPS)
                store.inc(catalog.TRAIN_STEP_COMPUTE, float(compute[rank]))
                store.observe(catalog.TRAIN_STEP_DURATION, float(compute.max() + 0.004))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sinks in self.sinks:
            sinks.close()


@pytest.fixture
def prometheus(tmp_path):
    ranks = Ranks()
    server = start_prometheus(tmp_path / "prometheus", ranks.targets, scrape_interval="250ms")
    try:
        yield server
    finally:
        server.stop()
        ranks.close()


def _analysis(url: str) -> dict[str, object]:
    """What the analyzer serves about itself: verdict, staleness, failures, errors, last good run."""
    samples = scrape(url).samples()
    one = {name: value for (name, labels), value in samples.items()}
    verdicts = [
        dict(labels)["verdict"]
        for (name, labels), value in samples.items()
        if name == "trainhealth_analysis_verdict" and value == 1.0
    ]
    return {
        "verdict": verdicts[0] if verdicts else None,
        "stale": one.get("trainhealth_analysis_stale"),
        "failures": one.get("trainhealth_analysis_consecutive_failures", 0.0),
        "errors": sum(
            value
            for (name, labels), value in samples.items()
            if name == "trainhealth_exporter_errors_total" and dict(labels)["source"] == "analyze"
        ),
        "ranks": one.get("trainhealth_analysis_ranks"),
        "last_run": one.get("trainhealth_analysis_last_run_timestamp_seconds", 0.0),
        "duration": one.get("trainhealth_analysis_duration_seconds", 0.0),
    }


def _until(process: subprocess.Popen, url: str, done, timeout_s: float, what: str) -> dict[str, object]:
    """Poll the analyzer until ``done(state)``; it must stay up all the while."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the analyzer exited ({process.returncode}) waiting for {what}"
        state = _analysis(url)
        if done(state):
            return state
        time.sleep(0.05)
    raise TimeoutError(f"the analyzer never reached {what}: {_analysis(url)}")


@pytest.mark.slow
def test_analyzer_survives_every_bad_answer_and_recovers(prometheus, tmp_path):
    upstream = Upstream(forward_to(prometheus.url))
    upstream.start()
    log = tmp_path / "analyze.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [
                TRAINHEALTH,
                "analyze",
                "--prometheus",
                upstream.url,
                "--job",
                JOB,
                "--window",
                "4",
                "--step",
                "1",
                "--interval",
                str(INTERVAL),
                "--prometheus-timeout",
                str(TIMEOUT),
                "--addr",
                "127.0.0.1",
                "--port",
                "0",
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    try:
        line = process.stdout.readline()
        assert "suspects at http" in line, line + log.read_text()
        url = line.rsplit(" ", 1)[-1].strip()

        # good answers from the real Prometheus (once it has scraped a few steps): the escaped job selects the ranks
        good = _until(
            process, url, lambda s: s["verdict"] and s["ranks"] == RANKS and s["stale"] == 0, 30, "a first verdict"
        )
        errors = good["errors"]

        # one run per bad answer; the last verdict stays served, marked stale, and every failure is counted
        first = len(upstream.served)
        upstream.script.extend(BAD_ANSWERS)
        upstream.hold = "http_503"  # after the script, until Prometheus goes away
        seen = []
        while upstream.script or len(seen) < 2:
            seen.append(_until(process, url, lambda s: True, 5, "an answer"))
            time.sleep(0.2)
        state = _until(
            process, url, lambda s: s["errors"] >= errors + len(BAD_ANSWERS), 10, "an error counted per bad answer"
        )
        assert [kind for _, kind in upstream.served[first : first + len(BAD_ANSWERS)]] == list(BAD_ANSWERS)
        assert any(s["stale"] == 1 and s["verdict"] is not None and s["failures"] >= 2 for s in seen), seen
        served = {s["last_run"] for s in seen if s["stale"] == 1}  # the last good run's, all along
        assert len(served) == 1
        errors_seen = [s["errors"] for s in seen]
        assert errors_seen == sorted(errors_seen) and errors_seen[-1] > errors_seen[0]

        # Prometheus gone: connections refused
        upstream.stop()
        before = state["errors"]  # one run may still have been under way: two more errors include a refused one
        state = _until(process, url, lambda s: s["errors"] >= before + 2, 10, "a refused run counted")
        assert state["stale"] == 1 and state["verdict"] is not None and state["last_run"] in served

        # back with good answers: a fresh verdict within two intervals
        upstream.hold = "good"
        upstream.start()
        back = time.time()
        fresh = _until(
            process, url, lambda s: s["last_run"] > back and s["stale"] == 0, 2 * INTERVAL + 10, "a fresh verdict"
        )
        assert fresh["failures"] == 0 and fresh["ranks"] == RANKS and fresh["verdict"] is not None
        began = fresh["last_run"] - fresh["duration"]  # the analyzer's clock: when its first good run began
        # two intervals, and what a loaded machine adds to waking a thread (Analyzer.delay pins the schedule itself)
        assert began - back <= 2 * INTERVAL + 0.5, f"the first good run began {began - back:.2f}s after recovery"
        assert [kind for at, kind in upstream.served if at >= back][:1] == ["good"]
        assert process.poll() is None
    finally:
        upstream.stop()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0

    text = log.read_text()
    assert "Traceback" not in text, text
    failures = [line for line in text.splitlines() if "failed run" in line]
    assert len(failures) >= len(BAD_ANSWERS) + 2
    for expected in (
        "not JSON",
        "unexpected shape",
        "refused the query",
        "answered 404",
        "answered 503",
        "did not answer within 1s",
        "RemoteDisconnected",
        "Connection refused",
        f"no {catalog.COMM_OP_DURATION.prometheus_name} series",
        "no collectives completed",
        "cannot be timings of this window",
        "serving the last verdict, stale",
    ):
        assert any(expected in line for line in failures), f"no failure logged with {expected!r}:\n{text}"


# --- the client alone: each bad answer is one SourceError line -----------------------------------
def _good(path: str) -> tuple[int, bytes]:
    """A small good answer: two ranks' samples over the last five seconds, or their rank info."""
    now = time.time()
    if path.startswith("/api/v1/query?"):
        result = [
            {"metric": {"job": JOB, "rank": str(rank), "local_rank": str(rank)}, "value": [now, "1"]}
            for rank in range(2)
        ]
        return 200, json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
    result = [
        {
            "metric": {"job": JOB, "host": "h", "rank": str(rank), "op": "all_reduce", "group": "dp"},
            "values": [[now - 5 + i, "0.01"] for i in range(5)],
        }
        for rank in range(2)
    ]
    return 200, json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()


@pytest.mark.parametrize("kind", BAD_ANSWERS)
def test_every_bad_answer_is_one_source_error(kind):
    upstream = Upstream(_good)
    upstream.start()
    upstream.hold = kind
    source = PrometheusSource(PrometheusClient(upstream.url, timeout=TIMEOUT), job=JOB, window=10, step=1)
    began = time.monotonic()
    try:
        with pytest.raises(SourceError) as raised:
            source.read()
    finally:
        upstream.stop()
    assert time.monotonic() - began < TIMEOUT + 1
    message = str(raised.value)
    assert "\n" not in message and len(message) < 600, message
    assert upstream.served == [(upstream.served[0][0], kind)]


def test_connection_refused_is_one_source_error():
    upstream = Upstream(_good)
    upstream.start()
    upstream.stop()
    with pytest.raises(SourceError, match="Connection refused"):
        PrometheusSource(PrometheusClient(upstream.url, timeout=TIMEOUT)).read()


def test_oversized_answer_is_refused():
    upstream = Upstream(_good)
    upstream.start()
    try:
        with pytest.raises(SourceError, match="more than 100 bytes"):
            PrometheusClient(upstream.url, max_bytes=100).query_range("up", 0, 1, 1)
        assert len(PrometheusClient(upstream.url).query_range("up", 0, 1, 1)) == 2
    finally:
        upstream.stop()


def test_a_bad_sample_is_named_by_its_place():
    upstream = Upstream(
        lambda path: (
            200,
            json.dumps(
                {
                    "status": "success",
                    "data": {
                        "resultType": "matrix",
                        "result": [
                            {"metric": {"rank": "0"}, "values": [[1.0, "0.1"]]},
                            {"metric": {"rank": "1"}, "values": [[1.0, None]]},
                        ],
                    },
                }
            ).encode(),
        )
    )
    upstream.start()
    try:
        with pytest.raises(
            SourceError,
            match=r"^Prometheus at http://\S+ answered JSON of an unexpected shape: "
            r"data.result\[1\].values\[0\] has no value$",
        ):
            PrometheusClient(upstream.url).query_range("up", 0, 1, 1)
    finally:
        upstream.stop()
