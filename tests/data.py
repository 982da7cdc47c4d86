"""External data the tests read (NAB, the StragglerAnalysis traces): found through one setting.

``TRAINHEALTH_DATA`` names the directory; by default ``../shared/data`` beside the checkout. A test that
needs a data set it cannot find is skipped with the reason, so a fresh clone's test run passes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(os.environ.get("TRAINHEALTH_DATA") or Path(__file__).resolve().parents[1].parent / "shared" / "data")


def data_dir(name: str) -> Path:
    return ROOT / name


def needs(name: str) -> pytest.MarkDecorator:
    """Skip unless the data set ``name`` is present under :data:`ROOT`."""
    return pytest.mark.skipif(
        not data_dir(name).is_dir(), reason=f"data set {name!r} not found in {ROOT} (set TRAINHEALTH_DATA)"
    )
