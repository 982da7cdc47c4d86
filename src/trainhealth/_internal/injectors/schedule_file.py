"""The fault schedule: which faults, at which steps, on which ranks, read and checked before a run.

A schedule is a list of :class:`~trainhealth._internal.faults.Fault` entries: a YAML or JSON file
(``TRAINHEALTH_FAULTS``, at most 1 MiB) or dictionaries. The kinds injected into a real run are
declared here (``kind`` in an entry):

* ``bitflip`` — flip ``bit`` (an index or a field: ``sign``, ``exponent``,
  ``exponent-high``, ``mantissa``, ``mantissa-high``, ``mantissa-low``) of
  ``count`` elements of a ``parameter`` (this replica's weights, before the
  step's forward), a ``gradient`` (this rank's gradient as backward computes it,
  before the data-parallel all-reduce) or an ``activation`` (a module's output);
  ``target`` says which, ``tensor`` names the parameter or module (a glob; the first match).
* ``nan`` / ``inf`` — the same targets, values set to NaN or infinity.
* ``delay`` — this rank sleeps ``severity`` seconds before the step's work (a straggler).
* ``collective_delay`` — this rank's collectives take ``severity`` seconds longer, inside
  the collective (a slow link: every member's operation is prolonged).
* ``lr_scale`` — the learning rate is multiplied by ``severity`` (a loss spike).
* ``batch`` — the inputs passed through
  :meth:`~trainhealth._internal.injectors.schedule.Injector.corrupt_batch` are
  multiplied by ``severity`` (a corrupt batch).
* ``simulated_gpu`` — a hardware fault of the simulated GPU backend
  (``fault``: xid, thermal_throttle, slow_clocks, gpu_lost, ...; ``gpu``, ``xid``).

Each entry has ``step`` (first step), optional ``until`` (last step, default
``step``: these kinds are events) and ``ranks`` (default: every rank).

Every field is checked when the schedule is loaded, and a :class:`ScheduleError`
names the file, the entry and the field: ``step`` and ``until`` are integers from
0 to 10**9, ``ranks`` from 0 to 65535, ``count`` at least 1, a delay's ``severity``
above 0 up to 3600 seconds, a factor within ±1e6, ``bit`` an index from 0 to 63 or
a field name, ``gpu`` from 0 to 1023; NaN and infinities are refused.

>>> schedule = load_schedule([{"kind": "delay", "severity": 0.5, "step": 3, "ranks": [1]}])
>>> [(fault.kind, fault.step, fault.until, fault.ranks) for fault in schedule]
[('delay', 3, 3, (1,))]
>>> schedule[0].describe()
'step 3: straggler: +0.5 s per step on rank 1'
>>> load_schedule([{"kind": "delay", "step": 3}])
Traceback (most recent call last):
...
trainhealth._internal.injectors.schedule_file.ScheduleError: fault #1: delay: severity is required (above 0 up to 3600)
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainhealth._internal.config.fields import Range
from trainhealth._internal.faults import Fault, FaultError, FaultKind, Param, register
from trainhealth._internal.injectors.bits import BIT_FIELDS

__all__ = ["FAULT_KINDS", "ScheduleError", "load_schedule"]

FAULT_KINDS = ("bitflip", "nan", "inf", "delay", "collective_delay", "lr_scale", "batch", "simulated_gpu")
#: Where a bit flip, NaN or infinity goes (the ``target`` setting).
TARGETS = ("parameter", "gradient", "activation")


class ScheduleError(ValueError):
    """A schedule that cannot be run: names the file, the entry and the field."""


#: The ranges a schedule's fields must lie in (seconds are a wall-clock delay).
MAX_SECONDS = 3600.0
MAX_FACTOR = 1e6
MAX_COUNT = 10**9
MAX_GPU = 1023
MAX_XID = 65535
#: A schedule file larger than this, or with more entries, is refused.
MAX_SCHEDULE_BYTES = 1 << 20
MAX_ENTRIES = 10_000


def _integer(low: int, high: int, *, optional: bool = False) -> Any:
    bounds = Range(low, high, integer=True)

    def check(value: Any) -> int | None:
        if value is None and optional:
            return None
        number: Any = value
        if isinstance(value, str):
            try:
                number = int(value.strip())
            except ValueError:
                number = None
        if number not in bounds:
            raise ValueError(f"must be an integer {bounds}, got {value!r}")
        return int(number)

    return check


def _one_of(choices: Sequence[str]) -> Any:
    def check(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}, got {value!r}")
        return str(value)

    return check


def _text(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"must be a string, got {value!r}")
    return str(value)


def _bit(value: Any) -> int | str:
    if isinstance(value, str) and value in BIT_FIELDS:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 63:
        return value
    raise ValueError(f"must be an index from 0 to 63 or one of {', '.join(BIT_FIELDS)}, got {value!r}")


def _gpu_fault(value: Any) -> str:
    from trainhealth._internal.exporters.gpu.simulated_device import SimulatedFaultKind

    return _one_of([kind.value for kind in SimulatedFaultKind])(value)


def _simulated_gpu(severity: float, fault: str, gpu: int, xid: int | None) -> str:
    return f"simulated {fault.replace('_', ' ')} on GPU {gpu}" + (f" (XID {xid})" if xid else "")


_NUMERICS = {
    "target": Param("parameter", _one_of(TARGETS), "parameter, gradient or activation"),
    "tensor": Param("*", _text, "the parameter or module (a glob; the first match)"),
    "count": Param(1, _integer(1, MAX_COUNT), "elements changed"),
}
_SECONDS = Range(0.0, MAX_SECONDS, above_low=True)
_FACTOR = Range(-MAX_FACTOR, MAX_FACTOR)
for _kind in (
    FaultKind(
        "bitflip",
        "injectors",
        "bit {bit} flipped in {count} element(s) of {target} {tensor}",
        params={**_NUMERICS, "bit": Param("exponent-high", _bit, "an index or a field")},
        once=True,
    ),
    FaultKind("nan", "injectors", "NaN in {count} element(s) of {target} {tensor}", params=_NUMERICS, once=True),
    FaultKind("inf", "injectors", "infinity in {count} element(s) of {target} {tensor}", params=_NUMERICS, once=True),
    FaultKind("delay", "injectors", "straggler: +{severity:g} s per step", severity=_SECONDS, once=True),
    FaultKind(
        "collective_delay", "injectors", "slow link: +{severity:g} s per collective", severity=_SECONDS, once=True
    ),
    FaultKind("lr_scale", "injectors", "learning rate x{severity:g} (loss spike)", severity=_FACTOR, once=True),
    FaultKind("batch", "injectors", "inputs x{severity:g} (a corrupt batch)", severity=_FACTOR, once=True),
    FaultKind(
        "simulated_gpu",
        "injectors",
        _simulated_gpu,
        params={
            "fault": Param("xid", _gpu_fault, "the simulated hardware fault"),
            "gpu": Param(0, _integer(0, MAX_GPU), "the simulated GPU's index"),
            "xid": Param(None, _integer(0, MAX_XID, optional=True), "the XID an xid fault reports"),
        },
        once=True,
    ),
):
    register(_kind)


def _entry(entry: Any, position: int) -> Fault:
    where = f"fault #{position + 1}"
    if isinstance(entry, Mapping) and entry.get("kind") not in FAULT_KINDS:
        renamed = " (kind gpu is now simulated_gpu)" if entry.get("kind") == "gpu" else ""
        raise ScheduleError(
            f"{where}: kind must be one of {', '.join(FAULT_KINDS)}, got {entry.get('kind')!r}{renamed}"
        )
    if isinstance(entry, Mapping) and "step" not in entry:
        raise ScheduleError(f"{where}: step is required")
    try:
        return Fault.from_dict(entry)
    except FaultError as exc:
        raise ScheduleError(f"{where}: {exc}") from None


def load_schedule(source: str | os.PathLike[str] | Sequence[Mapping[str, Any]] | None) -> list[Fault]:
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


def _entries(entries: Any) -> list[Fault]:
    if not isinstance(entries, list):
        raise ScheduleError("a fault schedule is a list of entries (or a mapping with a 'faults' list)")
    if len(entries) > MAX_ENTRIES:
        raise ScheduleError(f"more than {MAX_ENTRIES} entries")
    return [_entry(entry, position) for position, entry in enumerate(entries)]
