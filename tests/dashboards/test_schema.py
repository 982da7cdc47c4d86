"""The generated dashboards against Grafana's published dashboard and panel schemas: no violation, and
every panel has a unit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from tests.dashboards.grafana_schema import PLUGINS, violations
from trainhealth._internal.alerts.rules import ALERTS
from trainhealth._internal.dashboards.render import DASHBOARDS, build_dashboards, dashboard_json

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "deploy" / "grafana" / "dashboards"


@pytest.fixture(scope="module")
def generated() -> dict[str, dict]:
    return {uid: json.loads(dashboard_json(d)) for uid, d in build_dashboards(ALERTS).items()}


@pytest.mark.parametrize("uid", sorted(DASHBOARDS))
def test_generated_dashboard_has_no_schema_violation(uid, generated, capsys):
    found = violations(generated[uid])
    with capsys.disabled():
        print(f"\n{uid}: {len(found)} schema violations")
    assert found == []


@pytest.mark.parametrize("uid", sorted(DASHBOARDS))
def test_committed_dashboard_has_no_schema_violation(uid):
    assert violations(json.loads((COMMITTED / f"{uid}.json").read_text(encoding="utf-8"))) == []


def test_the_validator_finds_what_grafanalib_writes_unchanged(generated):
    """grafanalib's own objects (not the subclasses in trainhealth._internal.dashboards.model) break the schema: the
    check is not vacuous."""
    legacy = g.Dashboard(
        title="legacy",
        uid="legacy",
        panels=[
            g.TimeSeries(
                title="t",
                dataSource="${datasource}",
                targets=[g.Target(expr="up", refId="A")],
                gridPos=g.GridPos(h=8, w=12, x=0, y=0),
                id=1,
            ),
            g.Heatmap(title="h", dataSource="${datasource}", gridPos=g.GridPos(h=8, w=12, x=12, y=0), id=2),
        ],
    )
    found = violations(json.loads(json.dumps(legacy.to_json_data(), cls=DashboardEncoder)))
    assert len(found) > 10
    assert any("datasource" in v for v in found) and any("Additional properties" in v for v in found)
    broken = json.loads(json.dumps(generated["trainhealth-gpu"]))
    broken["panels"][0]["options"]["legend"]["displayMode"] = "sideways"
    del broken["panels"][0]["options"]["tooltip"]
    assert len(violations(broken)) == 2


def test_every_panel_type_has_a_plugin_schema_and_every_panel_a_unit(generated):
    kinds = set()
    for uid, data in generated.items():
        for panel in data["panels"]:
            kinds.add(panel["type"])
            if panel["type"] == "row":
                continue
            unit = panel["fieldConfig"]["defaults"].get("unit")
            assert unit, f"{uid}: panel {panel['id']} {panel['title']!r} has no unit"
    assert kinds - {"row"} <= set(PLUGINS)
    assert "row" in kinds  # the GPU-efficiency row


def test_panels_without_an_alert_draw_no_threshold(generated):
    """Only a base step where no alert names the panel: no invented number on a panel."""
    named = {(a.panel.dashboard, a.panel.panel_id) for a in ALERTS if a.panel and a.limit}
    for uid, data in generated.items():
        for panel in data["panels"]:
            if panel["type"] == "row":
                continue
            steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
            assert steps[0]["value"] is None
            if (uid, panel["id"]) not in named:
                assert len(steps) == 1, (uid, panel["title"], steps)
