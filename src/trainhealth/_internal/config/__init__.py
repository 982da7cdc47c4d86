"""Typed settings: explicit argument > ``TRAINHEALTH_*`` environment variable > default.

Every setting has one environment variable, ``TRAINHEALTH_`` + its name in
capitals; docs/configuration.md is generated from the declarations
(:mod:`trainhealth._internal.config.groups`). A bad value, or a number outside the setting's
documented range, raises :class:`ConfigError` at construction, naming the setting. :class:`Settings` holds one group per concern:
``settings.training.stats_every``, ``settings.gpu.backend`` (the ``gpu_backend`` setting).

>>> s = Settings.resolve(env={"TRAINHEALTH_STATS_EVERY": "5"}, prometheus=False)
>>> s.training.stats_every, s.prometheus.enabled
(5, False)
>>> Settings.resolve(env={"TRAINHEALTH_PROMETHEUS_PORT": "http"})
Traceback (most recent call last):
...
trainhealth._internal.config.fields.ConfigError: prometheus_port (TRAINHEALTH_PROMETHEUS_PORT): expected an integer, got 'http'
"""

from __future__ import annotations

from trainhealth._internal.config.fields import ENV_PREFIX, ConfigError, Range, env_name
from trainhealth._internal.config.groups import (
    DEFAULT_DETECTORS,
    DEFAULT_PROMETHEUS_PORT_BASE,
    GPU_BACKENDS,
    MAX_INTERVAL,
    MAX_WORLD_SIZE,
    MIN_INTERVAL,
    MIN_TRACE_WRITE_INTERVAL,
    CommSettings,
    DetectorSettings,
    GpuSettings,
    IdentitySettings,
    ModelSettings,
    OtelSettings,
    PrometheusSettings,
    StoreSettings,
    TrainingSettings,
)
from trainhealth._internal.config.settings import SettingInfo, Settings, setting_infos

__all__ = [
    "DEFAULT_DETECTORS",
    "DEFAULT_PROMETHEUS_PORT_BASE",
    "ENV_PREFIX",
    "GPU_BACKENDS",
    "MAX_INTERVAL",
    "MAX_WORLD_SIZE",
    "MIN_INTERVAL",
    "MIN_TRACE_WRITE_INTERVAL",
    "CommSettings",
    "ConfigError",
    "DetectorSettings",
    "GpuSettings",
    "IdentitySettings",
    "ModelSettings",
    "OtelSettings",
    "PrometheusSettings",
    "Range",
    "SettingInfo",
    "Settings",
    "StoreSettings",
    "TrainingSettings",
    "env_name",
    "setting_infos",
]
