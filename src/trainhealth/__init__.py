"""trainhealth: observability for large-model training.

>>> import trainhealth
>>> trainhealth.__version__
'0.1.0'
"""

import logging

from trainhealth._version import __version__
from trainhealth.config import ConfigError, Settings  # noqa: E402
from trainhealth.exporters.monitor import LayerGroupStats, Monitor, StepStats  # noqa: E402
from trainhealth.identity import Identity  # noqa: E402

logging.getLogger("trainhealth").addHandler(logging.NullHandler())

__all__ = [
    "ConfigError",
    "Identity",
    "LayerGroupStats",
    "Monitor",
    "Settings",
    "StepStats",
    "__version__",
]
