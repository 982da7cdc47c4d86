"""Background threads hand the interpreter back to the training thread between small pieces of work.

A training step on the host is many short calls into torch, each of which releases the GIL and takes
it back. When a background thread (the export thread's detectors, a /metrics render) holds the GIL as
the training thread's call returns, the training thread waits: until the holder blocks, or until the
switch interval (:func:`sys.getswitchinterval`, 5 ms by default) runs out. One burst of Python on the
export thread can so cost the training thread more than the burst itself (the "convoy effect",
https://github.com/python/cpython/issues/52194). A thread that calls :func:`yield_gil` between pieces
of work of a few hundred microseconds lets a waiting training thread in at once.

>>> yield_gil()  # a no-op cost (one system call) when no other thread waits
"""

from __future__ import annotations

import time

__all__ = ["yield_gil"]


def yield_gil() -> None:
    """Release the GIL for a moment, so that a thread waiting for it runs now rather than at the end of
    the switch interval."""
    time.sleep(0)
