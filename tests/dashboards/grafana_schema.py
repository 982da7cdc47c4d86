"""Validation of dashboard JSON against Grafana's published schemas (tests/fixtures/grafana-schema).

The dashboard schema checks the whole document; each panel's ``options`` and ``fieldConfig.defaults.custom``
are then checked against its plugin's schema (``Options`` and ``FieldConfig``), where the SDK has one.
A violation is one leaf error: where a value fails every branch of a ``oneOf``/``anyOf`` (a panel is a
``Panel`` or a ``RowPanel``), the branch with the fewest errors is the one reported.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft7Validator
from jsonschema.exceptions import ValidationError

SCHEMAS = Path(__file__).resolve().parents[1] / "fixtures" / "grafana-schema"
#: Panel plugins with a schema here (a row is part of the dashboard schema).
PLUGINS = ("heatmap", "stat", "table", "text", "timeseries")


@cache
def _schema(name: str) -> dict[str, Any]:
    return json.loads((SCHEMAS / f"{name}.jsonschema.json").read_text(encoding="utf-8"))


@cache
def _validator(name: str, definition: str | None) -> Draft7Validator | None:
    schema = _schema(name)
    if definition is not None:
        if definition not in schema["definitions"]:
            return None
        schema = {**schema, "$ref": f"#/definitions/{definition}"}
    return Draft7Validator(schema)


def _leaves(error: ValidationError) -> list[ValidationError]:
    if not error.context:
        return [error]
    branches: dict[Any, list[ValidationError]] = {}
    for sub in error.context:
        branches.setdefault(sub.schema_path[0], []).append(sub)
    best = min(branches.values(), key=lambda errors: sum(len(_leaves(e)) for e in errors))
    return [leaf for sub in best for leaf in _leaves(sub)]


def _errors(validator: Draft7Validator, instance: Any, where: str) -> list[str]:
    found = []
    for error in validator.iter_errors(instance):
        for leaf in _leaves(error):
            path = "/".join(str(p) for p in leaf.absolute_path)
            found.append(f"{where}/{path}: {leaf.message[:160]}")
    return found


def violations(dashboard: dict[str, Any], plugins: bool = True) -> list[str]:
    """Every place ``dashboard`` breaks the dashboard schema or (``plugins``) its panels' plugin schemas."""
    validator = _validator("dashboard", None)
    assert validator is not None
    found = _errors(validator, dashboard, dashboard.get("uid", "?"))
    for panel in dashboard.get("panels", []) if plugins else []:
        kind = panel.get("type")
        where = f"{dashboard.get('uid', '?')}/panel {panel.get('id')} ({kind})"
        if kind == "row" or not isinstance(kind, str):
            continue
        if kind not in PLUGINS:
            found.append(f"{where}: no schema for panel type {kind!r} in {SCHEMAS.name}")
            continue
        options = _validator(kind, "Options")
        if options is not None:
            found += _errors(options, panel.get("options", {}), f"{where}/options")
        custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom")
        field_config = _validator(kind, "FieldConfig")
        if field_config is not None and custom is not None:
            found += _errors(field_config, custom, f"{where}/fieldConfig/defaults/custom")
        elif field_config is None and custom:
            found.append(f"{where}/fieldConfig/defaults/custom: the {kind} plugin defines no custom field config")
    return found


def main(paths: list[str]) -> None:
    """Print the violations of dashboard JSON files: ``python -m tests.dashboards.grafana_schema FILE...``."""
    totals = [0, 0]
    for path in paths:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        counts = len(violations(data, plugins=False)), len(violations(data))
        totals = [t + n for t, n in zip(totals, counts)]
        print(f"{path}: {counts[0]} against the dashboard schema, {counts[1]} with the panel plugins' schemas")
    print(f"total: {totals[0]} against the dashboard schema, {totals[1]} with the panel plugins' schemas")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
