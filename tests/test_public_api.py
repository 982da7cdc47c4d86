"""The public surface: every name a user may import, from one path each, as docs/api.md lists them.

A module is public when no part of its dotted path starts with ``_``; everything else
(``trainhealth._internal``) may change between releases. The surface is pinned here, so adding
or removing a public name is a decision this file and docs/api.md record.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import trainhealth

ROOT = Path(__file__).resolve().parents[1]

SURFACE = {
    "trainhealth": ["ConfigError", "Identity", "LayerGroupStats", "Monitor", "Settings", "StepStats", "__version__"],
    "trainhealth.comm": ["CollectiveLogger", "install", "installed", "instrument_ddp", "probe_links", "uninstall"],
    "trainhealth.catalog": ["CATALOG", "MetricKind", "MetricSpec", "Unit", "by_otel_name", "by_prometheus_name"],
    "trainhealth.traces": [
        "Topology",
        "Trace",
        "TraceError",
        "read_trace",
        "read_trace_file",
        "validate",
        "write_trace",
    ],
    "trainhealth.detectors": ["DETECTORS", "Detector", "WatchSpec", "build_detector", "parse_spec"],
    "trainhealth.localize": [
        "VERDICTS",
        "Analyzer",
        "JobResults",
        "LocalizationResult",
        "PrometheusSource",
        "Suspect",
        "Thresholds",
        "TraceDirectory",
        "localize",
    ],
    "trainhealth.integrations": [],
    "trainhealth.integrations.accelerate": ["TrainhealthTracker"],
    "trainhealth.integrations.huggingface": ["TrainhealthCallback"],
    "trainhealth.integrations.lightning": ["TrainhealthCallback"],
    "trainhealth.integrations.torchtitan": ["TORCHTITAN_KEYS", "TrainhealthLogger"],
}

#: The trainer each integration module needs at import (the test reads its names without it).
TRAINERS = {
    "trainhealth.integrations.accelerate": "accelerate",
    "trainhealth.integrations.huggingface": "transformers",
    "trainhealth.integrations.lightning": "lightning",
}


def _public_modules() -> list[str]:
    found = ["trainhealth"]
    for info in pkgutil.walk_packages(trainhealth.__path__, "trainhealth."):
        if not any(part.startswith("_") for part in info.name.split(".")[1:]):
            found.append(info.name)
    return sorted(found)


def _declared(module: str) -> list[str]:
    """The module's ``__all__`` read from its source (no import: a trainer need not be installed)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    for node in ast.parse(Path(spec.origin).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return []


def _import(module: str):
    if module in TRAINERS:
        pytest.importorskip(TRAINERS[module])
    return importlib.import_module(module)


def test_the_public_modules_are_the_pinned_ones():
    assert _public_modules() == sorted(SURFACE)


@pytest.mark.parametrize("module", sorted(SURFACE))
def test_each_public_module_declares_exactly_its_pinned_names(module):
    assert sorted(_declared(module)) == sorted(SURFACE[module])


def test_the_surface_is_small():
    names = [f"{module}.{name}" for module, names in SURFACE.items() for name in names]
    assert len(names) == len(set(names)) and len(names) <= 60, len(names)


@pytest.mark.parametrize("module", sorted(SURFACE))
def test_every_name_resolves_and_nothing_else_of_ours_is_reachable_there(module):
    imported = _import(module)
    for name in SURFACE[module]:
        assert getattr(imported, name) is not None, name
    for name, value in vars(imported).items():
        if name.startswith("_") or name in SURFACE[module] or inspect.ismodule(value):
            continue
        home = getattr(value, "__module__", None) or ""
        assert not home.startswith("trainhealth"), f"{module}.{name} is a second path to {home}.{name}"


def test_each_public_object_has_one_public_path():
    paths: dict[int, list[str]] = {}
    for module, names in SURFACE.items():
        if module in TRAINERS and importlib.util.find_spec(TRAINERS[module]) is None:
            continue
        imported = importlib.import_module(module)
        for name in names:
            value = getattr(imported, name)
            if inspect.isclass(value) or inspect.isfunction(value):
                paths.setdefault(id(value), []).append(f"{module}.{name}")
    assert [found for found in paths.values() if len(found) > 1] == []


def test_docs_api_lists_the_surface_name_by_name():
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    headed = re.findall(r"^## `([\w.]+)`", text, flags=re.M)
    listed = {module: re.findall(r"^- `(\w+)`", section, flags=re.M) for module, section in _sections(text)}
    assert headed == list(SURFACE)
    assert {module: sorted(names) for module, names in listed.items()} == {
        module: sorted(names) for module, names in SURFACE.items()
    }


def _sections(text: str) -> list[tuple[str, str]]:
    parts = re.split(r"^## `([\w.]+)`$", text, flags=re.M)
    return list(zip(parts[1::2], parts[2::2]))
