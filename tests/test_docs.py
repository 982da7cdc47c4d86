"""Generated documents are current: regenerate with the command named in the failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainhealth._internal.cli.docgen import GENERATED_DOCS

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = {
    "docs/metrics.md": "trainhealth metrics --markdown > docs/metrics.md",
    "docs/configuration.md": "trainhealth config --markdown > docs/configuration.md",
}


@pytest.mark.parametrize("path", sorted(GENERATED_DOCS))
def test_generated_document_is_current(path):
    committed = (ROOT / path).read_text(encoding="utf-8") if (ROOT / path).exists() else ""
    assert committed == GENERATED_DOCS[path](), f"{path} is stale: run `{COMMANDS[path]}`"


def test_every_catalogue_metric_is_documented():
    text = (ROOT / "docs/metrics.md").read_text(encoding="utf-8")
    from trainhealth._internal.catalog import CATALOG

    for spec in CATALOG:
        assert f"`{spec.prometheus_name}`" in text


def test_every_metric_has_its_three_names_in_one_row():
    """/metrics name, OTLP name and unit, and the name after the Collector's translation, side by side."""
    from trainhealth._internal.catalog import CATALOG

    rows = (ROOT / "docs/metrics.md").read_text(encoding="utf-8").splitlines()
    for spec in CATALOG:
        (row,) = [r for r in rows if r.startswith(f"| `{spec.prometheus_name}` | `{spec.otel_name}` |")]
        assert f"| `{spec.translated_name}` |" in row
        assert (f"| `{spec.otel_unit}` |" if spec.otel_unit else "| — |") in row
