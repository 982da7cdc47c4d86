"""A free TCP port on 127.0.0.1, for the rendezvous of the lab's rank processes.

>>> 0 < free_port() < 65536
True
"""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port() -> int:
    """A port nothing listens on now (the caller's processes bind it next)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
