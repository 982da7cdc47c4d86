"""Building blocks shared by the dashboards: the datasource, the template variables, panels on a grid.

Panels are placed left to right, two per row (or full width), in the order
they are given, and numbered from 1: the same code gives the same ids and
positions every time, so generated JSON is stable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grafanalib import core as g

from trainhealth import catalog as c

__all__ = ["DATASOURCE", "DCGM_FILTER", "GPU_FILTER", "RANK_FILTER", "annotation", "arrange", "dashboard", "target",
           "templating"]

DATASOURCE = "${datasource}"
RANK_FILTER = 'job=~"$job",host=~"$host",rank=~"$rank"'
GPU_FILTER = 'job=~"$job",host=~"$host",gpu=~"$gpu"'
#: dcgm-exporter labels its series with Hostname and gpu; its panels filter on those.
DCGM_FILTER = 'Hostname=~"$host",gpu=~"$gpu"'


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False, table: bool = False) -> g.Target:
    return g.Target(expr=expr, legendFormat=legend, refId=ref, instant=instant, datasource=DATASOURCE,
                    format="table" if table else "time_series")


def _variable(name: str, query: str, label: str) -> g.Template:
    return g.Template(name=name, label=label, query=query, dataSource=DATASOURCE, includeAll=True, multi=True,
                      allValue=".*", default="All", refresh=2, sort=3)


def templating(gpu: bool = False) -> g.Templating:
    """datasource, job, host, rank (and gpu): every panel query filters on them."""
    info = c.RANK_INFO.prometheus_name
    variables = [
        g.Template(name="datasource", label="Data source", query="prometheus", type="datasource", default="Prometheus"),
        _variable("job", f"label_values({info}, job)", "Job"),
        _variable("host", f'label_values({info}{{job=~"$job"}}, host)', "Host"),
        _variable("rank", f'label_values({info}{{job=~"$job",host=~"$host"}}, rank)', "Rank"),
    ]
    if gpu:
        variables.append(_variable("gpu", f'label_values({c.GPU_INFO.prometheus_name}{{host=~"$host"}}, gpu)', "GPU"))
    return g.Templating(list=variables)


def arrange(panels: Sequence[Any], wide: Sequence[bool] | None = None, height: int = 8) -> list[Any]:
    """Give ``panels`` ids and grid positions: two per row, or the full width where ``wide``."""
    x = y = 0
    placed = []
    for number, panel in enumerate(panels, 1):
        full = bool(wide and wide[number - 1]) or isinstance(panel, g.RowPanel)
        width = 24 if full else 12
        if x + width > 24:
            x, y = 0, y + height
        rows = 1 if isinstance(panel, g.RowPanel) else height
        panel.id = number
        panel.gridPos = g.GridPos(h=rows, w=width, x=x, y=y)
        x += width
        if x >= 24 or isinstance(panel, g.RowPanel):
            x, y = 0, y + rows
        placed.append(panel)
    return placed


def dashboard(uid: str, title: str, description: str, panels: list[Any], *, gpu: bool = False,
              annotations: list[dict[str, Any]] | None = None) -> g.Dashboard:
    return g.Dashboard(
        uid=uid, title=title, description=description, tags=["trainhealth"], panels=panels,
        templating=templating(gpu), annotations=g.Annotations(list=annotations or []),
        time=g.Time("now-6h", "now"), refresh="30s", timezone="utc", editable=True, schemaVersion=39, version=1,
    )


def annotation(name: str, expr: str, color: str, title: str) -> dict[str, Any]:
    """A Prometheus annotation: a mark wherever ``expr`` has a value."""
    return {"name": name, "datasource": DATASOURCE, "enable": True, "expr": expr, "iconColor": color,
            "step": "60s", "titleFormat": title, "useValueForTime": False}
