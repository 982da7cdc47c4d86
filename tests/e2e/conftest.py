"""One faulty demo for both end-to-end stacks: the single-Prometheus stack and the scale-out stack scrape it at
once, so the slow tier runs the demo (100 s) once for test_stack's and test_scale_out's checks."""

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
from trainhealth._internal.stack.runner import StackOptions, stack_down, stack_up

RUN_S = 100.0  # the XID comes at 80% of the run: 20 s for GpuLost's `for` and vmalert's lag


@dataclass(frozen=True)
class FaultyDemo:
    """The demo with its injected faults, scraped by both stacks; both still run (they stop after the package)."""

    reference: StackOptions  # one Prometheus and its Alertmanager; no demo of its own
    scale_out: StackOptions  # two shards, VictoriaMetrics, vmalert, Alertmanager; started the demo
    reference_receiver: Receiver  # the webhook of the reference's Alertmanager
    receiver: Receiver  # the webhook of the scale-out stack's Alertmanager
    prometheus_watch: RulerWatch
    vmalert_watch: RulerWatch
    began: float  # before either stack started

    @property
    def out(self) -> Path:
        """The demo's output directory: faults.jsonl (the ground truth), report.json."""
        return self.scale_out.directory / "demo"


@pytest.fixture(scope="package")
def faulty_demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultyDemo]:
    require_binaries(StackOptions(store="victoriametrics"))
    tmp_path = tmp_path_factory.mktemp("stacks")
    receiver, reference_receiver = Receiver(), Receiver()
    base = consecutive_free(6)  # the demo's 4 ranks, then the 2 shards
    store_port, vmalert_port, alertmanager_port, analyzer_port, prometheus_port, reference_alertmanager = free_ports(6)
    common = dict(ranks=4, port_base=base, analyzer_port=analyzer_port, scrape_interval_s=1.0, max_for_s=5.0)
    reference = StackOptions(
        directory=tmp_path / "reference",
        prometheus_port=prometheus_port,
        alertmanager_port=reference_alertmanager,
        webhook_port=reference_receiver.port,
        demo=False,
        **common,
    )
    scale_out = StackOptions(
        directory=tmp_path / "scale-out",
        store="victoriametrics",
        shards=2,
        prometheus_port=base + 4,
        store_port=store_port,
        vmalert_port=vmalert_port,
        alertmanager_port=alertmanager_port,
        webhook_port=receiver.port,
        demo_duration_s=RUN_S,
        demo_args=("--webhook-port", "0"),
        **common,
    )
    began = time.time()
    dcgm = RecordedExporter(DCGM_SAMPLE.read_bytes())
    watches = (RulerWatch(prometheus_port), RulerWatch(vmalert_port))
    try:
        scrape_recorded_dcgm(reference, stack_up(reference), dcgm.port, prometheus_port)
        started = stack_up(scale_out)
        scrape_recorded_dcgm(scale_out, started, dcgm.port, store_port)
        demo = next(s for s in started if s.name == "demo")
        wait_for_exit(demo.pid, timeout_s=300)
        yield FaultyDemo(reference, scale_out, reference_receiver, receiver, *watches, began)
    finally:
        for watch in watches:
            watch.stop()
        stack_down(scale_out.directory)
        stack_down(reference.directory)
