"""Building blocks shared by the dashboards: template variables, panels on a grid, the alerts' thresholds.

Panels are placed left to right, two per row (or full width), in the order
they are given. A panel's title is its key on its dashboard and its id follows
from the title alone (:func:`trainhealth._internal.knowledge.limits.panel_id`):
adding, moving or removing a panel changes no other panel's id, so no alert's
link; the same code gives the same ids and positions every time, so generated
JSON is stable.

The numbers an alert fires at and the panel that explains it are declared once, on the alert rule
(``trainhealth._internal.alerts.rules``: ``limit`` and ``panel``). The dashboards do not import the alerts (the two
packages are independent wings of one layer); whoever builds a dashboard passes the rules in, and
:func:`dashboard` draws each rule's limit on the panel the rule names, so the line on the panel and the
number in the rule cannot differ. A rule naming a panel that is not there, or is titled otherwise, is a
definition mistake and raises ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from grafanalib import core as g

from trainhealth._internal import catalog as c
from trainhealth._internal.dashboards.model import BASE_STEP, DATASOURCE, Dashboard, Row, Target, Variable
from trainhealth._internal.knowledge.limits import Limit, PanelRef, panel_id

__all__ = [
    "RANKED",
    "RANKED_NOTE",
    "AlertLike",
    "DCGM_FILTER",
    "GPU_FILTER",
    "RANK_FILTER",
    "SEVERITY_COLORS",
    "annotation",
    "arrange",
    "dashboard",
    "limit_steps",
    "ranked",
    "target",
    "templating",
]

RANK_FILTER = 'job=~"$job",host=~"$host",rank=~"$rank"'
GPU_FILTER = 'job=~"$job",host=~"$host",gpu=~"$gpu"'
#: dcgm-exporter 4.x labels every series gpu, UUID, pci_bus_id, device, modelName, Hostname and
#: DCGM_FI_DRIVER_VERSION (tests/fixtures/dcgm-exporter); its panels filter on Hostname and gpu.
DCGM_FILTER = 'Hostname=~"$host",gpu=~"$gpu"'
#: How many series a per-rank or per-GPU panel draws at each instant: at All (10,000 GPUs) the worst ones,
#: with a host or rank chosen every one of them.
RANKED = 10
RANKED_NOTE = (
    f"At All, the {RANKED} worst at each instant (the store answers in seconds at 10,000 GPUs); choose a host or "
    "rank to see each of its."
)
#: The colour of a limit on a panel: the severity of the alert that fires there.
SEVERITY_COLORS = {"page": "red", "ticket": "orange", "info": "yellow"}
_RANKING = ("info", "ticket", "page")


class AlertLike(Protocol):
    """What the dashboards read of an alert rule (:class:`trainhealth._internal.alerts.rules.AlertRule` has it)."""

    @property
    def name(self) -> str: ...

    @property
    def severity(self) -> str: ...

    @property
    def limit(self) -> Limit | None: ...

    @property
    def panel(self) -> PanelRef | None: ...


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False, table: bool = False) -> Target:
    return Target(
        expr=expr, legendFormat=legend, refId=ref, instant=instant, format="table" if table else "time_series"
    )


def ranked(expr: str, bad: str = "above") -> str:
    """``expr`` cut to the RANKED series worst at each instant: highest where ``bad`` is ``above``, lowest where
    ``below``. A panel over every rank reads every rank's series once and draws a few lines.

    >>> ranked("trainhealth_gpu_up", "below")
    'bottomk(10, trainhealth_gpu_up)'
    """
    if bad not in ("above", "below"):
        raise ValueError(f"ranked: bad must be 'above' or 'below', got {bad!r}")
    return f"{'topk' if bad == 'above' else 'bottomk'}({RANKED}, {expr})"


def _variable(name: str, query: str, label: str) -> Variable:
    return Variable(name=name, label=label, query=query, includeAll=True, multi=True, allValue=".*", refresh=2, sort=3)


def templating(gpu: bool = False) -> g.Templating:
    """datasource, job name, job, host, rank (and gpu): every panel query filters on job, host, rank (gpu).

    ``job`` is the job label, each run's own id; ``job_name`` (the runs' logical name, a label of
    ``trainhealth_rank_info`` only) narrows the runs ``job`` offers. Panels that compare ranks keep ``job`` in
    their ``by``, so ranks of two jobs selected together are never merged."""
    info = c.RANK_INFO.prometheus_name
    variables = [
        Variable(name="datasource", label="Data source", query="prometheus", type="datasource"),
        _variable("job_name", f"label_values({info}, job_name)", "Job name"),
        _variable("job", f'label_values({info}{{job_name=~"$job_name"}}, job)', "Job (run)"),
        _variable("host", f'label_values({info}{{job=~"$job"}}, host)', "Host"),
        _variable("rank", f'label_values({info}{{job=~"$job",host=~"$host"}}, rank)', "Rank"),
    ]
    if gpu:
        variables.append(_variable("gpu", f'label_values({c.GPU_INFO.prometheus_name}{{host=~"$host"}}, gpu)', "GPU"))
    return g.Templating(list=variables)


def arrange(panels: Sequence[Any], wide: Sequence[bool] | None = None, height: int = 8) -> list[Any]:
    """Give ``panels`` ids (from their titles) and grid positions: two per row, or the full width where ``wide``
    (rows: always). Two panels with one id (one title) raise ``ValueError``."""
    x = y = 0
    placed = []
    titles: dict[int, str] = {}
    for index, panel in enumerate(panels):
        key = panel_id(panel.title)
        if key in titles:
            raise ValueError(f"panels {titles[key]!r} and {panel.title!r} would share id {key}: retitle one")
        titles[key] = panel.title
        row = isinstance(panel, Row)
        full = bool(wide and wide[index]) or row
        width = 24 if full else 12
        if x + width > 24:
            x, y = 0, y + height
        rows = 1 if row else height
        panel.id = key
        panel.gridPos = g.GridPos(h=rows, w=width, x=x, y=y)
        x += width
        if x >= 24 or row:
            x, y = 0, y + rows
        placed.append(panel)
    return placed


def limit_steps(limits: Iterable[tuple[float, str, str]]) -> list[dict[str, Any]]:
    """Threshold steps for ``(value, bad, severity)`` limits: ``bad`` is ``above`` or ``below`` the value.

    >>> [(s["color"], s["value"]) for s in limit_steps([(0.05, "above", "ticket")])]
    [('green', None), ('orange', 0.05)]
    >>> [(s["color"], s["value"]) for s in limit_steps([(0.9, "below", "ticket"), (0.7, "below", "page")])]
    [('red', None), ('orange', 0.7), ('green', 0.9)]
    """
    worst: dict[float, str] = {}
    sides = set()
    for value, bad, severity in limits:
        if bad not in ("above", "below") or severity not in SEVERITY_COLORS:
            raise ValueError(
                f"a limit is bad 'above' or 'below' with a severity in {sorted(SEVERITY_COLORS)}, "
                f"got {bad!r}, {severity!r}"
            )
        sides.add(bad)
        if value not in worst or _RANKING.index(severity) > _RANKING.index(worst[value]):
            worst[value] = severity
    if not worst:
        return [dict(BASE_STEP)]
    if len(sides) > 1:
        raise ValueError(f"limits on one panel must all be bad above or all below their value: {sorted(worst)}")
    values = sorted(worst)
    if sides == {"above"}:
        return [dict(BASE_STEP)] + [{"color": SEVERITY_COLORS[worst[v]], "value": v} for v in values]
    colors = [SEVERITY_COLORS[worst[v]] for v in values] + ["green"]
    return [{"color": colors[0], "value": None}] + [{"color": col, "value": v} for v, col in zip(values, colors[1:])]


def _draw_limits(uid: str, panels: Sequence[Any], alerts: Iterable[AlertLike]) -> None:
    by_id = {panel.id: panel for panel in panels}
    limits: dict[int, list[tuple[float, str, str]]] = {}
    for alert in alerts:
        ref = alert.panel
        if ref is None or ref.dashboard != uid:
            continue
        panel = by_id.get(ref.panel_id)
        if panel is None or panel.title != ref.title or isinstance(panel, Row):
            raise ValueError(f"alert {alert.name} points at panel {ref.title!r} of {uid}: no such panel")
        if alert.limit is not None:
            limits.setdefault(ref.panel_id, []).append((alert.limit.value, alert.limit.bad, alert.severity))
    for key, drawn in limits.items():
        by_id[key].thresholds = limit_steps(drawn)


def dashboard(
    uid: str,
    title: str,
    description: str,
    panels: list[Any],
    alerts: Iterable[AlertLike],
    *,
    gpu: bool = False,
    annotations: list[dict[str, Any]] | None = None,
) -> Dashboard:
    """A dashboard of placed ``panels``, with the limits of the ``alerts`` that point at them drawn in."""
    _draw_limits(uid, panels, alerts)
    return Dashboard(
        uid=uid,
        title=title,
        description=description,
        tags=["trainhealth"],
        panels=panels,
        templating=templating(gpu),
        annotations=g.Annotations(list=annotations or []),
        time=g.Time("now-6h", "now"),
        refresh="30s",
        timezone="utc",
        editable=True,
        graphTooltip=1,
        schemaVersion=42,
        version=1,
    )


def annotation(name: str, expr: str, color: str, title: str) -> dict[str, Any]:
    """A Prometheus annotation: a mark wherever ``expr`` has a value."""
    return {
        "name": name,
        "datasource": dict(DATASOURCE),
        "enable": True,
        "hide": False,
        "expr": expr,
        "iconColor": color,
        "step": "60s",
        "titleFormat": title,
        "useValueForTime": False,
    }
