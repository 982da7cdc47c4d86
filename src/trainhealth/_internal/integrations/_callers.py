"""The trainer object a hook was called from, for libraries that do not hand it to their hooks."""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

__all__ = ["calling_instance"]


def calling_instance(kind: type, depth: int) -> Any:
    """The nearest ``self`` of type ``kind`` among the callers of the function that calls this one, looking at most
    ``depth`` frames up; ``None`` when there is none."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, kind):
            return candidate
        frame = frame.f_back
    return None
