"""One vocabulary for injected faults: what, where, when and how strong, described and serialised one way.

A :class:`Fault` is a kind (what), the ranks it acts on (where; none: every rank), the steps it acts in
(when: from ``step`` to ``until``, every ``every``-th step) and a ``severity`` in the kind's unit (how
strong), plus the kind's own settings (``params``: a bit to flip, a tensor, a link's rate).

Every kind is declared once (:class:`FaultKind`, :func:`register`) by the code that injects it:
the cluster simulator (``gpu``, ``nic``, ``host``, ``switch``), the injectors the demo and the SDC
self-test run (``bitflip``, ``nan``, ``inf``, ``delay``, ``collective_delay``, ``lr_scale``,
``batch``, ``simulated_gpu``) and the real-run lab beside the product (``compute``, ``link_rate``,
``link_delay``, ``cpu_contention``, ``dataloader`` and its controls). Every field is checked when a
fault is made, and a :class:`FaultError` names the field.

>>> register(FaultKind("example_slow", "example", "slow example x{severity:g}", severity=Range(1.0, 10.0)))
>>> fault = Fault.from_dict({"kind": "example_slow", "ranks": [3], "step": 5, "until": 9, "severity": 1.5})
>>> fault.describe()
'steps 5-9: slow example x1.5 on rank 3'
>>> fault.active(7, rank=3), fault.active(7, rank=2), fault.active(10, rank=3)
(True, False, False)
>>> Fault.from_dict(fault.to_dict()) == fault
True
>>> Fault.from_dict({"kind": "example_slow", "ranks": [3], "severity": 20})
Traceback (most recent call last):
...
trainhealth._internal.faults.FaultError: example_slow: severity must be from 1 to 10, got 20.0
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainhealth._internal.config.fields import Range

__all__ = ["KINDS", "Fault", "FaultError", "FaultKind", "Param", "register"]

#: The largest step and rank a fault may name.
MAX_STEP = 10**9
MAX_RANK = 65535
_STEPS = Range(0, MAX_STEP, integer=True)
_RANKS = Range(0, MAX_RANK, integer=True)
_EVERY = Range(1, MAX_STEP, integer=True)
_FIELDS = ("kind", "ranks", "step", "until", "every", "severity")


class FaultError(ValueError):
    """A fault that cannot be injected: the message names the field."""


@dataclass(frozen=True)
class Param:
    """One setting of a kind: its default and the check that turns a given value into the value used
    (``check`` raises ``ValueError`` with what was expected)."""

    default: Any
    check: Callable[[Any], Any]
    summary: str = ""


@dataclass(frozen=True)
class FaultKind:
    """What one kind of fault is: who injects it, how it reads, its severity's range and its settings.

    ``what`` is the description, formatted with ``severity`` and the params (``"slow GPU x{severity:g}"``),
    or a function of them that returns it.
    ``once``: without ``until`` the fault acts in its first step only (an event: a flipped bit), else to
    the end (a state: a slow GPU). ``needs_ranks``: it acts on named ranks (a slow link), never on all.
    ``control``: a negative control, nothing to find (uneven work, a clean run).
    """

    name: str
    injector: str
    what: str | Callable[..., str]
    severity: Range | None = None
    params: Mapping[str, Param] = field(default_factory=dict)
    once: bool = False
    needs_ranks: bool = False
    control: bool = False


KINDS: dict[str, FaultKind] = {}


def register(kind: FaultKind) -> None:
    """Declare ``kind``; declaring the same kind again is allowed, another kind under its name is not."""
    known = KINDS.get(kind.name)
    if known is not None and known != kind:
        raise ValueError(f"fault kind {kind.name!r} is already declared by {known.injector}")
    KINDS[kind.name] = kind


def _integer(kind: str, name: str, value: Any, bounds: Range) -> int:
    number: Any = value
    if isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            number = None
    if number not in bounds:
        raise FaultError(f"{kind}: {name} must be an integer {bounds}, got {value!r}")
    return int(number)


def _severity(kind: FaultKind, value: Any) -> float:
    if kind.severity is None:
        if value != 1.0:
            raise FaultError(f"{kind.name}: takes no severity, got {value!r}")
        return 1.0
    number: Any = None
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            number = float(value)
        except (ValueError, OverflowError):
            number = None
    if number is None or not math.isfinite(number) or number not in kind.severity:
        shown = repr(value) if number is None or not math.isfinite(number) else repr(number)
        raise FaultError(f"{kind.name}: severity must be {kind.severity}, got {shown}")
    return float(number)


@dataclass(frozen=True)
class Fault:
    """One injected fault (see the module docstring); ``params`` holds every setting of its kind."""

    kind: str
    ranks: tuple[int, ...] = ()
    step: int = 0
    until: int | None = None
    every: int = 1
    severity: float = 1.0  # in the kind's unit; 1.0 for a kind without one
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        spec = KINDS.get(self.kind)
        if spec is None:
            raise FaultError(f"kind must be one of {', '.join(sorted(KINDS))}, got {self.kind!r}")
        if not isinstance(self.ranks, tuple):
            object.__setattr__(self, "ranks", tuple(self.ranks))
        ranks = tuple(_integer(self.kind, "ranks", rank, _RANKS) for rank in self.ranks)
        if spec.needs_ranks and not ranks:
            raise FaultError(f"{self.kind}: ranks must name the faulty rank(s)")
        step = _integer(self.kind, "step", self.step, _STEPS)
        until = step if self.until is None and spec.once else self.until
        if until is not None:
            until = _integer(self.kind, "until", until, _STEPS)
            if until < step:
                raise FaultError(f"{self.kind}: until ({until}) must not be before step ({step})")
        unknown = sorted(set(self.params) - set(spec.params))
        if unknown:
            raise FaultError(f"{self.kind}: unknown setting(s) {', '.join(map(str, unknown))}")
        params = {}
        for name, param in spec.params.items():
            try:
                params[name] = param.check(self.params.get(name, param.default))
            except (TypeError, ValueError) as exc:
                raise FaultError(f"{self.kind}: {name} {exc}") from None
        object.__setattr__(self, "ranks", ranks)
        object.__setattr__(self, "step", step)
        object.__setattr__(self, "until", until)
        object.__setattr__(self, "every", _integer(self.kind, "every", self.every, _EVERY))
        object.__setattr__(self, "severity", _severity(spec, self.severity))
        object.__setattr__(self, "params", params)

    @property
    def spec(self) -> FaultKind:
        return KINDS[self.kind]

    @property
    def target(self) -> int | None:
        """The first rank it acts on (None: every rank)."""
        return self.ranks[0] if self.ranks else None

    @property
    def pattern(self) -> str:
        """``persistent`` (to the end), ``transient`` (a stretch of steps) or ``intermittent`` (every n-th)."""
        if self.every > 1:
            return "intermittent"
        return "persistent" if self.until is None else "transient"

    def active(self, step: int, rank: int | None = None) -> bool:
        """Whether it acts at ``step`` (on ``rank``, when given): the same answer on every rank."""
        if step < self.step or (self.until is not None and step > self.until):
            return False
        if (step - self.step) % self.every:
            return False
        return rank is None or not self.ranks or rank in self.ranks

    def describe(self) -> str:
        """One line: when, what and where.

        >>> register(FaultKind("example_stall", "example", "stall +{severity:g} s", severity=Range(0, 60)))
        >>> Fault("example_stall", severity=2, step=4, every=10).describe()
        'every 10th step from step 4: stall +2 s on every rank'
        """
        if self.every > 1:
            when = f"every {self.every}th step from step {self.step}"
            when += f" to {self.until}" if self.until is not None else ""
        elif self.until is None:
            when = f"from step {self.step}"
        else:
            when = f"step {self.step}" if self.until == self.step else f"steps {self.step}-{self.until}"
        what = self.spec.what
        what = (
            what(self.severity, **self.params) if callable(what) else what.format(severity=self.severity, **self.params)
        )
        if not self.ranks:
            where = "every rank"
        else:
            where = ("rank " if len(self.ranks) == 1 else "ranks ") + ", ".join(map(str, self.ranks))
        return f"{when}: {what} on {where}" if not self.spec.control else f"{when}: {what}"

    def to_dict(self) -> dict[str, Any]:
        """``kind`` and every field and setting away from its default (JSON-ready)."""
        spec = self.spec
        out: dict[str, Any] = {"kind": self.kind}
        if self.ranks:
            out["ranks"] = list(self.ranks)
        if self.step:
            out["step"] = self.step
        if self.until is not None and not (spec.once and self.until == self.step):
            out["until"] = self.until
        if self.every != 1:
            out["every"] = self.every
        if spec.severity is not None:
            out["severity"] = self.severity
        for name, param in spec.params.items():
            if self.params[name] != param.check(param.default):
                value = self.params[name]
                out[name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fault:
        """The inverse of :meth:`to_dict`; every field checked, a :class:`FaultError` naming it."""
        if not isinstance(data, Mapping):
            raise FaultError(f"expected a mapping, got {type(data).__name__}")
        kind = data.get("kind")
        if kind not in KINDS:
            raise FaultError(f"kind must be one of {', '.join(sorted(KINDS))}, got {kind!r}")
        spec = KINDS[kind]
        unknown = sorted(str(key) for key in data if key not in _FIELDS and key not in spec.params)
        if unknown:
            raise FaultError(f"{kind}: unknown field(s) {', '.join(unknown)}{_hint(unknown)}")
        if spec.severity is not None and "severity" not in data:
            raise FaultError(f"{kind}: severity is required ({spec.severity})")
        ranks = data.get("ranks", ())
        if isinstance(ranks, (list, tuple)) and not ranks and "ranks" in data:
            raise FaultError(f"{kind}: ranks must name at least one rank (leave it out for every rank)")
        if not isinstance(ranks, (list, tuple)):
            ranks = (ranks,)
        return cls(
            kind=kind,
            ranks=tuple(ranks),
            step=data.get("step", 0),
            until=data.get("until"),
            every=data.get("every", 1),
            severity=data.get("severity", 1.0),
            params={name: data[name] for name in spec.params if name in data},
        )


def _hint(unknown: Iterable[str]) -> str:
    renamed = {"seconds": "severity", "factor": "severity", "start_step": "step", "onset": "step"}
    hints = [f"{name} is now {renamed[name]}" for name in unknown if name in renamed]
    return f" ({'; '.join(hints)})" if hints else ""
