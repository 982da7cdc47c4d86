"""Incidents: what fires now, the ranked suspects, the verdict and the advice for each."""

from __future__ import annotations

from grafanalib import core as g

from trainhealth import catalog as c
from trainhealth.knowledge.advice import ADVICE
from trainhealth.dashboards.layout import arrange, dashboard, target

__all__ = ["incidents_dashboard"]

_ADVICE_KEYS = ("compute", "communication", "imbalance", "hang", "sdc", "loss_spike", "nonfinite", "gpu_lost")


def _advice_markdown() -> str:
    lines = ["What to do, by finding (the same advice as the alerts' mitigation and the runbooks).", ""]
    for key in _ADVICE_KEYS:
        advice = ADVICE[key]
        lines.append(f"**{advice.title}**")
        lines += [f"{i}. {step}" for i, step in enumerate(advice.steps, 1)]
        lines.append("")
    return "\n".join(lines)


def incidents_dashboard() -> g.Dashboard:
    panels = [
        g.Table(
            title="Firing alerts", dataSource="${datasource}",
            description="Every trainhealth alert firing now, pages first; each has a runbook and a mitigation.",
            targets=[target('ALERTS{alertstate="firing",job=~"$job"}', instant=True, table=True)],
            transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True, "__name__": True,
                                                                              "alertstate": True, "Value": True}}}],
            sortBy=[g.TableSortByField(displayName="severity", desc=False)],
        ),
        g.Table(
            title="Ranked suspects", dataSource="${datasource}",
            description="From trainhealth analyze: 0.5 and more blames the component; kind gpu means compute "
                        "(straggler), nic/host/switch communication.",
            targets=[target(f'{c.SUSPECT_SCORE.prometheus_name}{{job=~"$job"}} > 0', instant=True, table=True)],
            transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True, "__name__": True},
                                                            "renameByName": {"Value": "score"}}}],
            sortBy=[g.TableSortByField(displayName="score", desc=True)],
        ),
        g.Stat(
            title="Verdict", dataSource="${datasource}", textMode="name", colorMode="background",
            targets=[target(f'{c.ANALYSIS_VERDICT.prometheus_name}{{job=~"$job"}} == 1', "{{verdict}}", instant=True)],
            mappings=[{"type": "value", "options": {"1": {"color": "orange"}}}],
        ),
        g.Stat(
            title="SDC suspects", dataSource="${datasource}",
            targets=[target(f'sum by (job) ({c.SDC_SUSPECT.prometheus_name}{{job=~"$job"}})', "{{job}}",
                            instant=True)],
        ),
        g.Text(title="Advice", mode="markdown", content=_advice_markdown()),
    ]
    return dashboard("trainhealth-incidents", "trainhealth / Incidents",
                     "Firing alerts, ranked suspects and what to do about them.",
                     arrange(panels, wide=[True, True, False, False, True]))
