"""trainhealth: observability for large-model training.

The public names are listed in docs/api.md; this module holds the Monitor and its settings.

>>> import trainhealth
>>> trainhealth.__version__
'0.1.0'
>>> trainhealth.Settings.resolve(env={"TRAINHEALTH_PROMETHEUS_PORT": "9400"}).prometheus.port
9400
"""

import logging as _logging
import typing as _typing

from trainhealth._internal.config import ConfigError, Settings
from trainhealth._internal.identity import Identity
from trainhealth._version import __version__

if _typing.TYPE_CHECKING:
    from trainhealth._internal.exporters.monitor import LayerGroupStats, Monitor, StepStats

_logging.getLogger("trainhealth").addHandler(_logging.NullHandler())

__all__ = [
    "ConfigError",
    "Identity",
    "LayerGroupStats",
    "Monitor",
    "Settings",
    "StepStats",
    "__version__",
]

#: Imported on first use (PEP 562): the Monitor's exporters take about half a second to import, which every
#: command line tool (``trainhealth localize`` included) would otherwise pay.
_LAZY = frozenset({"LayerGroupStats", "Monitor", "StepStats"})


def __getattr__(name: str) -> object:
    if name in _LAZY:
        from trainhealth._internal.exporters import monitor

        value = getattr(monitor, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY)
