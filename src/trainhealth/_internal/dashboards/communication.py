"""Communication: compute vs wait per rank, collective latency by rank (heatmap), in-flight collectives, the
lagging rank, abnormal operations and the analyzer's suspects."""

from __future__ import annotations

from collections.abc import Iterable

from grafanalib import core as g

from trainhealth._internal import catalog as c
from trainhealth._internal.dashboards.layout import RANK_FILTER as F
from trainhealth._internal.dashboards.layout import RANKED, RANKED_NOTE, AlertLike, arrange, dashboard, ranked, target
from trainhealth._internal.dashboards.model import Dashboard, Heatmap, Table, TimeSeries
from trainhealth._internal.knowledge.recording import OP_LATENCY_BUCKETS, RANK_MEDIAN_LATENCY

__all__ = ["UID", "communication_dashboard"]

UID = "trainhealth-communication"


def communication_dashboard(alerts: Iterable[AlertLike]) -> Dashboard:
    started = c.COMM_STARTED_SEQ.prometheus_name
    steps = f"sum by (job, rank) (rate({c.TRAIN_STEPS.prometheus_name}{{{F}}}[2m]))"
    per_step = {
        part: f"sum by (job, rank) (rate({spec.prometheus_name}{{{F}}}[2m])) / {steps}"
        for part, spec in (("compute", c.TRAIN_STEP_COMPUTE), ("wait", c.TRAIN_STEP_WAIT))
    }
    panels = [
        TimeSeries(
            title="Compute vs wait per rank",
            unit="s",
            tooltipMode="multi",
            tooltipSort="desc",
            description="Seconds per step each rank computes and waits blocked in collectives (step markers of "
            "the collective logger). Ranks wait for the slowest one: the straggler is the rank that "
            f"waits least and computes most; a slow link raises every member's wait instead. At All, the {RANKED} "
            "ranks that compute longest and the ten that wait least at each instant; choose a host or rank to see "
            "each of its.",
            targets=[
                target(ranked(per_step["compute"], "above"), "{{job}} rank {{rank}} compute"),
                target(ranked(per_step["wait"], "below"), "{{job}} rank {{rank}} wait", ref="B"),
            ],
        ),
        Heatmap(
            title="Median collective latency by rank",
            unit="s",
            description="One row per rank, its median over every collective in 2 minutes (a recording rule, once a "
            "minute): a slow GPU's peers wait for it (long), the straggler itself is short; a slow link makes every "
            f"member of its group long. At All, the {RANKED} longest and the {RANKED} shortest at each instant; "
            "choose a host or rank to see each of its.",
            targets=[
                target(ranked(f"{RANK_MEDIAN_LATENCY}{{{F}}}", "above"), "{{job}} {{rank}}"),
                target(ranked(f"{RANK_MEDIAN_LATENCY}{{{F}}}", "below"), "{{job}} {{rank}}", ref="B"),
            ],
        ),
        TimeSeries(
            title="p99 collective latency by operation",
            unit="s",
            tooltipMode="multi",
            tooltipSort="desc",
            description="Over the job's ranks, in 2 minutes, from the buckets a recording rule sums once a minute.",
            targets=[target(f'histogram_quantile(0.99, {OP_LATENCY_BUCKETS}{{job=~"$job"}})', "{{job}} {{op}}")],
        ),
        TimeSeries(
            title="Time inside the current collective",
            unit="s",
            tooltipMode="multi",
            tooltipSort="desc",
            description="How long each rank has been waiting in its collective; everyone high but one rank: that "
            f"rank never arrived. {RANKED_NOTE}",
            targets=[
                target(ranked(f"{c.COMM_INFLIGHT_DURATION.prometheus_name}{{{F}}} > 0"), "{{job}} rank {{rank}} {{op}}")
            ],
        ),
        Table(
            title="Lagging ranks (collectives behind their group)",
            unit="short",
            description=f"Collectives a rank has not yet entered that others in its group have. The {RANKED} "
            "furthest behind.",
            targets=[
                target(
                    ranked(
                        f'max by (job, group) ({started}{{job=~"$job"}}) - on (job, group) group_right '
                        f"{started}{{{F}}} > 0"
                    ),
                    instant=True,
                    table=True,
                )
            ],
            transformations=[
                {"id": "organize", "options": {"excludeByName": {"Time": True}, "renameByName": {"Value": "behind"}}}
            ],
            sortBy=[g.TableSortByField(displayName="behind", desc=True)],
        ),
        TimeSeries(
            title="Abnormal collectives per minute",
            unit="cpm",
            tooltipMode="multi",
            tooltipSort="desc",
            description=RANKED_NOTE,
            targets=[
                target(
                    ranked(f"sum by (job, rank) (rate({c.COMM_ABNORMAL_OPS.prometheus_name}{{{F}}}[5m])) * 60"),
                    "{{job}} rank {{rank}}",
                )
            ],
        ),
        TimeSeries(
            title="Collective traffic",
            unit="Bps",
            tooltipMode="multi",
            tooltipSort="desc",
            targets=[target(f"sum by (job, op) (rate({c.COMM_BYTES.prometheus_name}{{{F}}}[5m]))", "{{job}} {{op}}")],
        ),
        Table(
            title="Suspects (trainhealth analyze)",
            unit="none",
            targets=[target(f'{c.SUSPECT_SCORE.prometheus_name}{{job=~"$job"}} > 0', instant=True, table=True)],
            transformations=[
                {
                    "id": "organize",
                    "options": {"excludeByName": {"Time": True, "__name__": True}, "renameByName": {"Value": "score"}},
                }
            ],
            sortBy=[g.TableSortByField(displayName="score", desc=True)],
        ),
    ]
    return dashboard(
        UID,
        "trainhealth / Communication",
        "Collective operations by rank: who waits, who lags, and which GPU or link is to blame.",
        arrange(panels, wide=[True, True, False, False, False, False, False, True]),
        alerts,
    )
