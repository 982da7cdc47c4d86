"""What an alert compares with and where on a dashboard it is explained: shared by the rules and the dashboards.

The alert rules (``trainhealth._internal.alerts.rules``) declare a :class:`Limit` and a :class:`PanelRef` per rule;
the dashboards draw the limit on that panel. Both packages import these from here, one layer below them.

>>> Limit(0.05, "above")
Limit(value=0.05, bad='above')
>>> PanelRef("trainhealth-gpu", 1, "GPU up").url()
'http://127.0.0.1:3000/d/trainhealth-gpu?viewPanel=panel-1'
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GRAFANA_URL", "HANG_FLOOR_S", "HUNG_COLLECTIVE_S", "PAUSE_HOLD_S", "WATCHER_STALE_S", "Limit", "PanelRef"]

#: The Grafana that dashboard_url points into; ``trainhealth alerts --grafana-url`` changes it.
GRAFANA_URL = "http://127.0.0.1:3000"
#: HungCollective, RankMissing: the shortest wait that is a hang. Each rank exports its own threshold (3x its
#: longest recent step, collective or checkpoint save, trainhealth._internal.exporters.collectives.watch); the
#: rules use the job's largest, never under this floor, and HUNG_COLLECTIVE_S for jobs whose ranks export none.
HANG_FLOOR_S = 10
HUNG_COLLECTIVE_S = 60
#: Seconds an announced pause (Monitor.pause) keeps holding hang verdicts after it ended: the peers' wait in
#: Prometheus is as old as their last scrape when the pausing rank's end of pause is already scraped. Used by
#: the hang rules and by ``trainhealth analyze``.
PAUSE_HOLD_S = 30
#: Seconds a rank's hang watcher may go without looking (it looks about once a second) while the rank's
#: /metrics still answers, before HangWatcherStopped pages: the hang rules are blind for that rank.
WATCHER_STALE_S = 60


@dataclass(frozen=True)
class Limit:
    """The number a rule compares with, and on which side of it the value is bad (``above`` or ``below``)."""

    value: float
    bad: str

    def __post_init__(self) -> None:
        if self.bad not in ("above", "below"):
            raise ValueError(f"Limit.bad must be 'above' or 'below', got {self.bad!r}")


@dataclass(frozen=True)
class PanelRef:
    """The dashboard panel that explains an alert: dashboard uid, panel id and the panel's title."""

    dashboard: str
    panel_id: int
    title: str

    def url(self, grafana_url: str = GRAFANA_URL) -> str:
        """The panel, alone on its page, in the Grafana at ``grafana_url``."""
        return f"{grafana_url.rstrip('/')}/d/{self.dashboard}?viewPanel=panel-{self.panel_id}"
