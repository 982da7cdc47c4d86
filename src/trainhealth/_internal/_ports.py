"""A free TCP port on 127.0.0.1, for the processes the demo and the lab start (a rendezvous, /metrics).

The port is drawn below the kernel's ephemeral range (``net.ipv4.ip_local_port_range``), so an outgoing
connection made between the draw and the bind (a rendezvous, a scrape) cannot take it, and it is never
handed out twice by one process.

>>> a, b = free_port(), free_port()
>>> a != b and 1024 < a < 65536
True
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]

#: the lowest port drawn: above the registered services most hosts run
_LOWEST = 20000
#: Linux's default ephemeral range, where the kernel's own setting cannot be read
_EPHEMERAL_DEFAULT = (32768, 60999)
#: draws before falling back to a port the kernel picks
_DRAWS = 200
_given: set[int] = set()
_draw = random.Random()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return _EPHEMERAL_DEFAULT


def _binds(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port nothing listens on now, outside the ephemeral range where it can be (the caller binds it next)."""
    low, high = _ephemeral_range()
    outside = (_LOWEST, low - 1) if low - 1 > _LOWEST else (max(high + 1, _LOWEST), 65535)
    for _ in range(_DRAWS):
        port = _draw.randint(*outside)
        if port not in _given and _binds(port):
            _given.add(port)
            return port
    with socket.socket() as probe:  # every draw taken: the kernel's choice
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    _given.add(port)
    return port
