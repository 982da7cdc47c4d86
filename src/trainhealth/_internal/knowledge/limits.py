"""What an alert compares with and where on a dashboard it is explained: shared by the rules and the dashboards.

The alert rules (``trainhealth._internal.alerts.rules``) declare a :class:`Limit` and a :class:`PanelRef` per rule;
the dashboards draw the limit on that panel. Both packages import these from here, one layer below them. The hang
watcher (``trainhealth._internal.exporters.collectives.watch``) and the analyzer (``trainhealth._internal.localize``)
read the hang numbers from here too; the floor is the ``comm_hang_floor`` setting's default, declared with the
setting (``trainhealth._internal.config.groups``, the one layer the settings and this module both read).

A panel is named by its dashboard and title, its key; its id follows from the title alone (:func:`panel_id`), so
adding, moving or removing other panels changes no link and no rule.

>>> Limit(0.05, "above")
Limit(value=0.05, bad='above')
>>> PanelRef("trainhealth-gpu", "GPU up").url()
'http://127.0.0.1:3000/d/trainhealth-gpu?viewPanel=panel-1566511428'
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from trainhealth._internal.config.groups import HANG_FLOOR_S

__all__ = [
    "GRAFANA_URL",
    "HANG_FLOOR_S",
    "HUNG_COLLECTIVE_S",
    "PAUSE_HOLD_S",
    "WATCHER_STALE_S",
    "Limit",
    "PanelRef",
    "panel_id",
]

#: The Grafana that dashboard_url points into; ``trainhealth alerts --grafana-url`` changes it.
GRAFANA_URL = "http://127.0.0.1:3000"
# HANG_FLOOR_S (HungCollective, RankMissing, the watcher's default floor): the shortest wait that is a hang. Each
# rank exports its own threshold (3x its longest recent step, collective or checkpoint save,
# trainhealth._internal.exporters.collectives.watch); the rules use the job's largest, never under this floor, and
# HUNG_COLLECTIVE_S for jobs whose ranks export none.
#: The hang threshold until a job's first step (set-up barriers, a slow first step, the first compilation: the
#: watcher's start-up value), and the one the rules and ``trainhealth analyze`` use for ranks that export none.
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


def panel_id(title: str) -> int:
    """The id of the panel titled ``title``: the CRC-32 of the title (UTF-8), from 1 to 2**31 - 1. It depends on
    nothing else, so a panel keeps its id, and its links, whatever is added around it; the dashboards refuse two
    panels of one dashboard with the same id (``trainhealth._internal.dashboards.layout.arrange``).

    >>> panel_id("GPU up") == panel_id("GPU up") != panel_id("GPU down")
    True
    """
    return zlib.crc32(title.encode("utf-8")) % (2**31 - 1) + 1


@dataclass(frozen=True)
class PanelRef:
    """The dashboard panel that explains an alert: dashboard uid and the panel's title, its key there."""

    dashboard: str
    title: str

    @property
    def panel_id(self) -> int:
        """The panel's id on its dashboard (:func:`panel_id` of its title)."""
        return panel_id(self.title)

    def url(self, grafana_url: str = GRAFANA_URL) -> str:
        """The panel, alone on its page, in the Grafana at ``grafana_url``."""
        return f"{grafana_url.rstrip('/')}/d/{self.dashboard}?viewPanel=panel-{self.panel_id}"
