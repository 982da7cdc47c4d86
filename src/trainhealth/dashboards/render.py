"""Deterministic dashboard JSON (sorted keys, fixed uids and panel ids) and ``trainhealth dashboards``.

>>> sorted(DASHBOARDS)
['trainhealth-communication', 'trainhealth-gpu', 'trainhealth-incidents', 'trainhealth-training']
>>> '"uid": "trainhealth-gpu"' in dashboard_json(DASHBOARDS["trainhealth-gpu"]())
True
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from trainhealth.dashboards.communication import communication_dashboard
from trainhealth.dashboards.gpu import gpu_dashboard
from trainhealth.dashboards.incidents import incidents_dashboard
from trainhealth.dashboards.training import training_dashboard

__all__ = ["DASHBOARDS", "dashboard_json", "queries", "write_dashboards"]

DASHBOARDS: dict[str, Callable[[], g.Dashboard]] = {
    "trainhealth-training": training_dashboard,
    "trainhealth-gpu": gpu_dashboard,
    "trainhealth-communication": communication_dashboard,
    "trainhealth-incidents": incidents_dashboard,
}


def dashboard_json(dashboard: g.Dashboard) -> str:
    return json.dumps(dashboard.to_json_data(), cls=DashboardEncoder, sort_keys=True, indent=2) + "\n"


def queries(dashboard: g.Dashboard) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel query and annotation; template variables left in place."""
    data = json.loads(dashboard_json(dashboard))
    found = [(panel.get("title", ""), t["expr"]) for panel in data.get("panels", [])
             for t in panel.get("targets", []) if t.get("expr")]
    found += [(f"annotation: {a['name']}", a["expr"]) for a in data["annotations"]["list"] if a.get("expr")]
    return found


def write_dashboards(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for uid, build in DASHBOARDS.items():
        path = out / f"{uid}.json"
        path.write_text(dashboard_json(build()), encoding="utf-8")
        written.append(path)
    return written
