"""A fault is named for as long as it lasts from a real Prometheus: older than the window judged, then older than
the history read, it is still a change from the rank's usual level, which the analyzer reads from before the
history (``--reference``).

Eight ranks of one data-parallel group are real /metrics endpoints (the store and sinks a rank serves with) fed
the timings trainhealth.comm and the Monitor export, healthy GPUs up to 12% apart in speed (PRISM measured up to
14% in one fleet); from 25 s on, rank 5 computes 1.3x as long. A real Prometheus scrapes them every 250 ms; the
analyzer judges the last 10 s in 1 s intervals against 30 intervals of history and a 30 s reference before them.
Rank 5 is then only 1.2x its peers' median, a few percent beyond the healthy spread: its peers alone could not
name it for long; its own usual can.
"""

from __future__ import annotations

import threading
import time
from urllib.parse import urlparse

import numpy as np
import pytest

from tests.prometheus_server import start_prometheus
from trainhealth._internal import catalog
from trainhealth._internal.config import Settings
from trainhealth._internal.identity import Identity
from trainhealth._internal.localize.analyzer import Analyzer
from trainhealth._internal.localize.sources import PrometheusClient, PrometheusSource
from trainhealth._internal.sinks.service import Sinks
from trainhealth._internal.store import MetricStore

pytestmark = pytest.mark.slow

JOB, CONTROL = "a1b2c3d4e5f6", "f6e5d4c3b2a1"  # job labels: the faulty run and a healthy one beside it
RANKS, SLOW, FACTOR, ONSET_S = 8, 5, 1.3, 25.0
#: each GPU's healthy speed (seconds of compute per step): 0% to 12% apart, the slow rank among the fastest
SPEED = 0.02 * np.array([1.00, 1.12, 1.04, 1.08, 1.02, 1.00, 1.10, 1.06])


class Ranks:
    """Both jobs' ranks, training: every 50 ms a step of lognormal (3%) compute each, the others waiting."""

    def __init__(self) -> None:
        settings = Settings.resolve(env={}, prometheus_addr="127.0.0.1", prometheus_port=0)
        self.stores: dict[tuple[str, int], MetricStore] = {}
        self.sinks = []
        for job in (JOB, CONTROL):
            for rank in range(RANKS):
                identity = Identity(job, f"node-{rank // 4}", rank, rank % 4, RANKS)
                store = MetricStore()
                store.set_info(catalog.RANK_INFO, tuple(identity.info_labels.values()))
                self.stores[job, rank] = store
                self.sinks.append(Sinks.start(store, identity, settings, env={}))
        self.began = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._train, daemon=True)
        self._thread.start()

    @property
    def age(self) -> float:
        """Seconds since the fault began (negative before)."""
        return time.monotonic() - self.began - ONSET_S

    def _train(self) -> None:
        rng = np.random.default_rng(0)
        while not self._stop.wait(0.05):
            for job in (JOB, CONTROL):
                compute = SPEED * rng.lognormal(0, 0.03, RANKS)
                if job == JOB and self.age >= 0:
                    compute[SLOW] *= FACTOR
                for rank in range(RANKS):
                    store = self.stores[job, rank]
                    store.observe(catalog.COMM_OP_DURATION, compute.max() - compute[rank] + 0.004, ("all_reduce", "dp"))
                    store.inc(catalog.TRAIN_STEPS)
                    store.inc(catalog.TRAIN_STEP_COMPUTE, float(compute[rank]))

    @property
    def targets(self) -> list[str]:
        return [urlparse(sinks.metrics_url).netloc for sinks in self.sinks]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sinks in self.sinks:
            sinks.close()


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    ranks = Ranks()
    server = start_prometheus(tmp_path_factory.mktemp("prometheus"), ranks.targets, scrape_interval="250ms")
    try:
        yield ranks, server
    finally:
        server.stop()
        ranks.close()


def _analyze(url: str, reference: float) -> dict[str, object]:
    source = PrometheusSource(PrometheusClient(url), window=10, step=1, history=30, reference=reference)
    run = Analyzer(source, MetricStore()).run_once(strict=True)
    assert run is not None
    return {r.job: r for r in run.results}


def _wait_until_age(ranks: Ranks, age: float) -> None:
    while ranks.age < age:
        time.sleep(0.2)


def test_a_fault_older_than_the_window_and_the_history_is_still_named(running):
    ranks, server = running
    _wait_until_age(ranks, 20.0)  # older than the 10 s window, inside the 30 s history
    young = _analyze(server.url, reference=30)
    _wait_until_age(ranks, 45.0)  # older than the history too: only the reference holds its usual level
    old = _analyze(server.url, reference=30)
    without = _analyze(server.url, reference=0)
    for results in (young, old):
        faulty = results[JOB]
        assert faulty.verdict == "compute" and faulty.suspects[0].component == f"gpu:rank-{SLOW}", faulty.render()
        assert "as its own usual since" in faulty.suspects[0].evidence
        assert results[CONTROL].suspects == ()  # the healthy run beside it, same spread of speeds: nobody
    # without the reference, a fault older than the history is a level like the healthy spread, not a change
    assert "as its own usual since" not in " ".join(s.evidence for s in without[JOB].suspects)
