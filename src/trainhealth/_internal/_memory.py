"""Give the memory a finished stage freed back to the system.

glibc's malloc keeps freed heap memory mapped for reuse, and numpy's many
medium-sized temporaries leave it in holes that the next stage's arrays do not
fit: the process's resident size then grows with each stage of an analysis as
if nothing had been freed. ``malloc_trim`` hands the free pages back; on
another C library or system it does nothing.

>>> release_freed_memory() in (True, False)
True
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

__all__ = ["release_freed_memory"]


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # the C library the interpreter runs on
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


def release_freed_memory() -> bool:
    """Return freed heap memory to the system (glibc's ``malloc_trim(0)``); whether it was available."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
