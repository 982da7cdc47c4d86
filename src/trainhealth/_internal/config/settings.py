"""All settings, composed of one group per concern; resolution by setting name.

>>> s = Settings.resolve(env={"TRAINHEALTH_GPU_BACKEND": "off"}, comm_ring_size=1024)
>>> s.gpu.backend, s.comm.ring_size, s.value("comm_ring_size")
('off', 1024, 1024)
>>> s.replace(gpu_backend="tpu")
Traceback (most recent call last):
...
trainhealth._internal.config.fields.ConfigError: gpu_backend (TRAINHEALTH_GPU_BACKEND): must be one of nvml, simulated, off, got 'tpu'
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainhealth._internal.config.fields import ConfigError, SettingGroup, bounds_of, env_name, type_name
from trainhealth._internal.config.groups import (
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

__all__ = ["Settings", "SettingInfo", "setting_infos"]


@dataclass(frozen=True)
class Settings:
    """All trainhealth settings, one group per concern. Build with :meth:`resolve` to read the environment.

    A program reads a value from its group (``settings.gpu.backend``); a user names a
    setting (``gpu_backend=``, ``TRAINHEALTH_GPU_BACKEND``) in :meth:`resolve`,
    :meth:`replace` and :meth:`value`.
    """

    identity: IdentitySettings = field(default_factory=IdentitySettings)
    prometheus: PrometheusSettings = field(default_factory=PrometheusSettings)
    otel: OtelSettings = field(default_factory=OtelSettings)
    training: TrainingSettings = field(default_factory=TrainingSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    comm: CommSettings = field(default_factory=CommSettings)
    detectors: DetectorSettings = field(default_factory=DetectorSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    gpu: GpuSettings = field(default_factory=GpuSettings)

    def __post_init__(self) -> None:
        for spec in dataclasses.fields(self):
            if not isinstance(getattr(self, spec.name), _GROUPS[spec.name]):
                raise TypeError(
                    f"Settings.{spec.name} must be a {_GROUPS[spec.name].__name__}, got {getattr(self, spec.name)!r}"
                )

    @classmethod
    def resolve(cls, env: Mapping[str, str] | None = None, **explicit: Any) -> Settings:
        """Settings from explicit values by setting name (``None`` means unset), then ``env``, then defaults.

        ``env`` defaults to ``os.environ``. Unknown names raise :class:`ConfigError`.
        """
        env = os.environ if env is None else env
        _check_names(explicit)
        groups: dict[str, Any] = {name: group.resolve(env, explicit) for name, group in _GROUPS.items()}
        return cls(**groups)

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` (by setting name) applied and validated; unknown names raise :class:`ConfigError`."""
        _check_names(changes)
        groups: dict[str, Any] = {}
        for name, group in self._groups():
            mine = {spec.name: changes[setting] for setting, spec in group.declared() if setting in changes}
            if mine:
                groups[name] = dataclasses.replace(group, **mine)  # type: ignore[type-var]  # a group is a dataclass
        return dataclasses.replace(self, **groups)

    def value(self, setting: str) -> Any:
        """The value of the setting named ``setting`` (``"gpu_backend"`` reads ``self.gpu.backend``)."""
        for _, group in self._groups():
            for name, spec in group.declared():
                if name == setting:
                    return getattr(group, spec.name)
        raise ConfigError(setting, f"unknown setting; known settings: {', '.join(sorted(_SETTING_NAMES))}")

    def _groups(self) -> Iterator[tuple[str, SettingGroup]]:
        for name in _GROUPS:
            yield name, getattr(self, name)


#: Settings attribute -> its group's class, in the order of docs/configuration.md.
_GROUPS: dict[str, type[SettingGroup]] = {
    spec.name: spec.default_factory  # type: ignore[misc]  # every field is a group with a default factory
    for spec in dataclasses.fields(Settings)
}
_SETTING_NAMES = frozenset(name for group in _GROUPS.values() for name, _ in group.declared())


def _check_names(values: Mapping[str, Any]) -> None:
    for name in values:
        if name not in _SETTING_NAMES:
            raise ConfigError(name, f"unknown setting; known settings: {', '.join(sorted(_SETTING_NAMES))}")


@dataclass(frozen=True)
class SettingInfo:
    """Documentation of one setting, for docs/configuration.md and ``trainhealth config``."""

    name: str
    env: str
    type: str
    default: Any
    #: What it does, ending with its range for a numeric setting ("Range: from 1 to 1000000.").
    help: str
    secret: bool
    #: The heading of its group ("GPU telemetry").
    group: str
    #: Where a program reads it on :class:`Settings` ("gpu.backend").
    attribute: str
    #: The values it accepts ("from 0.01 to 86400 seconds"), or ``None`` for a setting without a range.
    range: str | None = None


def setting_infos() -> tuple[SettingInfo, ...]:
    """Every setting, group by group, in declaration order.

    >>> info = {info.name: info for info in setting_infos()}["gpu_sample_interval"]
    >>> info.range, info.help.endswith("Range: from 0.01 to 86400 seconds.")
    ('from 0.01 to 86400 seconds', True)
    """
    infos = []
    for attribute, group in _GROUPS.items():
        for name, spec in group.declared():
            bounds = bounds_of(spec)
            help = spec.metadata["help"]
            if bounds is not None:
                help = f"{help} Range: {bounds}."
            infos.append(
                SettingInfo(
                    name=name,
                    env=env_name(name),
                    type=type_name(spec),
                    default=spec.default,
                    help=help,
                    secret=spec.metadata["secret"],
                    group=group.TITLE,
                    attribute=f"{attribute}.{spec.name}",
                    range=None if bounds is None else str(bounds),
                )
            )
    return tuple(infos)
