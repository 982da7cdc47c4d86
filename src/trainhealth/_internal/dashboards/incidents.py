"""Incidents: what fires now, the ranked suspects, the verdict, silent data corruption, the telemetry behind
the alerts (scrape targets, the analyzer) and the advice for each finding."""

from __future__ import annotations

from collections.abc import Iterable

from grafanalib import core as g

from trainhealth._internal import catalog as c
from trainhealth._internal.dashboards.layout import RANKED, AlertLike, arrange, dashboard, ranked, target
from trainhealth._internal.dashboards.model import Dashboard, Stat, Table, Text, TimeSeries
from trainhealth._internal.knowledge.advice import ADVICE

__all__ = ["UID", "incidents_dashboard"]

UID = "trainhealth-incidents"
_ADVICE_KEYS = ("compute", "communication", "imbalance", "hang", "sdc", "loss_spike", "nonfinite", "gpu_lost")


def _advice_markdown() -> str:
    lines = ["What to do, by finding (the same advice as the alerts' mitigation and the runbooks).", ""]
    for key in _ADVICE_KEYS:
        advice = ADVICE[key]
        lines.append(f"**{advice.title}**")
        lines += [f"{i}. {step}" for i, step in enumerate(advice.steps, 1)]
        lines.append("")
    return "\n".join(lines)


def incidents_dashboard(alerts: Iterable[AlertLike]) -> Dashboard:
    panels = [
        Table(
            title="Firing alerts",
            unit="none",
            description="Every trainhealth alert firing now, pages first; each has a runbook and a mitigation.",
            targets=[target('ALERTS{alertstate="firing",job=~"$job"}', instant=True, table=True)],
            transformations=[
                {
                    "id": "organize",
                    "options": {"excludeByName": {"Time": True, "__name__": True, "alertstate": True, "Value": True}},
                }
            ],
            sortBy=[g.TableSortByField(displayName="severity", desc=False)],
        ),
        Table(
            title="Ranked suspects",
            unit="none",
            colored=True,
            description="From trainhealth analyze: 0.5 and more blames the component; kind gpu means compute "
            "(straggler), nic/host/switch communication.",
            targets=[target(f'{c.SUSPECT_SCORE.prometheus_name}{{job=~"$job"}} > 0', instant=True, table=True)],
            transformations=[
                {
                    "id": "organize",
                    "options": {"excludeByName": {"Time": True, "__name__": True}, "renameByName": {"Value": "score"}},
                }
            ],
            sortBy=[g.TableSortByField(displayName="score", desc=True)],
        ),
        Stat(
            title="Verdict",
            format="none",
            textMode="name",
            colorMode="background",
            graphMode="none",
            reduceCalc="lastNotNull",
            targets=[target(f'{c.ANALYSIS_VERDICT.prometheus_name}{{job=~"$job"}} == 1', "{{verdict}}", instant=True)],
            mappings=[{"type": "value", "options": {"1": {"color": "orange"}}}],
        ),
        Stat(
            title="SDC suspects and failed self-tests",
            format="none",
            graphMode="none",
            reduceCalc="lastNotNull",
            description="Ranks a cross-replica check put in the minority, and self-test checks that got a device's "
            "numbers wrong (trainhealth selftest).",
            targets=[
                target(
                    f'sum by (job) ({c.SDC_SUSPECT.prometheus_name}{{job=~"$job"}})', "{{job}} suspects", instant=True
                ),
                target(
                    f'count by (job, host) ({c.SELFTEST_PASSED.prometheus_name}{{job=~"$job"}} == 0)',
                    "{{job}} {{host}} failed self-tests",
                    ref="B",
                    instant=True,
                ),
            ],
        ),
        TimeSeries(
            title="Scrape targets up",
            unit="none",
            tooltipMode="multi",
            tooltipSort="desc",
            description="Prometheus's up for trainhealth's endpoints; 0: its metrics and alerts are blind. The "
            f"{RANKED} lowest at each instant, and how many are up and down.",
            targets=[
                target(ranked('up{job=~"trainhealth.*"}', "below"), "{{instance}} ({{job}})"),
                target('count by (job) (up{job=~"trainhealth.*"} == 1)', "{{job}}: up", ref="B"),
                target('count by (job) (up{job=~"trainhealth.*"} == 0)', "{{job}}: down", ref="C"),
            ],
        ),
        TimeSeries(
            title="Time since the analyzer's last localization",
            unit="s",
            tooltipMode="multi",
            tooltipSort="desc",
            description="Suspects and the verdict are as old as this. One analyzer judges every job, so this is "
            "the analyzer's own age, whichever job is selected (its job label is its own).",
            targets=[
                target(
                    f"time() - max by (job, instance) ({c.ANALYSIS_LAST_RUN_TIMESTAMP.prometheus_name})", "{{instance}}"
                )
            ],
        ),
        Text(title="Advice", mode="markdown", content=_advice_markdown()),
    ]
    return dashboard(
        UID,
        "trainhealth / Incidents",
        "Firing alerts, ranked suspects and what to do about them.",
        arrange(panels, wide=[True, True, False, False, False, False, True]),
        alerts,
    )
