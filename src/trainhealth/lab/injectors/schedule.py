"""Fault injectors for real training runs, scheduled by step and rank, each injection logged as ground truth.

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
* ``batch`` — the inputs passed through :meth:`Injector.corrupt_batch` are
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

>>> import torch
>>> model = torch.nn.Linear(4, 4)
>>> injector = Injector([{"kind": "bitflip", "target": "parameter", "tensor": "weight", "bit": 30,
...                       "step": 2}], model=model, rank=0, seed=1)
>>> injector.begin_step(1); len(injector.log)
0
>>> injector.begin_step(2); [(e["kind"], e["tensor"], e["bit"]) for e in injector.log]
[('bitflip', 'weight', 30)]
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import os
import random
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from trainhealth.events import Event, EventLog, Severity
from trainhealth.lab.injectors.bits import BIT_FIELDS, flip_bits, float_layout, resolve_bit, set_values

__all__ = ["FAULT_KINDS", "FaultSpec", "Injector", "load_schedule"]

log = logging.getLogger(__name__)

FAULT_KINDS = ("bitflip", "nan", "inf", "delay", "collective_delay", "lr_scale", "batch", "gpu")
TARGETS = ("parameter", "gradient", "activation")
_FIELDS = {"kind", "step", "until", "ranks", "target", "tensor", "bit", "count", "seconds", "factor", "fault", "gpu",
           "xid"}


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
    number: Any = value
    if isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            number = None
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        number = int(value)
    if isinstance(number, bool) or not isinstance(number, int) or not low <= number <= high:
        raise ScheduleError(f"{where}: {name} must be an integer from {low} to {high}, got {value!r}")
    return number


def _number(where: str, name: str, value: Any, low: float, high: float, *, low_open: bool = False) -> float:
    """``value`` as a finite number in the range (above ``low`` with ``low_open``), else ScheduleError."""
    number: Any = None
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            number = float(value)
        except (ValueError, OverflowError):
            number = None
    inside = number is not None and math.isfinite(number) and (number > low if low_open else number >= low) \
        and number <= high
    if not inside:
        span = f"above {low:g} up to {high:g}" if low_open else f"from {low:g} to {high:g}"
        raise ScheduleError(f"{where}: {name} must be a finite number {span}, got {value!r}")
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
    raise ScheduleError(f"{where}: bit must be an index from 0 to 63 or one of {', '.join(BIT_FIELDS)}, "
                        f"got {value!r}")


def _gpu_fault(where: str, value: Any) -> str:
    from trainhealth.exporters.gpu.simulated_device import SimulatedFaultKind

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
            kind=kind, step=step, until=until, ranks=_ranks(where, entry.get("ranks")),
            target=_text(where, "target", entry.get("target", "parameter")),
            tensor=_text(where, "tensor", entry.get("tensor", "*")),
            bit=_bit(where, entry.get("bit", "exponent-high")),
            count=_integer(where, "count", entry.get("count", 1), 1, MAX_COUNT), seconds=seconds,
            factor=_number(where, "factor", entry.get("factor", 1.0), -MAX_FACTOR, MAX_FACTOR),
            fault=_gpu_fault(where, entry.get("fault")) if kind == "gpu" else _text(where, "fault", entry.get("fault", "")),
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


class Injector:
    """Applies a schedule to one rank's training. Call :meth:`begin_step` at the start of every step.

    ``model`` and ``optimizer`` are needed for tensor and learning-rate faults;
    ``simulated_gpu`` (a :class:`~trainhealth.exporters.gpu.simulated.SimulatedNvml`)
    for ``gpu`` faults. Every injection is appended to :attr:`log`, written as one
    JSON line to ``ground_truth`` (a file) and, with ``events``, emitted as a
    ``fault_injected`` event.
    """

    _delay_installed: Callable[[], None] | None  # set by _install_collective_delay, cleared by close

    def __init__(self, schedule: str | os.PathLike[str] | Sequence[Mapping[str, Any]] | Sequence[FaultSpec] | None,
                 *, model: Any = None, optimizer: Any = None, rank: int | None = None, seed: int = 0,
                 ground_truth: str | os.PathLike[str] | None = None, events: EventLog | None = None,
                 simulated_gpu: Any = None) -> None:
        if schedule is not None and not isinstance(schedule, (str, os.PathLike)) and all(
                isinstance(s, FaultSpec) for s in schedule):
            self.schedule: list[FaultSpec] = cast("list[FaultSpec]", list(schedule))
        else:  # a file, dictionaries (FaultSpec.from_dict checks each) or None
            self.schedule = load_schedule(cast("str | os.PathLike[str] | Sequence[Mapping[str, Any]] | None", schedule))
        self.rank = _rank() if rank is None else rank
        self.model = model
        self.optimizer = optimizer
        self.simulated_gpu = simulated_gpu
        self.events = events
        self.log: list[dict[str, Any]] = []
        self._random = random.Random(seed * 1_000_003 + self.rank)
        self._ground_truth = Path(ground_truth) if ground_truth else None
        self._lock = threading.Lock()
        self._step = -1
        self._hooks: list[Any] = []
        self._scaled_lr: list[tuple[dict[str, Any], float]] = []
        self._collective_delay = 0.0
        self._batch_factor = 1.0
        needs_model = any(s.kind in ("bitflip", "nan", "inf") for s in self.schedule if self._mine(s))
        if needs_model and model is None:
            raise ScheduleError("tensor faults (bitflip, nan, inf) need the model: Injector(..., model=model)")
        if any(s.kind == "lr_scale" for s in self.schedule if self._mine(s)) and optimizer is None:
            raise ScheduleError("lr_scale faults need the optimizer: Injector(..., optimizer=optimizer)")
        if any(s.kind == "collective_delay" for s in self.schedule if self._mine(s)):
            self._install_collective_delay()

    def _mine(self, spec: FaultSpec) -> bool:
        return spec.ranks is None or self.rank in spec.ranks

    # --- the training loop calls these -----------------------------------------------
    def begin_step(self, step: int) -> None:
        """Apply what the schedule has for ``step`` on this rank (and undo what ended)."""
        self._step = step
        self._restore_learning_rates()
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self._collective_delay = 0.0
        self._batch_factor = 1.0
        for spec in self.schedule:
            if spec.active(step, self.rank):
                self._apply(spec, step)

    def corrupt_batch(self, batch: Any) -> Any:
        """The batch, multiplied by the active ``batch`` fault's factor (unchanged otherwise)."""
        return batch * self._batch_factor if self._batch_factor != 1.0 else batch

    def close(self) -> None:
        """Undo anything still in effect."""
        self._restore_learning_rates()
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self._collective_delay = 0.0
        undo_delay = getattr(self, "_delay_installed", None)
        if undo_delay is not None:
            undo_delay()
            self._delay_installed = None

    # --- applying -------------------------------------------------------------------
    def _apply(self, spec: FaultSpec, step: int) -> None:
        if spec.kind in ("bitflip", "nan", "inf"):
            if spec.target == "parameter":
                name, tensor = self._find(self.model.named_parameters(), spec)
                self._corrupt(spec, name, tensor, step)
            elif spec.target == "gradient":
                name, parameter = self._find(self.model.named_parameters(), spec)
                self._hooks.append(parameter.register_hook(self._gradient_hook(spec, name, step)))
            else:
                name, module = self._find(self.model.named_modules(), spec)
                self._hooks.append(module.register_forward_hook(self._activation_hook(spec, name, step)))
        elif spec.kind == "delay":
            self._record(spec, step, seconds=spec.seconds)
            time.sleep(spec.seconds)
        elif spec.kind == "collective_delay":
            self._collective_delay = spec.seconds
            self._record(spec, step, seconds=spec.seconds)
        elif spec.kind == "lr_scale":
            for group in self.optimizer.param_groups:
                self._scaled_lr.append((group, group["lr"]))
                group["lr"] = group["lr"] * spec.factor
            self._record(spec, step, factor=spec.factor)
        elif spec.kind == "batch":
            self._batch_factor = spec.factor
            self._record(spec, step, factor=spec.factor)
        elif spec.kind == "gpu":
            self._simulated_gpu_fault(spec, step)

    def _find(self, named: Iterable[tuple[str, Any]], spec: FaultSpec) -> tuple[str, Any]:
        for name, item in named:
            bare = name.removeprefix("module.")  # DDP and similar wrappers
            if fnmatch.fnmatchcase(bare, spec.tensor) or fnmatch.fnmatchcase(name, spec.tensor):
                if spec.target != "activation" and not getattr(item, "is_floating_point", lambda: False)():
                    continue
                return bare, item
        raise ScheduleError(f"no {spec.target} matches tensor {spec.tensor!r}")

    def _corrupt(self, spec: FaultSpec, name: str, tensor: Any, step: int) -> list[tuple[int, float, float]]:
        count = min(spec.count, tensor.numel())
        indices = self._random.sample(range(tensor.numel()), count)
        if spec.kind == "bitflip":
            bit = resolve_bit(spec.bit, float_layout(tensor.dtype), self._random.choice)
            changed = flip_bits(tensor, indices, bit)
            self._record(spec, step, tensor=name, bit=bit, changes=changed)
        else:
            changed = set_values(tensor, indices, float("nan") if spec.kind == "nan" else float("inf"))
            self._record(spec, step, tensor=name, changes=changed)
        return changed

    def _gradient_hook(self, spec: FaultSpec, name: str, step: int) -> Any:
        done: list[bool] = []

        def corrupt(gradient: Any) -> Any:
            if done:
                return gradient
            done.append(True)
            gradient = gradient.clone()
            self._corrupt(spec, name, gradient, step)
            return gradient

        return corrupt

    def _activation_hook(self, spec: FaultSpec, name: str, step: int) -> Any:
        done: list[bool] = []

        def corrupt(module: Any, inputs: Any, output: Any) -> Any:
            if done:
                return output
            tensor = output[0] if isinstance(output, (tuple, list)) else output
            if getattr(tensor, "is_floating_point", lambda: False)():
                done.append(True)
                self._corrupt(spec, name, tensor.contiguous() if not tensor.is_contiguous() else tensor, step)
            return output

        return corrupt

    def _restore_learning_rates(self) -> None:
        for group, lr in reversed(self._scaled_lr):
            group["lr"] = lr
        self._scaled_lr = []

    def _install_collective_delay(self) -> None:
        """Sleep inside this rank's collectives while a ``collective_delay`` is active."""
        import trainhealth.comm

        logger = trainhealth.comm.installed()
        if logger is None:
            raise ScheduleError("collective_delay faults need trainhealth.comm installed first "
                                "(trainhealth.comm.install() or Monitor(comm=True))")
        logger.injected_delay = lambda: self._collective_delay

        def uninstall() -> None:
            logger.injected_delay = None

        self._delay_installed = uninstall

    def _simulated_gpu_fault(self, spec: FaultSpec, step: int) -> None:
        from trainhealth.exporters.gpu.simulated import SimulatedFaultKind, SimulatedFault

        if self.simulated_gpu is None:
            raise ScheduleError("gpu faults need the simulated GPU backend (gpu_backend=simulated)")
        try:
            kind = SimulatedFaultKind(spec.fault)
        except ValueError:
            raise ScheduleError(f"unknown gpu fault {spec.fault!r}; one of "
                                f"{', '.join(k.value for k in SimulatedFaultKind)}") from None
        self.simulated_gpu.inject(SimulatedFault(kind, gpu=spec.gpu, xid=spec.xid))
        self._record(spec, step, fault=spec.fault, gpu=spec.gpu, xid=spec.xid)

    # --- ground truth ---------------------------------------------------------------
    def _record(self, spec: FaultSpec, step: int, **details: Any) -> None:
        entry = {"time": time.time(), "step": step, "rank": self.rank, "kind": spec.kind,
                 **({"target": spec.target} if spec.kind in ("bitflip", "nan", "inf") else {}), **details}
        with self._lock:
            self.log.append(entry)
            if self._ground_truth is not None:
                try:
                    self._ground_truth.parent.mkdir(parents=True, exist_ok=True)
                    with self._ground_truth.open("a", encoding="utf-8") as handle:
                        handle.write(json.dumps(entry, default=float) + "\n")
                except OSError:
                    log.warning("trainhealth: cannot write fault ground truth to %s", self._ground_truth, exc_info=True)
        if self.events is not None:
            what = ", ".join(f"{k}={v}" for k, v in details.items() if k != "changes")
            self.events.emit(Event("fault_injected", Severity.INFO, f"injected {spec.kind} on rank {self.rank} at "
                                   f"step {step}" + (f" ({what})" if what else ""),
                                   {"kind": spec.kind, "rank": str(self.rank)}))


def _rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except ImportError:
        pass
    return int(os.environ.get("RANK", "0"))


