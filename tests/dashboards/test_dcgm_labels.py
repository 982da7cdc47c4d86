"""The dashboards' dcgm-exporter queries use only labels a real dcgm-exporter 4.x scrape carries
(tests/fixtures/dcgm-exporter: GPU Operator v25.10.0, the closest recorded page to the pinned 4.6.1)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainhealth._internal.alerts.rules import ALERTS
from trainhealth._internal.dashboards.gpu import DCGM_METRICS
from trainhealth._internal.dashboards.layout import DCGM_FILTER
from trainhealth._internal.dashboards.render import build_dashboards, panels

SAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm-exporter" / "gpu-operator-v25.10.0-rtx4000ada.prom"
#: Labels Prometheus itself adds to every scraped series.
TARGET_LABELS = {"job", "instance"}
_SERIES = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+\S+$")
_MATCHER = re.compile(r'\s*([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*,?')
_SELECTOR = re.compile(r"\b(DCGM_FI_\w+)\b(\{[^}]*\})?")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


def scrape(text: str) -> dict[str, set[str]]:
    """Metric name -> the label names its series carry, from a Prometheus text-format page."""
    found: dict[str, set[str]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SERIES.match(line)
        assert match, f"not a sample line: {line!r}"
        name, labels = match.group(1), match.group(2) or ""
        names = {m.group(1) for m in _MATCHER.finditer(labels)}
        assert _MATCHER.sub("", labels) == "", f"unparsed labels in {line!r}"
        found.setdefault(name, set()).update(names)
    return found


def label_use(expr: str) -> tuple[set[str], set[str]]:
    """(label names matched in the braces of DCGM selectors, label names in by/on/... clauses)."""
    matched = {m.group(1) for _, braces in _SELECTOR.findall(expr) for m in _MATCHER.finditer(braces.strip("{}"))}
    grouped = {label.strip() for clause in _GROUPING.findall(expr) for label in clause.split(",") if label.strip()}
    return matched, grouped


@pytest.fixture(scope="module")
def sample() -> dict[str, set[str]]:
    return scrape(SAMPLE.read_text(encoding="utf-8"))


def dcgm_targets() -> list[tuple[str, str, str]]:
    """(panel title, expr, legend) of every target that queries a dcgm-exporter metric."""
    return [
        (panel["title"], t["expr"], t.get("legendFormat", ""))
        for d in build_dashboards(ALERTS).values()
        for panel in panels(d)
        for t in panel.get("targets", [])
        if "DCGM_FI_" in t.get("expr", "")
    ]


def test_the_sample_is_a_dcgm_exporter_4_page(sample):
    labels = set.union(*sample.values())
    assert {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"} <= labels
    assert all(len(sample[name] & {"gpu", "UUID", "Hostname"}) == 3 for name in sample)
    assert "hostname" not in labels  # the host label is Hostname, capitalised


def test_the_checker_catches_a_label_dcgm_does_not_emit(sample):
    matched, grouped = label_use('sum by (host) (DCGM_FI_DEV_GPU_UTIL{hostname=~"$host",gpu=~"$gpu"})')
    assert matched == {"hostname", "gpu"} and grouped == {"host"}
    assert not matched <= set.union(*sample.values())


def test_every_dcgm_query_filters_and_groups_on_labels_the_exporter_emits(sample):
    targets = dcgm_targets()
    assert len(targets) >= 12
    emitted = set.union(*sample.values()) | TARGET_LABELS
    for title, expr, legend in targets:
        matched, grouped = label_use(expr)
        assert matched, (title, expr)  # every dcgm selector is filtered on the dashboard's variables
        assert matched <= emitted, (title, expr, matched - emitted)
        assert grouped <= emitted, (title, expr, grouped - emitted)
        assert set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend)) <= emitted, (title, legend)
    assert label_use(f"DCGM_FI_DEV_GPU_UTIL{{{DCGM_FILTER}}}")[0] == {"Hostname", "gpu"}


def test_dcgm_metric_names_are_those_of_the_exporter(sample):
    """Every default-counter metric the dashboards query is in the recorded page; the three that are not
    are the profiling fields dcgm-exporter's default CSV leaves out (docs/dcgm.md says to add them)."""
    queried = {name for _, expr, _ in dcgm_targets() for name, _ in _SELECTOR.findall(expr)}
    assert queried == set(DCGM_METRICS)
    assert queried - set(sample) == {
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
    }
