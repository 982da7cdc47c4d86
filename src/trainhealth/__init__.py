"""trainhealth: observability for large-model training.

The public names are listed in docs/api.md; this module holds the Monitor and its settings.

>>> import trainhealth
>>> trainhealth.__version__
'0.1.0'
>>> trainhealth.Settings.resolve(env={"TRAINHEALTH_PROMETHEUS_PORT": "9400"}).prometheus.port
9400
"""

import logging as _logging

from trainhealth._internal.config import ConfigError, Settings
from trainhealth._internal.exporters.monitor import LayerGroupStats, Monitor, StepStats
from trainhealth._internal.identity import Identity
from trainhealth._version import __version__

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
