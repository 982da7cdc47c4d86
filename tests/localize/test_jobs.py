"""One Prometheus, several jobs: the analyzer judges each on its own and says which job each verdict is about.

Three jobs share one real Prometheus, the same hosts, ranks and group name (``default_pg:0``), as two runs
started by torchrun without ``--rdzv-id`` would, and two of them the same logical name: ``llm-7b``, whose rank 1
never entered the collective its rank 0 has waited in for 30 s (hung), a second run of ``llm-7b`` training
normally, and ``warmup``, whose two ranks have both been in their first all-gather for 25 s (a long collective
every member entered: slow, not hung). Each rank is a real /metrics endpoint (the store and sinks a rank serves
with), fed the positions and timings the collective logger would export.
"""

from __future__ import annotations

import threading
from urllib.parse import urlparse

import numpy as np
import pytest

from tests.prometheus_server import start_prometheus
from trainhealth._internal import catalog
from trainhealth._internal.config import Settings
from trainhealth._internal.identity import Identity
from trainhealth._internal.localize.analyzer import Analyzer
from trainhealth._internal.localize.sources import PrometheusClient, PrometheusSource, SourceError
from trainhealth._internal.sinks.service import Sinks
from trainhealth._internal.store import MetricStore

GROUP = "default_pg:0"
HUNG, HEALTHY, WARMUP = "3f9a0c12b7de", "81c4e2d09a5f", "c0ffee000001"  # job labels: each run's own id


class Jobs:
    """The ranks of the three jobs, serving /metrics; the healthy job keeps completing all-reduces."""

    def __init__(self) -> None:
        settings = Settings.resolve(env={}, prometheus_addr="127.0.0.1", prometheus_port=0)
        self.stores: dict[tuple[str, int], MetricStore] = {}
        self.sinks = []
        for job, name in ((HUNG, "llm-7b"), (HEALTHY, "llm-7b"), (WARMUP, "warmup")):
            for rank in (0, 1):
                identity = Identity(job, f"node-{rank}", rank, 0, 2, job_name=name)
                store = MetricStore()
                store.set_info(catalog.RANK_INFO, tuple(identity.info_labels.values()))
                store.set_info(catalog.COMM_GROUP_MEMBER, (GROUP, str(rank), "2"))
                store.set(catalog.COMM_HANG_THRESHOLD, 10.0)
                self.stores[job, rank] = store
                self.sinks.append(Sinks.start(store, identity, settings, env={}))
        # llm-7b, the hung run: rank 0 waits in all-reduce #41, rank 1 never entered it
        self._position(HUNG, 0, 41, 40, "all_reduce", 30.0)
        self._position(HUNG, 1, 40, 40)
        # warmup: both ranks in their first all-gather for 25 s
        for rank in (0, 1):
            self._position(WARMUP, rank, 1, 0, "all_gather", 25.0)
        self._seq = 41
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._train, daemon=True)
        self._thread.start()

    def _position(self, job: str, rank: int, started: int, completed: int, op: str = "", waited: float = 0.0) -> None:
        store = self.stores[job, rank]
        store.set(catalog.COMM_STARTED_SEQ, started, (GROUP,))
        store.set(catalog.COMM_COMPLETED_SEQ, completed, (GROUP,))
        store.set(catalog.COMM_INFLIGHT_DURATION, waited, (op or "all_reduce", GROUP))

    def _train(self) -> None:
        rng = np.random.default_rng(0)
        while not self._stop.wait(0.05):
            self._seq += 1
            compute = 0.02 * rng.lognormal(0, 0.05, 2)
            for rank in (0, 1):
                store = self.stores[HEALTHY, rank]
                self._position(HEALTHY, rank, self._seq, self._seq)
                store.observe(catalog.COMM_OP_DURATION, compute.max() - compute[rank] + 0.004, ("all_reduce", GROUP))
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
def prometheus(tmp_path_factory):
    jobs = Jobs()
    server = start_prometheus(tmp_path_factory.mktemp("prometheus"), jobs.targets, scrape_interval="250ms")
    try:
        server.wait_for(f'count_over_time(trainhealth_comm_op_duration_seconds_count{{job="{HEALTHY}"}}[5s]) >= 12')
        server.wait_for("count(trainhealth_comm_started_seq) >= 6")
        yield server
    finally:
        server.stop()
        jobs.close()


def _analyze(url: str, **source: object) -> tuple[Analyzer, object]:
    analyzer = Analyzer(PrometheusSource(PrometheusClient(url), window=10, step=1, **source), MetricStore())
    return analyzer, analyzer.run_once(strict=True)


def test_the_hung_job_is_named_and_the_healthy_one_beside_it_never(prometheus):
    analyzer, run = _analyze(prometheus.url)
    assert {r.job for r in run.results} == {HUNG, HEALTHY, WARMUP}
    hung, healthy, warmup = run.result(HUNG), run.result(HEALTHY), run.result(WARMUP)
    assert run.first is hung and hung.job_name == "llm-7b"  # the most urgent job first
    assert hung.verdict == "hang" and [s.component for s in hung.suspects] == ["rank:1"]
    assert hung.details["hangs"][0]["waiting_ranks"] == [0]
    assert healthy.verdict != "hang" and healthy.suspects == () and healthy.job_name == "llm-7b"
    # a collective every member entered, still running past the threshold: slow, not hung; nobody blamed
    assert warmup.verdict != "hang" and warmup.suspects == ()
    (slow,) = warmup.details["slow_collectives"]
    assert (slow["op"], slow["waiting_ranks"], slow["lagging_ranks"]) == ("all_gather", [0, 1], [])
    assert any("a slow collective, not a hang" in reason for reason in warmup.details["reasons"])
    # what it publishes back to Prometheus carries the job each verdict and suspect is about
    store = analyzer.store
    assert {labels[0] for labels, _ in store.series(catalog.SUSPECT_SCORE)} == {HUNG}
    assert store.value(catalog.ANALYSIS_VERDICT, (HUNG, "hang")) == 1.0
    assert store.value(catalog.ANALYSIS_VERDICT, (HEALTHY, "hang")) == 0.0
    assert store.value(catalog.ANALYSIS_VERDICT, (WARMUP, "hang")) == 0.0
    # the text and JSON name the job of each result
    assert run.render().splitlines()[0] == f"job: {HUNG} (llm-7b)"
    assert [job["job"] for job in run.to_dict()["jobs"]][0] == HUNG


def test_a_job_or_a_logical_name_selects_what_is_judged(prometheus):
    _, run = _analyze(prometheus.url, job=HEALTHY)
    assert [(r.job, r.verdict != "hang") for r in run.results] == [(HEALTHY, True)]
    _, run = _analyze(prometheus.url, job_name="llm-7b")  # every run of that name, each on its own
    assert {r.job for r in run.results} == {HUNG, HEALTHY} and run.result(HUNG).verdict == "hang"
    with pytest.raises(SourceError, match="no job named 'nope'"):
        _analyze(prometheus.url, job_name="nope")
