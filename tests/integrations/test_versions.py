"""The trainers' tested ranges are declared once (``_versions.TESTED``): the ``[integrations]`` extra of
pyproject.toml, the installed distribution's metadata and docs/integrations.md say the same ranges."""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from trainhealth._internal.integrations._versions import TESTED, requirement, unsupported

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]


def _ranges(requirements: list[str]) -> dict[str, object]:
    parsed = [Requirement(text) for text in requirements]
    return {r.name: r.specifier for r in parsed}


def _extra() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"][
        "integrations"
    ]


def test_the_integrations_extra_is_the_tested_ranges():
    assert _extra() == [requirement(name) for name in TESTED]


def test_the_installed_metadata_has_the_tested_ranges():
    """An editable install's metadata is written when it is installed: reinstall after changing the extra."""
    try:
        required = metadata.requires("trainhealth") or []
    except metadata.PackageNotFoundError:
        pytest.skip("trainhealth is not installed")
    extra = [text.split(";")[0] for text in required if re.search(r"""extra\s*==\s*["']integrations["']""", text)]
    assert _ranges(extra) == _ranges([requirement(name) for name in TESTED])


def test_the_documented_ranges_are_the_tested_ones():
    text = (ROOT / "docs" / "integrations.md").read_text(encoding="utf-8")
    quoted = re.findall(r"`((?:transformers|accelerate|lightning)[<>=!~][^`]*)`", text)
    assert quoted == [requirement(name) for name in TESTED]


def test_a_changed_range_is_seen_by_each_check(monkeypatch):
    """The checks above compare with TESTED itself: a range changed there no longer matches the extra."""
    monkeypatch.setitem(TESTED, "lightning", ("2.6", "3"))
    assert requirement("lightning") not in _extra()
    assert unsupported("lightning", "2.5.9") is not None and unsupported("lightning", "2.6.0") is None
