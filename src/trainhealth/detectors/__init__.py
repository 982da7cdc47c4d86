"""Streaming detectors and analyses over exported signals.

The hang analysis loads on first use (PEP 562): the Monitor's detectors do not need it.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["HangSuspect", "RankCommState", "find_hangs", "states_from_samples"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.hangs"), name)
