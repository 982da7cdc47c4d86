"""Generated dashboards, rules and runbooks: committed copies match a fresh generation, and every query names
only metrics that exist (trainhealth's catalogue, dcgm-exporter's, or Prometheus's own)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainhealth._internal.alerts.render import (
    prometheus_rule_yaml,
    rule_file_yaml,
    runbook_markdown,
)
from trainhealth._internal.alerts.rules import ALERTS
from trainhealth._internal.catalog import CATALOG, MetricKind
from trainhealth._internal.dashboards.gpu import DCGM_METRICS
from trainhealth._internal.dashboards.render import DASHBOARDS, build_dashboards, dashboard_json, queries
from trainhealth._internal.knowledge.limits import panel_id

ROOT = Path(__file__).resolve().parents[2]
TRAINHEALTH = str(Path(sys.executable).parent / "trainhealth")
PROMETHEUS_OWN = {"up", "ALERTS"}
KEYWORDS = {"and", "or", "unless", "offset", "bool", "group_left", "group_right"}


def known_metrics() -> set[str]:
    names = set(DCGM_METRICS) | PROMETHEUS_OWN
    for spec in CATALOG:
        names.add(spec.prometheus_name)
        if spec.kind is MetricKind.HISTOGRAM:
            names |= {spec.prometheus_name + suffix for suffix in ("_bucket", "_sum", "_count")}
    return names


def metric_names(promql: str) -> set[str]:
    """The metric names a PromQL expression selects (labels, functions, keywords and durations removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', promql)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    identifiers = re.findall(r"\b[A-Za-z_:][A-Za-z0-9_:]*\b(?!\s*\()", text)
    return {name for name in identifiers if name not in KEYWORDS and not re.fullmatch(r"\d+\w*", name)}


def test_the_extractor_sees_metrics_and_not_the_rest():
    assert metric_names('sum by (job) (rate(a_total{x="b c"}[5m] offset 1h)) > 0.7 * on (job) max(b) and c') == {
        "a_total",
        "b",
        "c",
    }


@pytest.mark.parametrize("uid", sorted(DASHBOARDS))
def test_every_dashboard_query_names_known_metrics_or_recorded_ones(uid):
    from trainhealth._internal.knowledge.recording import RECORDING_RULES

    known = known_metrics() | {r.record for r in RECORDING_RULES}
    found = queries(DASHBOARDS[uid](ALERTS))
    assert found
    for title, expr in found:
        assert metric_names(expr) - known == set(), (title, expr)
        assert metric_names(expr), (title, expr)


def test_every_alert_and_recording_expression_names_known_metrics_or_recorded_ones():
    from trainhealth._internal.knowledge.recording import RECORDING_RULES

    known = known_metrics() | {r.record for r in RECORDING_RULES}
    for name, expr in [(r.name, r.expr) for r in ALERTS] + [(r.record, r.expr) for r in RECORDING_RULES]:
        names = metric_names(expr)
        assert names and names - known == set(), (name, expr)


def test_a_rule_reads_a_recording_made_before_it_in_its_own_group_or_in_the_per_job_group():
    """On Prometheus a group's rules run in order at one timestamp: a recording read by a rule of its group is
    current only if it comes first. Per-job recordings run in their own group (once a minute)."""
    from trainhealth._internal.knowledge.recording import PER_BLOCK, PER_JOB, PER_RANK, RECORDING_RULES

    groups = yaml.safe_load(rule_file_yaml())["groups"]
    per_job = {r.record for r in RECORDING_RULES if r.wing in (PER_JOB, PER_RANK, PER_BLOCK)}
    read_somewhere = set()
    for group in groups:
        recorded_before: set[str] = set()
        for rule in group["rules"]:
            recordings_read = {n for n in metric_names(rule["expr"]) if ":" in n}
            read_somewhere |= recordings_read
            assert recordings_read <= recorded_before | per_job, (group["name"], rule)
            if "record" in rule:
                recorded_before.add(rule["record"])
    unread = {r.record for r in RECORDING_RULES if r.wing not in (PER_JOB, PER_RANK, PER_BLOCK)} - read_somewhere
    assert unread == set()  # a wing's recording is there for its rules


def test_dashboards_are_deterministic_with_stable_ids():
    for uid, build in DASHBOARDS.items():
        first, second = dashboard_json(build(ALERTS)), dashboard_json(build(ALERTS))
        assert first == second
        data = json.loads(first)
        assert data["uid"] == uid
        ids = [panel["id"] for panel in data["panels"]]
        assert len(build_dashboards(ALERTS)) == len(DASHBOARDS)
        # each panel's id follows from its title (its key), never from its place: unique, positive, 32-bit
        assert ids == [panel_id(panel["title"]) for panel in data["panels"]]
        assert len(set(ids)) == len(ids) and all(0 < i < 2**31 for i in ids)
        names = [v["name"] for v in data["templating"]["list"]]
        assert names[:5] == ["datasource", "job_name", "job", "host", "rank"]


def _generated(tmp_path: Path) -> dict[Path, str]:
    (tmp_path / "k8s").mkdir()  # an output file's directory must exist, as for any command writing a file
    subprocess.run(
        [
            TRAINHEALTH,
            "dashboards",
            "--out",
            str(tmp_path / "dash"),
            "--configmap",
            str(tmp_path / "k8s" / "grafana-dashboards.yaml"),
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            TRAINHEALTH,
            "alerts",
            "--out",
            str(tmp_path / "rules"),
            "--operator-out",
            str(tmp_path / "k8s"),
            "--runbooks",
            str(tmp_path / "rb"),
        ],
        check=True,
        capture_output=True,
    )
    out = {ROOT / "deploy/grafana/dashboards" / p.name: p.read_text() for p in (tmp_path / "dash").iterdir()}
    out |= {ROOT / "deploy/prometheus" / p.name: p.read_text() for p in (tmp_path / "rules").iterdir()}
    out |= {ROOT / "deploy/k8s" / p.name: p.read_text() for p in (tmp_path / "k8s").iterdir()}
    out |= {ROOT / "docs/runbooks" / p.name: p.read_text() for p in (tmp_path / "rb").iterdir()}
    return out


def test_committed_copies_match_a_fresh_generation(tmp_path):
    generated = _generated(tmp_path)
    assert len(generated) == len(DASHBOARDS) + 3 + len(ALERTS) + 1  # rules, PrometheusRule, ConfigMap; runbook index
    for path, text in generated.items():
        assert path.is_file(), f"{path.relative_to(ROOT)} is missing: run trainhealth dashboards / alerts"
        assert path.read_text() == text, f"{path.relative_to(ROOT)} is stale: regenerate it"
    committed = {p for p in (ROOT / "docs/runbooks").glob("*.md")}
    assert committed == {p for p in generated if p.parent.name == "runbooks"}, "a runbook without an alert"


def test_rule_outputs_carry_the_same_rules():
    import yaml

    plain = yaml.safe_load(rule_file_yaml())["groups"]
    operator = yaml.safe_load(prometheus_rule_yaml())
    assert operator["apiVersion"] == "monitoring.coreos.com/v1" and operator["kind"] == "PrometheusRule"
    assert operator["spec"]["groups"] == plain
    rules = [r for group in plain for r in group["rules"] if "alert" in r]
    assert sorted(r["alert"] for r in rules) == sorted(rule.name for rule in ALERTS)  # each once
    for group in plain:  # a group waiting minutes before it fires runs once a minute, the others every interval
        sustained = {rule.sustained for rule in ALERTS if rule.name in {r.get("alert") for r in group["rules"]}}
        assert sustained <= {group["name"].endswith("-sustained")}, group["name"]
        assert ("interval" in group) == group["name"].endswith(("-sustained", "-per-job", "-per-rank", "-per-block"))
    for rule in rules:
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url", "mitigation", "dashboard_url"}
        assert rule["annotations"]["runbook_url"].endswith(f"docs/runbooks/{rule['alert']}.md")
        assert "/d/trainhealth-" in rule["annotations"]["dashboard_url"]


def test_runbooks_name_the_advice_and_its_sources():
    text = runbook_markdown(next(r for r in ALERTS if r.name == "SdcSuspect"))
    assert "dcgmi diag -r 3" in text and "## Sources" in text and "arXiv 2502.12340" in text
    xid = runbook_markdown(next(r for r in ALERTS if r.name == "GpuXidCritical"))
    assert "| 79 | GPU has fallen off the bus |" in xid and "| 13 |" not in xid
    assert (
        f"**Dashboard:** [XIDs in the last hour](http://127.0.0.1:3000/d/trainhealth-gpu?viewPanel=panel-{panel_id('XIDs in the last hour')})"
        in xid
    )
    irregular = runbook_markdown(next(r for r in ALERTS if r.name == "IrregularSteps"))
    assert "the line drawn there is this rule's limit, 0.05." in irregular


def test_bad_runbook_base_is_one_line_and_status_2(tmp_path):
    done = subprocess.run(
        [TRAINHEALTH, "alerts", "--out", str(tmp_path), "--runbook-base", "docs/"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "--runbook-base must be an http(s) URL" in done.stderr
    assert "Traceback" not in done.stderr
