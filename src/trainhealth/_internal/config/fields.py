"""How a setting is declared, parsed from its environment variable and checked.

A settings group is a frozen dataclass deriving :class:`SettingGroup` whose fields are
declared with :func:`setting`: the field is what a program reads
(``settings.gpu.backend``), the setting name is what a user writes (the ``gpu_backend=``
keyword argument, ``TRAINHEALTH_GPU_BACKEND``). Every error names the setting. A numeric
setting declares its :class:`Range`; a value outside it (``nan`` and ``inf`` included)
fails when the group is built, and the range is part of the setting's help.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Example(SettingGroup):
...     TITLE = "Example"
...     every: int = setting("example_every", 10, parse_int, "Steps between examples.", bounds=Range(1, 1000))
...     pause: float = setting("example_pause", 1.0, parse_float, "Seconds between pauses.",
...                            bounds=Range(0.01, 86400, unit="seconds"))
>>> Example.resolve({"TRAINHEALTH_EXAMPLE_EVERY": "5"}, {}).every
5
>>> Example.resolve({}, {"example_every": 0})
Traceback (most recent call last):
...
trainhealth._internal.config.fields.ConfigError: example_every (TRAINHEALTH_EXAMPLE_EVERY): must be from 1 to 1000, got 0
>>> Example.resolve({"TRAINHEALTH_EXAMPLE_PAUSE": "inf"}, {})
Traceback (most recent call last):
...
trainhealth._internal.config.fields.ConfigError: example_pause (TRAINHEALTH_EXAMPLE_PAUSE): must be from 0.01 to 86400 seconds, got inf
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

__all__ = [
    "ENV_PREFIX",
    "ConfigError",
    "Range",
    "SettingGroup",
    "bounds_of",
    "env_name",
    "parse_bool",
    "parse_float",
    "parse_int",
    "parse_str",
    "setting",
    "type_name",
]

ENV_PREFIX = "TRAINHEALTH_"


class ConfigError(ValueError):
    """A setting has an invalid value. The message starts with the setting's name."""

    def __init__(self, setting: str, problem: str) -> None:
        self.setting = setting
        super().__init__(f"{setting} ({env_name(setting)}): {problem}")


def env_name(setting: str) -> str:
    """The environment variable of ``setting``: ``TRAINHEALTH_`` + its name in capitals."""
    return ENV_PREFIX + setting.upper()


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def parse_int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None


def parse_float(text: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None


def parse_str(text: str) -> str:
    return text


_TYPES: dict[Callable[[str], Any], tuple[str, type, str]] = {  # parser -> (type name, Python type, "expected ...")
    parse_bool: ("bool", bool, "true or false"),
    parse_int: ("int", int, "an integer"),
    parse_float: ("float", float, "a number"),
    parse_str: ("str", str, "a string"),
}


@dataclass(frozen=True)
class Range:
    """The values a number may take: ``low..high``, both included unless ``above_low``. The one range
    type of trainhealth: settings, command-line options (:class:`trainhealth._internal.cli.numbers.Bounded`) and
    fault schedules check their numbers with it and say it the same way.

    ``off``, when set, is one more accepted value outside the range (``0`` turns the feature
    off); ``integer`` accepts whole numbers only. ``nan`` and infinities are never in a range.

    >>> interval = Range(0.05, 86400, unit="seconds", off=0, above_low=True)
    >>> [value in interval for value in (0, 0.05, 2.5, 86400, float("inf"), float("nan"))]
    [True, False, True, True, False, False]
    >>> str(interval)
    '0, or above 0.05 up to 86400 seconds'
    >>> [value in Range(1, 8, integer=True) for value in (1, 2.0, 2.5, True)]
    [True, True, False, False]
    >>> Range(1, 8).span
    'from 1 to 8'
    """

    low: float
    high: float
    #: Unit words shown after the range ("seconds").
    unit: str = ""
    off: float | None = None
    above_low: bool = False
    integer: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low <= self.high):
            raise ValueError(f"a range needs finite low <= high, got {self.low}..{self.high}")

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return False
        if self.off is not None and value == self.off:
            return True
        if not math.isfinite(value) or (self.integer and value != int(value)):
            return False
        above = value > self.low if self.above_low else value >= self.low
        return above and value <= self.high

    @property
    def span(self) -> str:
        """The bounds in words, without the unit: ``from 1 to 8``, ``above 0 up to 3600``."""
        low, high = _number(self.low), _number(self.high)
        return f"above {low} up to {high}" if self.above_low else f"from {low} to {high}"

    def __str__(self) -> str:
        text = f"{self.span} {self.unit}" if self.unit else self.span
        if self.off is not None:
            text = f"{_number(self.off)}, or {text}"
        return text


def _number(value: float) -> str:
    """``86400`` for 86400.0, ``0.05``, ``1e+18``: the shortest way to write a bound."""
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return format(value, "g")


def setting(
    name: str,
    default: Any,
    parse: Callable[[str], Any],
    help: str,
    *,
    secret: bool = False,
    bounds: Range | None = None,
) -> Any:
    """Declare a field of a :class:`SettingGroup`: the setting ``name``, its default, parser, help and range."""
    return field(
        default=default,
        repr=not secret,
        metadata={"setting": name, "parse": parse, "help": help, "secret": secret, "bounds": bounds},
    )


def bounds_of(spec: dataclasses.Field) -> Range | None:
    """The :class:`Range` of a field declared with :func:`setting`, or ``None`` for a non-numeric one."""
    return spec.metadata.get("bounds")


def type_name(spec: dataclasses.Field) -> str:
    """``bool``, ``int``, ``float`` or ``str``: the type of a field declared with :func:`setting`."""
    return _TYPES[spec.metadata["parse"]][0]


_Group = TypeVar("_Group", bound="SettingGroup")


class SettingGroup:
    """Base of the settings groups (frozen dataclasses); each checks its own fields when built.

    A subclass sets ``TITLE`` (its heading in docs/configuration.md) and overrides
    :meth:`validate` for consistency between settings; the types and the declared ranges
    are checked here.
    """

    TITLE: ClassVar[str]

    def __post_init__(self) -> None:
        for spec in dataclasses.fields(self):  # type: ignore[arg-type]  # every subclass is a dataclass
            self._check_type(spec)
            self._check_bounds(spec)
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the setting when a value is out of range or inconsistent."""

    @classmethod
    def declared(cls) -> Iterator[tuple[str, dataclasses.Field]]:
        """(setting name, field) of every setting in the group, in declaration order."""
        for spec in dataclasses.fields(cls):  # type: ignore[arg-type]
            yield spec.metadata["setting"], spec

    @classmethod
    def resolve(cls: type[_Group], env: Mapping[str, str], explicit: Mapping[str, Any]) -> _Group:
        """The group from ``explicit`` values by setting name (``None`` means unset), then ``env``, then defaults."""
        values: dict[str, Any] = {}
        for name, spec in cls.declared():
            if explicit.get(name) is not None:
                values[spec.name] = explicit[name]
                continue
            raw = env.get(env_name(name))
            if raw is None or raw == "":
                continue
            try:
                values[spec.name] = spec.metadata["parse"](raw)
            except ValueError as exc:
                raise ConfigError(name, str(exc)) from None
        return cls(**values)

    def error(self, attribute: str, problem: str) -> ConfigError:
        """A :class:`ConfigError` naming the setting behind ``attribute``."""
        for name, spec in self.declared():
            if spec.name == attribute:
                return ConfigError(name, problem)
        raise AttributeError(f"{type(self).__name__} has no setting {attribute!r}")

    def _check_type(self, spec: dataclasses.Field) -> None:
        value = getattr(self, spec.name)
        if value is None:
            return
        kind, expected, wording = _TYPES[spec.metadata["parse"]]
        if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
            object.__setattr__(self, spec.name, float(value))
            return
        if not isinstance(value, expected) or (kind == "int" and isinstance(value, bool)):
            raise ConfigError(spec.metadata["setting"], f"expected {wording}, got {value!r}")

    def _check_bounds(self, spec: dataclasses.Field) -> None:
        value = getattr(self, spec.name)
        bounds = bounds_of(spec)
        if value is not None and bounds is not None and value not in bounds:
            raise ConfigError(spec.metadata["setting"], f"must be {bounds}, got {value!r}")
