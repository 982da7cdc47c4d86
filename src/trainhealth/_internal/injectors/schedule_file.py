"""The fault schedule: which faults, at which steps, on which ranks, read and checked before a run.

Faults (``kind`` in a schedule entry):

* ``bitflip`` — flip ``bit`` (an index or a field: ``sign``, ``exponent``,
  ``exponent-high``, ``mantissa``, ``mantissa-high``, ``mantissa-low``) of
  ``count`` elements of a ``parameter`` (this replica's weights, before the
  step's forward), a ``gradient`` (this rank's gradient as backward computes it,
  before the data-parallel all-reduce) or an ``activation`` (a module's output);
  ``tensor`` names the parameter or module (a glob; the first match).
* ``nan`` / ``inf`` — the same targets, values set to NaN or infinity.
* ``delay`` — this rank sleeps ``seconds`` before the step's work (a straggler).
* ``collective_delay`` — this rank's collectives take ``seconds`` longer, inside
  the collective (a slow link: every member's operation is prolonged).
* ``lr_scale`` — the learning rate is multiplied by ``factor`` (a loss spike).
* ``batch`` — the inputs passed through
  :meth:`~trainhealth._internal.injectors.schedule.Injector.corrupt_batch` are
  multiplied by ``factor`` (a corrupt batch).
* ``gpu`` — a simulated hardware fault of the simulated GPU backend
  (``fault``: xid, thermal_throttle, slow_clocks, gpu_lost, ...; ``gpu``, ``xid``).

Each entry has ``step`` (first step), optional ``until`` (last step, default
``step``) and ``ranks`` (default: every rank). A schedule is a list of entries:
a YAML or JSON file (``TRAINHEALTH_FAULTS``, at most 1 MiB) or dictionaries.

Every field is checked when the schedule is loaded, and a :class:`ScheduleError`
names the file, the entry and the field: ``step`` and ``until`` are integers from
0 to 10**9, ``ranks`` from 0 to 65535, ``count`` at least 1, ``seconds`` a finite
number up to 3600 (above 0 for the delays), ``factor`` finite within ±1e6, ``bit``
an index from 0 to 63 or a field name, ``gpu`` from 0 to 1023; NaN and infinities
are refused.

>>> schedule = load_schedule([{"kind": "delay", "seconds": 0.5, "step": 3, "ranks": [1]}])
>>> [(spec.kind, spec.step, spec.until, spec.ranks) for spec in schedule]
[('delay', 3, 3, (1,))]
>>> load_schedule([{"kind": "delay", "step": 3}])
Traceback (most recent call last):
...
trainhealth._internal.injectors.schedule_file.ScheduleError: fault #1: seconds must be positive (up to 3600), got 0.0
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from trainhealth._internal.config.fields import Range
from trainhealth._internal.injectors.bits import BIT_FIELDS

__all__ = ["FAULT_KINDS", "FaultSpec", "ScheduleError", "load_schedule"]

FAULT_KINDS = ("bitflip", "nan", "inf", "delay", "collective_delay", "lr_scale", "batch", "gpu")
TARGETS = ("parameter", "gradient", "activation")
_FIELDS = {
    "kind",
    "step",
    "until",
    "ranks",
    "target",
    "tensor",
    "bit",
    "count",
    "seconds",
    "factor",
    "fault",
    "gpu",
    "xid",
}


class ScheduleError(ValueError):
    """A schedule entry that cannot be run: names the entry and the field."""


#: The ranges a schedule's fields must lie in (a step is a training step index, seconds a wall-clock delay).
MAX_STEP = 10**9
MAX_RANK = 65535
MAX_SECONDS = 3600.0
MAX_FACTOR = 1e6
MAX_COUNT = 10**9
MAX_GPU = 1023
MAX_XID = 65535
#: A schedule file larger than this, or with more entries, is refused.
MAX_SCHEDULE_BYTES = 1 << 20
MAX_ENTRIES = 10_000


def _integer(where: str, name: str, value: Any, low: int, high: int) -> int:
    """``value`` as an integer from ``low`` to ``high`` (an integral number or its text), else ScheduleError."""
    bounds = Range(low, high, integer=True)
    number: Any = value
    if isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            number = None
    if number not in bounds:
        raise ScheduleError(f"{where}: {name} must be an integer {bounds}, got {value!r}")
    return int(number)


def _number(where: str, name: str, value: Any, low: float, high: float, *, low_open: bool = False) -> float:
    """``value`` as a finite number in the range (above ``low`` with ``low_open``), else ScheduleError."""
    bounds = Range(low, high, above_low=low_open)
    number: Any = None
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            number = float(value)
        except (ValueError, OverflowError):
            number = None
    if number not in bounds:
        raise ScheduleError(f"{where}: {name} must be a finite number {bounds}, got {value!r}")
    return float(number)


def _text(where: str, name: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ScheduleError(f"{where}: {name} must be a string, got {value!r}")
    return str(value)


def _ranks(where: str, value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise ScheduleError(f"{where}: ranks must name at least one rank (leave it out for every rank)")
    return tuple(_integer(where, "ranks", item, 0, MAX_RANK) for item in items)


def _bit(where: str, value: Any) -> int | str:
    if isinstance(value, str) and value in BIT_FIELDS:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 63:
        return value
    raise ScheduleError(f"{where}: bit must be an index from 0 to 63 or one of {', '.join(BIT_FIELDS)}, got {value!r}")


def _gpu_fault(where: str, value: Any) -> str:
    from trainhealth._internal.exporters.gpu.simulated_device import SimulatedFaultKind

    names = [kind.value for kind in SimulatedFaultKind]
    if value not in names:
        raise ScheduleError(f"{where}: fault must be one of {', '.join(names)}, got {value!r}")
    return str(value)


@dataclass(frozen=True)
class FaultSpec:
    """One schedule entry (see the module docstring)."""

    kind: str
    step: int
    until: int
    ranks: tuple[int, ...] | None = None
    target: str = "parameter"
    tensor: str = "*"
    bit: int | str = "exponent-high"
    count: int = 1
    seconds: float = 0.0
    factor: float = 1.0
    fault: str = ""
    gpu: int = 0
    xid: int | None = None

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any], position: int = 0) -> FaultSpec:
        """The entry checked field by field; a :class:`ScheduleError` names the entry and the field."""
        where = f"fault #{position + 1}"
        if not isinstance(entry, Mapping):
            raise ScheduleError(f"{where}: expected a mapping, got {type(entry).__name__}")
        unknown = sorted(str(key) for key in set(entry) - _FIELDS)
        if unknown:
            raise ScheduleError(f"{where}: unknown field(s) {', '.join(unknown)}")
        kind = entry.get("kind")
        if kind not in FAULT_KINDS:
            raise ScheduleError(f"{where}: kind must be one of {', '.join(FAULT_KINDS)}, got {kind!r}")
        if "step" not in entry:
            raise ScheduleError(f"{where}: step is required")
        step = _integer(where, "step", entry["step"], 0, MAX_STEP)
        until = _integer(where, "until", entry.get("until", step), 0, MAX_STEP)
        seconds = _number(where, "seconds", entry.get("seconds", 0.0), 0.0, MAX_SECONDS)
        if kind in ("delay", "collective_delay") and not seconds > 0:
            raise ScheduleError(f"{where}: seconds must be positive (up to {MAX_SECONDS:g}), got {seconds!r}")
        spec = cls(
            kind=kind,
            step=step,
            until=until,
            ranks=_ranks(where, entry.get("ranks")),
            target=_text(where, "target", entry.get("target", "parameter")),
            tensor=_text(where, "tensor", entry.get("tensor", "*")),
            bit=_bit(where, entry.get("bit", "exponent-high")),
            count=_integer(where, "count", entry.get("count", 1), 1, MAX_COUNT),
            seconds=seconds,
            factor=_number(where, "factor", entry.get("factor", 1.0), -MAX_FACTOR, MAX_FACTOR),
            fault=_gpu_fault(where, entry.get("fault"))
            if kind == "gpu"
            else _text(where, "fault", entry.get("fault", "")),
            gpu=_integer(where, "gpu", entry.get("gpu", 0), 0, MAX_GPU),
            xid=None if entry.get("xid") is None else _integer(where, "xid", entry["xid"], 0, MAX_XID),
        )
        spec._check(where)
        return spec

    def _check(self, where: str) -> None:
        if self.step < 0 or self.until < self.step:
            raise ScheduleError(f"{where}: need 0 <= step <= until")
        if self.kind in ("bitflip", "nan", "inf") and self.target not in TARGETS:
            raise ScheduleError(f"{where}: target must be one of {', '.join(TARGETS)}, got {self.target!r}")

    def active(self, step: int, rank: int) -> bool:
        return self.step <= step <= self.until and (self.ranks is None or rank in self.ranks)

    def to_dict(self) -> dict[str, Any]:
        """The entry as a schedule file writes it: ``kind``, ``step`` and every field set away from its default.

        >>> spec = FaultSpec.from_dict({"kind": "delay", "seconds": 0.5, "step": 3, "ranks": [1]})
        >>> spec.to_dict()
        {'kind': 'delay', 'step': 3, 'ranks': [1], 'seconds': 0.5}
        >>> FaultSpec.from_dict(spec.to_dict()) == spec
        True
        """
        out: dict[str, Any] = {"kind": self.kind, "step": self.step}
        for item in fields(self):
            value = getattr(self, item.name)
            default = self.step if item.name == "until" else item.default
            if item.name not in out and value != default:
                out[item.name] = list(value) if isinstance(value, tuple) else value
        return out

    def describe(self) -> str:
        """One line for the terminal and the report.

        >>> FaultSpec.from_dict({"kind": "lr_scale", "factor": 30, "step": 650, "until": 654}).describe()
        'step 650-654: learning rate x30 (loss spike) on every rank'
        """
        who = "every rank" if self.ranks is None else "rank " + ", ".join(str(r) for r in self.ranks)
        when = f"step {self.step}" + (f"-{self.until}" if self.until != self.step else "")
        if self.kind == "gpu":
            what = f"simulated {self.fault.replace('_', ' ')}" + (f" (XID {self.xid})" if self.xid else "")
        elif self.kind == "delay":
            what = f"straggler: +{self.seconds:g} s per step"
        elif self.kind == "lr_scale":
            what = f"learning rate x{self.factor:g} (loss spike)"
        elif self.kind == "collective_delay":
            what = f"slow link: +{self.seconds:g} s per collective"
        else:
            what = self.kind
        return f"{when}: {what} on {who}"


def load_schedule(source: str | os.PathLike[str] | Sequence[Mapping[str, Any]] | None) -> list[FaultSpec]:
    """A schedule from a YAML/JSON file or a list of dictionaries (``None``: ``TRAINHEALTH_FAULTS``, if set).

    A file's errors start with its path.
    """
    if source is None:
        source = os.environ.get("TRAINHEALTH_FAULTS") or None
        if source is None:
            return []
    if not isinstance(source, (str, os.PathLike)):
        return _entries(source)
    path = Path(source)
    try:
        return _entries(_read_schedule_file(path))
    except ScheduleError as exc:
        raise ScheduleError(f"{path}: {exc}") from None


def _read_schedule_file(path: Path) -> Any:
    import yaml

    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a pipe or a device would block or never end
            raise ScheduleError("not a regular file")
        with path.open("rb") as handle:
            data = handle.read(MAX_SCHEDULE_BYTES + 1)
    except OSError as exc:
        raise ScheduleError(exc.strerror or str(exc)) from None
    if len(data) > MAX_SCHEDULE_BYTES:
        raise ScheduleError(f"larger than {MAX_SCHEDULE_BYTES} bytes; not a fault schedule")
    try:
        loaded = yaml.safe_load(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ScheduleError("not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise ScheduleError(f"not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise ScheduleError("nested too deeply") from None
    if isinstance(loaded, Mapping):
        extra = sorted(str(key) for key in loaded if key != "faults")
        if extra or "faults" not in loaded:
            raise ScheduleError(f"a mapping must hold only 'faults' (found {', '.join(extra) or 'nothing'})")
        loaded = loaded["faults"]
    return loaded


def _entries(entries: Any) -> list[FaultSpec]:
    if not isinstance(entries, list):
        raise ScheduleError("a fault schedule is a list of entries (or a mapping with a 'faults' list)")
    if len(entries) > MAX_ENTRIES:
        raise ScheduleError(f"more than {MAX_ENTRIES} entries")
    return [FaultSpec.from_dict(entry, position) for position, entry in enumerate(entries)]
