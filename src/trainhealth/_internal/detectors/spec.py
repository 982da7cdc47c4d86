"""Which detectors watch which signal: the ``detectors`` setting.

Syntax: ``signal=detector[(name=value, ...)],...;signal=...`` — for example
``loss=zscore(direction=up),spike;step_time=delta(delta=2.0)``. Parameters are
the detector's own, plus the decision step's ``threshold``, ``release``,
``cooldown``, ``min_consecutive``, ``protect``, ``max_protected``,
``max_protected_share`` and ``critical``. ``off`` (or an
empty string) watches nothing.

Every value is checked against its parameter before a detector is built: counts
(windows, warm-ups, cooldowns) are whole numbers from 1 (0 for ``cooldown`` and
``adapt_after``) to :data:`MAX_PARAMETER`, other numbers finite and not negative
(``threshold`` and ``critical`` above 0, ``max_protected_share`` at most 1),
``direction`` one of both, up, down and ``protect`` true or false; anything else is
a ``ValueError`` naming the parameter (``zscore(threshold=nan)`` included).

>>> spec = parse_spec("loss=zscore(window=200,threshold=5),nonfinite;step_time=delta")
>>> [(s.signal, s.detector.name, s.threshold) for s in spec]
[('loss', 'zscore', 5.0), ('loss', 'nonfinite', 0.5), ('step_time', 'delta', 1.5)]
>>> parse_spec("loss=zscor")
Traceback (most recent call last):
...
ValueError: unknown detector 'zscor' for loss; known: bocpd, delta, divergence, iqr, level_shift, nonfinite, peer, rarity, robust_z, spike, stl, zscore
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any

from trainhealth._internal.config import DEFAULT_DETECTORS, ConfigError
from trainhealth._internal.detectors.base import Detector
from trainhealth._internal.detectors.bocpd import BOCPD
from trainhealth._internal.detectors.decision import Decision
from trainhealth._internal.detectors.delta import DeltaIrregularity
from trainhealth._internal.detectors.divergence import Divergence
from trainhealth._internal.detectors.iqr import IQR
from trainhealth._internal.detectors.level_shift import LevelShift
from trainhealth._internal.detectors.nonfinite import NonFinite
from trainhealth._internal.detectors.peer import PeerOutlier
from trainhealth._internal.detectors.rarity import Rarity
from trainhealth._internal.detectors.robust_z import RobustZ
from trainhealth._internal.detectors.spike import SpikeScore
from trainhealth._internal.detectors.stl import STLDetector
from trainhealth._internal.detectors.zscore import ZScore

__all__ = [
    "DEFAULT_SPEC",
    "DETECTORS",
    "MAX_PARAMETER",
    "SIGNALS",
    "WatchSpec",
    "build_detector",
    "parse_item",
    "parse_setting",
    "parse_spec",
]

DETECTORS: dict[str, type[Detector]] = {
    cls.name: cls
    for cls in (
        ZScore,
        RobustZ,
        IQR,
        STLDetector,
        DeltaIrregularity,
        SpikeScore,
        LevelShift,
        NonFinite,
        PeerOutlier,
        Divergence,
        BOCPD,
        Rarity,
    )
}

#: Signals the Monitor and the collective logger feed to detectors.
SIGNALS = ("loss", "grad_norm", "step_time", "throughput", "comm_duration")

DEFAULT_SPEC = DEFAULT_DETECTORS  # the default of the ``detectors`` setting

_DECISION_PARAMETERS = (
    "threshold",
    "release",
    "cooldown",
    "min_consecutive",
    "protect",
    "max_protected",
    "max_protected_share",
    "critical",
)

#: The largest count a parameter may take (a window of a million values per series is already 8 MB each).
MAX_PARAMETER = 1_000_000
#: Counts that may be 0; every other count starts at 1.
_ZERO_ALLOWED = ("cooldown", "adapt_after")
#: Numbers that must be above 0 (the others may be 0), and those at most 1.
_POSITIVE = ("threshold", "critical")
_SHARES = ("max_protected_share",)
_ITEM = re.compile(r"^\s*([a-z_]+)\s*(?:\((.*)\))?\s*$")


@dataclass(frozen=True)
class WatchSpec:
    """One detector on one signal, with its decision parameters."""

    signal: str
    detector: Detector
    threshold: float
    release: float | None = None
    cooldown: int = 3
    min_consecutive: int = 1
    protect: bool = True
    max_protected: int = 32
    max_protected_share: float = 0.05
    critical: float | None = None

    def decision(self) -> Decision:
        return Decision(
            self.threshold,
            release=self.release,
            cooldown=self.cooldown,
            min_consecutive=self.min_consecutive,
            protect=self.protect,
            max_protected=self.max_protected,
            max_protected_share=self.max_protected_share,
        )


def _value(text: str) -> Any:
    text = text.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text.strip("'\"")


def _split_items(text: str) -> list[str]:
    items, depth, current = [], 0, ""
    for char in text:
        if char == "," and depth == 0:
            items.append(current)
            current = ""
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        current += char
    if current.strip():
        items.append(current)
    return items


def _check(key: str, value: Any, annotation: Any) -> None:
    """``ValueError`` naming ``key`` unless ``value`` fits its annotation and range (see the module docstring)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(arg for arg in typing.get_args(annotation) if arg is not type(None))
    if typing.get_origin(annotation) is typing.Literal:
        if value not in typing.get_args(annotation):
            raise ValueError(f"{key} must be one of {', '.join(typing.get_args(annotation))}, got {_shown(value)}")
    elif annotation is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false, got {_shown(value)}")
    elif annotation is int:
        low = 0 if key in _ZERO_ALLOWED else 1
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_PARAMETER:
            raise ValueError(f"{key} must be a whole number from {low} to {MAX_PARAMETER}, got {_shown(value)}")
    elif annotation is float:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < 0
            or (key in _POSITIVE and value == 0)
            or (key in _SHARES and value > 1)
        ):
            what = "above 0" if key in _POSITIVE else "from 0 to 1" if key in _SHARES else "0 or more"
            raise ValueError(f"{key} must be a finite number {what}, got {_shown(value)}")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_DECISION_TYPES = {
    "threshold": float,
    "release": float,
    "critical": float,
    "cooldown": int,
    "min_consecutive": int,
    "max_protected": int,
    "max_protected_share": float,
    "protect": bool,
}


def build_detector(name: str, parameters: dict[str, Any], signal: str = "the signal") -> WatchSpec:
    cls = DETECTORS.get(name)
    if cls is None:
        raise ValueError(f"unknown detector {_shown(name)} for {signal}; known: {', '.join(sorted(DETECTORS))}")
    types_of = typing.get_type_hints(cls)
    known = {
        field.name: types_of[field.name]
        for field in dataclasses.fields(cls)  # type: ignore[arg-type]
    } | _DECISION_TYPES
    for key, value in parameters.items():
        if key not in known:
            raise ValueError(f"{name} for {signal}: unknown parameter {_shown(key)}; known: {', '.join(sorted(known))}")
        try:
            _check(key, value, known[key])
        except ValueError as exc:
            raise ValueError(f"{name} for {signal}: {exc}") from None
    decision = {key: parameters.pop(key) for key in list(parameters) if key in _DECISION_PARAMETERS}
    try:
        detector = cls(**parameters)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} for {signal}: {exc}") from None
    try:
        threshold = float(decision.pop("threshold", cls.default_threshold))
        spec = WatchSpec(signal=signal, detector=detector, threshold=threshold, **decision)
        spec.decision()  # validates the decision parameters now, not at the first step
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} for {signal}: {exc}") from None
    return spec


def parse_setting(text: str) -> list[WatchSpec]:
    """The ``detectors`` setting parsed, or :class:`~trainhealth._internal.config.ConfigError` naming it (what the Monitor
    and ``trainhealth config`` call the moment they read the settings; the grammar lives here, with the
    detectors, not in the core's settings)."""
    try:
        return parse_spec(text)
    except ValueError as exc:
        raise ConfigError("detectors", str(exc)) from None


def parse_spec(text: str) -> list[WatchSpec]:
    """Parse the ``detectors`` setting; raises ``ValueError`` naming what is wrong."""
    text = text.strip()
    if text in ("", "off"):
        return []
    specs = []
    for part in filter(str.strip, text.split(";")):
        signal, _, detectors = part.partition("=")
        signal = signal.strip()
        if signal not in SIGNALS:
            raise ValueError(f"unknown signal {signal!r}; known: {', '.join(SIGNALS)}")
        if not detectors.strip():
            raise ValueError(f"no detector named for {signal}")
        specs += [parse_item(item, signal) for item in _split_items(detectors)]
    return specs


def parse_item(item: str, signal: str) -> WatchSpec:
    """One ``name`` or ``name(key=value, ...)`` for ``signal`` (any name, for offline use)."""
    match = _ITEM.match(item) if len(item) <= 1000 else None
    if match is None:
        raise ValueError(f"cannot read {_shown(item.strip())} for {signal}: expected name or name(key=value, ...)")
    name, arguments = match.group(1), match.group(2) or ""
    parameters = {}
    for argument in _split_items(arguments):
        key, equals, value = argument.partition("=")
        if not equals:
            raise ValueError(f"{name} for {signal}: expected key=value, got {_shown(argument.strip())}")
        if key.strip() in parameters:
            raise ValueError(f"{name} for {signal}: {_shown(key.strip())} given twice")
        parameters[key.strip()] = _value(value)
    return build_detector(name, parameters, signal)
