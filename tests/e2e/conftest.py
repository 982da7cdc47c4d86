"""One faulty demo for every end-to-end stack: the single-Prometheus stack and two scale-out stacks, one with
Prometheus agents as shards and one with vmagents, scrape it at once, so the slow tier runs the demo (100 s)
once for test_stack's checks and test_scale_out's, with either kind of shard."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.stack_checks import (
    DCGM_SAMPLE,
    Receiver,
    RecordedExporter,
    RulerWatch,
    consecutive_free,
    free_ports,
    require_binaries,
    scrape_recorded_dcgm,
    wait_for_exit,
)
from trainhealth._internal.stack.runner import StackOptions, Started, stack_down, stack_up
from trainhealth._internal.stack.topology import AGENTS

RUN_S = 100.0  # the XID comes at 80% of the run: 20 s for GpuLost's `for` and vmalert's lag
SHARDS = 2
#: The scale-out stack that starts the demo, after every other stack is up and scraping.
DEMO_STACK = "prometheus"


@dataclass(frozen=True)
class ScaleOut:
    """One scale-out stack scraping the demo: shards of one kind, VictoriaMetrics, vmalert, Alertmanager."""

    options: StackOptions
    receiver: Receiver  # the webhook of its Alertmanager
    vmalert_watch: RulerWatch


@dataclass(frozen=True)
class FaultyDemo:
    """The demo with its injected faults, scraped by every stack; they all still run (they stop after the
    package)."""

    reference: StackOptions  # one Prometheus and its Alertmanager; no demo of its own
    reference_receiver: Receiver  # the webhook of the reference's Alertmanager
    prometheus_watch: RulerWatch
    scale_out: dict[str, ScaleOut]  # by kind of shard (topology.AGENTS)
    began: float  # before any stack started
    ended: float  # when the demo had exited

    @property
    def out(self) -> Path:
        """The demo's output directory: faults.jsonl (the ground truth), report.json."""
        return self.scale_out[DEMO_STACK].options.directory / "demo"


@pytest.fixture(scope="package")
def faulty_demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultyDemo]:
    for agent in AGENTS:
        require_binaries(StackOptions(store="victoriametrics", agent=agent))
    tmp_path = tmp_path_factory.mktemp("stacks")
    reference_receiver = Receiver()
    base = consecutive_free(4 + SHARDS * len(AGENTS))  # the demo's 4 ranks, then each stack's shards
    analyzer_port, prometheus_port, reference_alertmanager = free_ports(3)
    common = dict(ranks=4, port_base=base, analyzer_port=analyzer_port, scrape_interval_s=1.0, max_for_s=5.0)
    reference = StackOptions(
        directory=tmp_path / "reference",
        prometheus_port=prometheus_port,
        alertmanager_port=reference_alertmanager,
        webhook_port=reference_receiver.port,
        demo=False,
        **common,
    )
    stacks = {}
    for number, agent in enumerate(AGENTS):
        store_port, vmalert_port, alertmanager_port = free_ports(3)
        receiver = Receiver()
        options = StackOptions(
            directory=tmp_path / f"scale-out-{agent}",
            store="victoriametrics",
            shards=SHARDS,
            agent=agent,
            prometheus_port=base + 4 + SHARDS * number,
            store_port=store_port,
            vmalert_port=vmalert_port,
            alertmanager_port=alertmanager_port,
            webhook_port=receiver.port,
            demo=agent == DEMO_STACK,
            demo_duration_s=RUN_S,
            demo_args=("--webhook-port", "0"),
            **common,
        )
        stacks[agent] = ScaleOut(options, receiver, RulerWatch(vmalert_port))
    began = time.time()
    dcgm = RecordedExporter(DCGM_SAMPLE.read_bytes())
    prometheus_watch = RulerWatch(prometheus_port)
    up: list[tuple[StackOptions, list[Started]]] = []
    try:
        order = sorted(stacks, key=lambda agent: agent == DEMO_STACK)  # the demo's stack last
        for options in (reference, *(stacks[agent].options for agent in order)):
            up.append((options, stack_up(options)))
        for options, started in up:  # while the demo's ranks start
            query_port = options.store_port if options.store == "victoriametrics" else options.prometheus_port
            scrape_recorded_dcgm(options, started, dcgm.port, query_port)
        demo = next(s for s in up[-1][1] if s.name == "demo")
        wait_for_exit(demo.pid, timeout_s=300)
        yield FaultyDemo(reference, reference_receiver, prometheus_watch, stacks, began, time.time())
    finally:
        for watch in (prometheus_watch, *(stack.vmalert_watch for stack in stacks.values())):
            watch.stop()
        for options, _ in reversed(up):
            stack_down(options.directory)
        dcgm.close()
