"""benchmarks/scale_out_load.py's synthetic targets: a real node exporter's page, served per target over HTTP,
parses as Prometheus text with each target's own identity, every series once, counters that only grow."""

from __future__ import annotations

import multiprocessing
import re
import sys
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.stack_checks import consecutive_free

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # kept: spawned servers import it too
import scale_out_load as load  # noqa: E402


def _series(page: bytes) -> dict[tuple[str, frozenset], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(page.decode())
        for sample in family.samples
    }


def test_served_pages_carry_each_targets_identity_and_counters_only_grow(tmp_path):
    page = load.capture_node_page()
    host = re.search(r'host="([^"]*)"', page)[1]
    uuid = re.search(r'uuid="(GPU-[0-9a-f]+)-', page)[1]
    template = load.PageTemplate.from_page(page, host=host, rank="", uuid_prefix=uuid)
    captured = _series(page.encode())
    assert template.samples == len(captured) > 1000  # 8 GPUs: every sample of the page is templated

    nodes = [t for t in load.targets(16, consecutive_free(18)) if t.kind == "node"]
    assert [t.host for t in nodes] == ["node-00000", "node-00001"]
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Queue(), context.Event()
    server = context.Process(target=load._serve, args=(nodes, {"node": template}, ready, stop))
    server.start()
    try:
        assert ready.get(timeout=120) == 2

        def scrape(target):
            with urllib.request.urlopen(f"http://127.0.0.1:{target.port}/metrics", timeout=10) as response:
                return _series(response.read())

        first, again, other = scrape(nodes[0]), scrape(nodes[0]), scrape(nodes[1])
    finally:
        stop.set()
        server.join(timeout=30)

    assert len(first) == len(captured) and first.keys() == again.keys()
    assert not first.keys() & other.keys()  # two nodes never share a series
    labels = [dict(key[1]) for key in first]
    assert {lab["host"] for lab in labels} == {"node-00000"}
    assert {lab["uuid"][:12] for lab in labels if "uuid" in lab} == {"GPU-00000000"}
    counters = [key for key in first if key[0].endswith(("_total", "_count", "_sum", "_bucket"))]
    assert counters and all(again[key] >= first[key] for key in counters)
    assert any(again[key] > first[key] for key in counters)


def test_a_saved_outputs_table_refits_to_the_same_line():
    runs = [
        load.Measured(
            gpus,
            gpus,
            gpus,
            0,
            40.0 * gpus,
            570.0 * gpus,
            0,
            (0, 0.7 * gpus),
            (0, 2.2 * gpus),
            (0, 0),
            0,
            0,
            0,
            0,
            "",
            {"all": (1, 2, 3, 4, []), "one host": (1, 2, 3, 4, [])},
            window_s=216.0,
            slowest_rules=[],
            rules_not_evaluated=[],
            groups={},
            cpu_cores={},
            shard_memory=[],
        )
        for gpus in (1024, 2048, 4096)
    ]
    output = "\n".join([load.HEADER, *map(load._line, runs), "| 8,192 | does not fit this machine: ... |"])
    parsed = load._rows(output)
    assert [run.gpus for run in parsed] == [1024, 2048, 4096]
    for got, wanted in zip(parsed, runs):  # as the table prints them: series in millions to 2 places, the rest whole
        assert abs(got.active_series - wanted.active_series) <= 5_000
        assert abs(got.samples_per_s - wanted.samples_per_s) <= 0.5
        assert abs(got.store_peak_mib - wanted.store_mib[1]) <= 0.5
        assert abs(got.shards_peak_mib - wanted.shards_mib[1]) <= 0.5
