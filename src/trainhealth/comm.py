"""``import trainhealth.comm``: the collective logger's user API (install, uninstall, instrument_ddp).

The code lives in :mod:`trainhealth.exporters.collectives.install`; every other name is looked up
there on first use, so this path stays the one documented to users.
"""

from __future__ import annotations

from typing import Any

from trainhealth.exporters.collectives import install as _install
from trainhealth.exporters.collectives.install import (
    CollectiveLogger,
    install,
    installed,
    instrument_ddp,
    uninstall,
)

__all__ = ["CollectiveLogger", "install", "installed", "instrument_ddp", "uninstall"]


def __getattr__(name: str) -> Any:
    return getattr(_install, name)
