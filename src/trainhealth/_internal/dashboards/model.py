"""grafanalib's objects, writing the panel shapes current Grafana reads.

grafanalib 0.7 writes the JSON older Grafana accepted: a datasource as a bare string, ``null`` for every
unset option, keys Grafana dropped long ago (``span``, ``height``, ``error``, ``rows``, ``style``,
``sharedCrosshair`` ...) and panel options that moved (a heatmap's ``cards`` and ``xAxis``, a table's
``columns``). Grafana's published dashboard schema (``dashboard.jsonschema.json`` of the Grafana foundation
SDK, kept in tests/fixtures/grafana-schema) rejects all of them. The classes here subclass grafanalib's and
override ``to_json_data`` to write only what that schema and each panel plugin's schema define; the rest of
grafanalib (its attrs fields, ``GridPos``, ``Templating``, ``Time``, the JSON encoder) is used as it is.

Each panel carries a unit (``fieldConfig.defaults.unit``) and thresholds; panels without an alert behind
them have a single base step, so no made-up number is drawn.

>>> import json
>>> from grafanalib._gen import DashboardEncoder
>>> panel = TimeSeries(title="Step time", unit="s", targets=[Target(expr="up", refId="A")])
>>> data = json.loads(json.dumps(panel.to_json_data(), cls=DashboardEncoder))
>>> data["type"], data["datasource"], data["fieldConfig"]["defaults"]["unit"]
('timeseries', {'type': 'prometheus', 'uid': '${datasource}'}, 's')
>>> sorted(k for k, v in data.items() if v is None)
[]
"""

from __future__ import annotations

from typing import Any

from grafanalib import core as g

from trainhealth._internal.catalog import MetricSpec, Unit

__all__ = [
    "BASE_STEP",
    "DATASOURCE",
    "Dashboard",
    "Heatmap",
    "Row",
    "Stat",
    "Table",
    "Target",
    "Text",
    "TimeSeries",
    "Variable",
    "unit_of",
]

#: Every query and panel reads the Prometheus datasource the dashboard's ``datasource`` variable selects.
DATASOURCE: dict[str, str] = {"type": "prometheus", "uid": "${datasource}"}
#: The thresholds of a panel no alert stands behind: one base step, nothing drawn.
BASE_STEP: dict[str, Any] = {"color": "green", "value": None}

#: The catalogue's units as Grafana unit ids (grafana-data's valueFormats/categories.ts).
_UNITS = {
    Unit.SECONDS: "s",
    Unit.BYTES: "bytes",
    Unit.CELSIUS: "celsius",
    Unit.WATTS: "watt",
    Unit.JOULES: "joule",
    Unit.HERTZ: "hertz",
    Unit.RATIO: "percentunit",
    Unit.BYTES_PER_SECOND: "Bps",
    Unit.TOKENS_PER_SECOND: "suffix: tokens/s",
    Unit.DIMENSIONLESS: "none",
    Unit.STEPS: "none",
    Unit.TOKENS: "short",
    Unit.ERRORS: "short",
    Unit.EVENTS: "short",
    Unit.OPERATIONS: "short",
    Unit.RECORDS: "short",
}


def unit_of(spec: MetricSpec) -> str:
    """The Grafana unit of a catalogue metric.

    >>> from trainhealth._internal import catalog as c
    >>> unit_of(c.TRAIN_MFU), unit_of(c.GPU_POWER), unit_of(c.TRAIN_LOSS)
    ('percentunit', 'watt', 'none')
    """
    return _UNITS[spec.unit]


class Target(g.Target):
    """A Prometheus query (``expr``), instant or over the range, as Grafana's Prometheus query editor saves it."""

    def to_json_data(self) -> dict[str, Any]:
        return {
            "datasource": dict(DATASOURCE),
            "editorMode": "code",
            "expr": self.expr,
            "format": self.format,
            "instant": self.instant,
            "range": not self.instant,
            "legendFormat": self.legendFormat,
            "refId": self.refId,
        }


def _thresholds(panel: Any) -> dict[str, Any]:
    return {"mode": "absolute", "steps": list(panel.thresholds) or [dict(BASE_STEP)]}


def _panel(
    panel: Any,
    kind: str,
    options: dict[str, Any],
    defaults: dict[str, Any],
    overrides: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The parts every panel shares; ``defaults`` are the plugin's field defaults (unit, custom, mappings)."""
    data: dict[str, Any] = {
        "type": kind,
        "title": panel.title,
        "datasource": dict(DATASOURCE),
        "targets": panel.targets,
        "options": options,
        "fieldConfig": {"defaults": {"thresholds": _thresholds(panel), **defaults}, "overrides": overrides or []},
    }
    if panel.id is not None:
        data["id"] = panel.id
    if panel.gridPos is not None:
        data["gridPos"] = panel.gridPos
    if panel.description:
        data["description"] = panel.description
    if panel.transformations:
        data["transformations"] = panel.transformations
    return data


class TimeSeries(g.TimeSeries):
    """A time series; thresholds, where an alert stands behind the panel, are drawn as dashed lines."""

    def to_json_data(self) -> dict[str, Any]:
        scale: dict[str, Any] = {"type": self.scaleDistributionType}
        if self.scaleDistributionType == "log":
            scale["log"] = self.scaleDistributionLog
        custom = {
            "drawStyle": self.drawStyle,
            "lineWidth": self.lineWidth,
            "fillOpacity": self.fillOpacity,
            "showPoints": self.showPoints,
            "spanNulls": self.spanNulls,
            "axisPlacement": self.axisPlacement,
            "scaleDistribution": scale,
            "thresholdsStyle": {"mode": "dashed" if len(self.thresholds) > 1 else "off"},
        }
        options = {
            "legend": {
                "displayMode": self.legendDisplayMode,
                "placement": self.legendPlacement,
                "showLegend": True,
                "calcs": list(self.legendCalcs),
            },
            "tooltip": {"mode": self.tooltipMode, "sort": self.tooltipSort},
        }
        return _panel(
            self,
            "timeseries",
            options,
            {
                "unit": self.unit or "short",
                "color": {"mode": self.colorMode},
                "custom": custom,
                "mappings": list(self.mappings),
            },
        )


class Stat(g.Stat):
    """A single value (``format`` is its unit, as in grafanalib)."""

    def to_json_data(self) -> dict[str, Any]:
        options = {
            "graphMode": self.graphMode,
            "colorMode": self.colorMode,
            "justifyMode": "auto",
            "textMode": self.textMode,
            "wideLayout": True,
            "showPercentChange": False,
            "percentChangeColorMode": "standard",
            "orientation": self.orientation,
            "reduceOptions": {"calcs": [self.reduceCalc], "fields": self.fields, "values": False},
        }
        return _panel(
            self,
            "stat",
            options,
            {"unit": self.format, "color": {"mode": "thresholds"}, "mappings": list(self.mappings)},
        )


class Table(g.Table):
    """A table; with ``colored`` its numeric cells (the value column: the others are labels) take the
    thresholds' colours. The override matches fields by value (``byValue``): the schema types a matcher's
    options as an object, which a ``byName`` matcher's string is not."""

    def __init__(self, *args: Any, colored: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.colored = colored

    def to_json_data(self) -> dict[str, Any]:
        options: dict[str, Any] = {"showHeader": self.showHeader, "frameIndex": 0, "cellHeight": "sm"}
        if self.sortBy:
            options["sortBy"] = [{"displayName": s.displayName, "desc": s.desc} for s in self.sortBy]
        custom = {"align": self.align, "inspect": False, "cellOptions": {"type": "auto"}}
        numeric = {"id": "byValue", "options": {"reducer": "max", "op": "gte", "value": 0}}
        overrides = (
            [{"matcher": numeric, "properties": [{"id": "custom.cellOptions", "value": {"type": "color-background"}}]}]
            if self.colored
            else []
        )
        return _panel(
            self,
            "table",
            options,
            {
                "unit": self.unit or "short",
                "color": {"mode": "thresholds"},
                "custom": custom,
                "mappings": list(self.mappings),
            },
            overrides,
        )


class Heatmap(g.Heatmap):
    """Pre-bucketed series (one row per series, no calculation), coloured with an Oranges scheme; ``unit`` is
    the unit of the cells' values."""

    def __init__(self, *args: Any, unit: str = "short", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.unit = unit

    def to_json_data(self) -> dict[str, Any]:
        options = {
            "calculate": False,
            "cellGap": 1,
            "showValue": "never",
            "rowsFrame": {"layout": "auto"},
            "color": {
                "mode": "scheme",
                "scheme": "Oranges",
                "fill": "dark-orange",
                "exponent": 0.5,
                "steps": 64,
                "reverse": False,
            },
            "yAxis": {"axisPlacement": "left", "unit": "none"},
            "cellValues": {"unit": self.unit},
            "legend": {"show": True},
            "tooltip": {"mode": "single", "yHistogram": False},
            "exemplars": {"color": "rgba(255,0,255,0.7)"},
        }
        custom = {
            "scaleDistribution": {"type": "linear"},
            "hideFrom": {"legend": False, "tooltip": False, "viz": False},
        }
        return _panel(self, "heatmap", options, {"unit": self.unit, "custom": custom})


class Text(g.Text):
    """Markdown text; its unit is ``none`` (there is no value to format)."""

    def to_json_data(self) -> dict[str, Any]:
        data = _panel(self, "text", {"mode": self.mode, "content": self.content}, {"unit": "none"})
        del data["datasource"], data["targets"]
        return data


class Row(g.RowPanel):
    """A row header (expanded: its panels follow it on the grid)."""

    def to_json_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"type": "row", "id": self.id, "title": self.title, "collapsed": False, "panels": []}
        if self.gridPos is not None:
            data["gridPos"] = self.gridPos
        return data


class Variable(g.Template):
    """A template variable: ``datasource``, or a Prometheus ``label_values`` query with All selected."""

    def to_json_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "type": self.type,
            "name": self.name,
            "label": self.label,
            "hide": self.hide,
            "query": self.query,
            "options": [],
            "skipUrlSync": False,
        }
        if self.type == "datasource":
            return {
                **data,
                "current": {"text": "Prometheus", "value": "prometheus"},
                "multi": False,
                "includeAll": False,
                "refresh": 1,
                "regex": "",
            }
        return {
            **data,
            "datasource": dict(DATASOURCE),
            "definition": self.query,
            "refresh": self.refresh,
            "sort": self.sort,
            "multi": self.multi,
            "includeAll": self.includeAll,
            "allValue": self.allValue,
            "current": {"text": ["All"], "value": ["$__all"]},
            "regex": "",
        }


class Dashboard(g.Dashboard):
    """A dashboard without the keys Grafana dropped (``rows``, ``style``, ``sharedCrosshair``, ``hideControls``)."""

    def to_json_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "annotations": self.annotations,
            "description": self.description,
            "editable": self.editable,
            "fiscalYearStartMonth": 0,
            "graphTooltip": self.graphTooltip,
            "links": list(self.links),
            "panels": self.panels,
            "refresh": self.refresh,
            "schemaVersion": self.schemaVersion,
            "tags": self.tags,
            "templating": self.templating,
            "time": self.time,
            "timepicker": {},
            "timezone": self.timezone,
            "title": self.title,
            "version": self.version,
        }
        if self.uid is not None:
            data["uid"] = self.uid
        return data
