"""What an alert fires at is what its panel draws, and every alert links to an existing panel. Both are read
from the generated files (deploy/prometheus/trainhealth.rules.yml, deploy/grafana/dashboards/*.json)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest
import yaml

from trainhealth._internal.alerts.rules import ALERTS, GRAFANA_URL, Limit, PanelRef, by_name
from trainhealth._internal.dashboards.layout import arrange, dashboard, limit_steps
from trainhealth._internal.dashboards.model import TimeSeries
from trainhealth._internal.knowledge.recording import RECORDING_RULES

ROOT = Path(__file__).resolve().parents[2]
TRAINHEALTH = str(Path(sys.executable).parent / "trainhealth")


def numbers(promql: str) -> set[float]:
    """The numeric literals of an expression (label values, durations and offsets left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', promql)
    text = re.sub(r"\[[^\]]*\]|\boffset\s+\w+", " ", text)
    return {float(n) for n in re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?:e[+-]?\d+)?(?![\w.])", text)}


def test_numbers_reads_the_comparisons_only():
    assert numbers('rate(x{a="1.5"}[10m] offset 1h) * 60 > 1 and y >= 0.05') == {60.0, 1.0, 0.05}


@pytest.fixture(scope="module")
def rules() -> dict[str, dict]:
    groups = yaml.safe_load((ROOT / "deploy/prometheus/trainhealth.rules.yml").read_text(encoding="utf-8"))["groups"]
    return {r["alert"]: r for group in groups for r in group["rules"] if "alert" in r}


@pytest.fixture(scope="module")
def dashboards() -> dict[str, dict]:
    return {
        p.stem: json.loads(p.read_text(encoding="utf-8"))
        for p in sorted((ROOT / "deploy/grafana/dashboards").glob("*.json"))
    }


def _panel(url: str, dashboards: dict[str, dict]) -> dict:
    parts = urllib.parse.urlsplit(url)
    uid = re.fullmatch(r"/d/([\w-]+)", parts.path).group(1)
    (view,) = urllib.parse.parse_qs(parts.query)["viewPanel"]
    panel_id = int(view.removeprefix("panel-"))
    assert uid in dashboards, f"{url}: no dashboard {uid}"
    found = [p for p in dashboards[uid]["panels"] if p["id"] == panel_id]
    assert found, f"{url}: dashboard {uid} has no panel {panel_id}"
    return found[0]


def test_every_alert_links_to_an_existing_panel_of_its_title(rules, dashboards):
    assert set(rules) == {rule.name for rule in ALERTS}
    for rule in ALERTS:
        url = rules[rule.name]["annotations"]["dashboard_url"]
        assert url.startswith(GRAFANA_URL + "/d/"), url
        panel = _panel(url, dashboards)
        assert panel["title"] == rule.panel.title and panel["type"] != "row", (rule.name, panel["title"])


def test_every_limit_is_the_number_in_the_rule_and_the_line_on_its_panel(rules, dashboards):
    limited = [rule for rule in ALERTS if rule.limit is not None]
    assert {r.name for r in limited} >= {
        "IrregularSteps",
        "ThroughputDrop",
        "StragglerSuspect",
        "GpuThermalThrottling",
        "HungCollective",
    }
    recorded = {r.record: r.expr for r in RECORDING_RULES}
    for rule in limited:
        written = rules[rule.name]
        # in the rule's expression, or in a recording it reads (the hang threshold's floor, for HungCollective)
        read = [
            expr
            for name, expr in recorded.items()
            if re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", written["expr"])
        ]
        assert rule.limit.value in set().union(*map(numbers, [written["expr"], *read])), (rule.name, written["expr"])
        steps = _panel(written["annotations"]["dashboard_url"], dashboards)["fieldConfig"]["defaults"]["thresholds"]
        values = [s["value"] for s in steps["steps"]]
        assert steps["mode"] == "absolute" and rule.limit.value in values, (rule.name, values)
        # the colour at the limit (bad above) or just under it (bad below) is not the healthy green
        index = values.index(rule.limit.value)
        bad = steps["steps"][index if rule.limit.bad == "above" else index - 1]["color"]
        assert bad != "green", (rule.name, steps)


def test_every_line_on_a_panel_is_the_limit_of_an_alert_pointing_there(rules, dashboards):
    for uid, data in dashboards.items():
        for panel in data["panels"]:
            drawn = {
                s["value"]
                for s in panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps", [])
                if s["value"] is not None
            }
            limits = {
                r.limit.value
                for r in ALERTS
                if r.limit and r.panel and (r.panel.dashboard, r.panel.panel_id) == (uid, panel["id"])
            }
            assert drawn == limits, (uid, panel["title"], drawn, limits)


def test_the_specific_numbers_of_the_issue_are_drawn(dashboards):
    """The examples of issue 20, read from the JSON: 0.05 irregular share, 0.7 throughput, 0.5 suspect score."""

    def steps(uid: str, title: str) -> list:
        (panel,) = [p for p in dashboards[uid]["panels"] if p["title"] == title]
        return [(s["color"], s["value"]) for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]]

    assert steps("trainhealth-training", "δ-irregular share of the last 100 steps") == [
        ("green", None),
        ("orange", 0.05),
    ]
    assert steps("trainhealth-training", "Throughput against its baseline") == [
        ("orange", None),
        ("orange", 0.7),
        ("green", 0.9),
    ]
    assert steps("trainhealth-incidents", "Ranked suspects") == [("green", None), ("orange", 0.5)]


def test_a_rule_naming_a_missing_or_renamed_panel_fails_at_build():
    wrong = [
        by_name("IrregularSteps").__class__(
            **{**vars(by_name("IrregularSteps")), "panel": PanelRef("trainhealth-x", "Loss")}
        )
    ]
    placed = arrange([TimeSeries(title="Gradient norm"), TimeSeries(title="Throughput")])
    with pytest.raises(ValueError, match="points at panel 'Loss' of trainhealth-x: no such panel"):
        dashboard("trainhealth-x", "x", "", placed, wrong)
    with pytest.raises(ValueError, match="panels 'Loss' and 'Loss' would share id"):
        arrange([TimeSeries(title="Loss"), TimeSeries(title="Gradient norm"), TimeSeries(title="Loss")])
    with pytest.raises(ValueError, match="bad above or all below"):
        limit_steps([(1, "above", "page"), (2, "below", "page")])
    with pytest.raises(ValueError, match="'above' or 'below'"):
        Limit(1, "sideways")


def test_grafana_url_option_moves_every_link_and_bad_values_are_refused(tmp_path):
    done = subprocess.run(
        [TRAINHEALTH, "alerts", "--out", str(tmp_path), "--grafana-url", "https://grafana.example.org/"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    groups = yaml.safe_load((tmp_path / "trainhealth.rules.yml").read_text())["groups"]
    urls = [r["annotations"]["dashboard_url"] for g in groups for r in g["rules"] if "alert" in r]
    assert len(urls) == len(ALERTS)
    assert all(u.startswith("https://grafana.example.org/d/trainhealth-") for u in urls)
    for bad in ("grafana:3000", "http://host/?x=1", "http://a b"):
        done = subprocess.run(
            [TRAINHEALTH, "alerts", "--out", str(tmp_path), "--grafana-url", bad],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 2 and "--grafana-url must be an http(s) URL" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


#: series with one sample per job, analyzer run or event, not per rank or GPU: a panel may read them whole
_FEW_PER_JOB = re.compile(
    r"^(trainhealth_(suspect_score|analysis_\w+|gpu_xid_errors_total|selftest_passed|sdc_suspect|"
    r"exporter_gpu_backend_up|checkpoint_last_timestamp_seconds|train_goodput_ratio)|ALERTS|DCGM_FI_DEV_XID_ERRORS)$"
)


def test_at_all_no_panel_draws_every_rank_raw_series_or_reads_raw_buckets():
    """Issue 50: at 10,000 GPUs a panel at All reads a recording rule, cuts to the worst few (topk/bottomk), or
    aggregates to the job; never every rank's histogram buckets."""
    from tests.alerts.test_generated import metric_names
    from trainhealth._internal.dashboards.render import build_dashboards, queries

    recorded = {r.record for r in RECORDING_RULES}
    for uid, built in build_dashboards(ALERTS).items():
        for title, expr in queries(built):
            if title.startswith("annotation:"):
                continue
            raw = {name for name in metric_names(expr) if name not in recorded and not _FEW_PER_JOB.match(name)}
            assert not any(name.endswith("_bucket") for name in raw), (uid, title, expr)
            cut = expr.startswith(("topk(", "bottomk(")) or re.match(
                r"^(time\(\) - )?(sum|min|max|count) by \(job(, op)?\)", expr
            )
            assert not raw or cut, (uid, title, expr)


def test_a_panel_added_at_the_top_of_the_gpu_dashboard_changes_no_rule_and_no_link():
    """Panels were numbered by position: a new first panel renumbered every GPU alert's dashboard_url."""
    from trainhealth._internal.dashboards.gpu import UID, gpu_dashboard, gpu_panels
    from trainhealth._internal.dashboards.render import dashboard_json

    before = json.loads(dashboard_json(gpu_dashboard(ALERTS)))
    rules_before = [rule.to_rule() for rule in ALERTS]
    added = dashboard(UID, "x", "", arrange([TimeSeries(title="A new first panel"), *gpu_panels()]), ALERTS)
    after = json.loads(dashboard_json(added))
    assert [rule.to_rule() for rule in ALERTS] == rules_before
    assert after["panels"][0]["title"] == "A new first panel"
    assert after["panels"][1]["gridPos"] != before["panels"][0]["gridPos"]  # the others did move
    ids = {panel["title"]: panel["id"] for panel in after["panels"]}
    assert {panel["title"]: panel["id"] for panel in before["panels"]}.items() <= ids.items()
    on_gpu = [rule for rule in rules_before if f"/d/{UID}?" in rule["annotations"].get("dashboard_url", "")]
    assert len(on_gpu) >= 10
    for rule in on_gpu:
        panel = _panel(rule["annotations"]["dashboard_url"], {UID: after})
        assert panel["title"] == by_name(rule["alert"]).panel.title, rule["alert"]
    drawn = {p["title"]: p["fieldConfig"]["defaults"]["thresholds"] for p in after["panels"] if p["type"] != "row"}
    assert (
        drawn.items()
        >= {
            p["title"]: p["fieldConfig"]["defaults"]["thresholds"] for p in before["panels"] if p["type"] != "row"
        }.items()
    )
