"""Fault injectors for real training runs: an :class:`Injector` applies a fault schedule to one rank's
training step by step and logs each injection as ground truth.

The schedule's faults, fields and limits, and how it is read and checked, are in
:mod:`trainhealth._internal.injectors.schedule_file`.

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
import functools
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from trainhealth._internal.events import Event, EventLog, Severity
from trainhealth._internal.faults import Fault
from trainhealth._internal.injectors.bits import flip_bits, float_layout, resolve_bit, set_values
from trainhealth._internal.injectors.schedule_file import ScheduleError, load_schedule

__all__ = ["Injector"]

log = logging.getLogger(__name__)


class Injector:
    """Applies a schedule to one rank's training. Call :meth:`begin_step` at the start of every step.

    ``model`` and ``optimizer`` are needed for tensor and learning-rate faults;
    ``simulated_gpu`` (a :class:`~trainhealth._internal.exporters.gpu.simulated.SimulatedNvml`)
    for ``gpu`` faults. Every injection is appended to :attr:`log`, written as one
    JSON line to ``ground_truth`` (a file) and, with ``events``, emitted as a
    ``fault_injected`` event.
    """

    _delay_installed: Callable[[], None] | None  # set by _install_collective_delay, cleared by close

    def __init__(
        self,
        schedule: str | os.PathLike[str] | Sequence[Mapping[str, Any]] | Sequence[Fault] | None,
        *,
        model: Any = None,
        optimizer: Any = None,
        rank: int | None = None,
        seed: int = 0,
        ground_truth: str | os.PathLike[str] | None = None,
        events: EventLog | None = None,
        simulated_gpu: Any = None,
    ) -> None:
        if (
            schedule is not None
            and not isinstance(schedule, (str, os.PathLike))
            and all(isinstance(s, Fault) for s in schedule)
        ):
            self.schedule: list[Fault] = cast("list[Fault]", list(schedule))
        else:  # a file, dictionaries (Fault.from_dict checks each) or None
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

    def _mine(self, spec: Fault) -> bool:
        return not spec.ranks or self.rank in spec.ranks

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
    def _apply(self, spec: Fault, step: int) -> None:
        if spec.kind in ("bitflip", "nan", "inf"):
            if spec.params["target"] == "parameter":
                name, tensor = self._find(self.model.named_parameters(), spec)
                self._corrupt(spec, name, tensor, step)
            elif spec.params["target"] == "gradient":
                name, parameter = self._find(self.model.named_parameters(), spec)
                self._hooks.append(parameter.register_hook(self._gradient_hook(spec, name, step)))
            else:
                name, module = self._find(self.model.named_modules(), spec)
                # first among the module's hooks: they see the output as the faulty module produced it
                self._hooks.append(module.register_forward_hook(self._activation_hook(spec, name, step), prepend=True))
        elif spec.kind == "delay":
            self._record(spec, step, seconds=spec.severity)
            time.sleep(spec.severity)
        elif spec.kind == "collective_delay":
            self._collective_delay = spec.severity
            self._record(spec, step, seconds=spec.severity)
        elif spec.kind == "lr_scale":
            for group in self.optimizer.param_groups:
                self._scaled_lr.append((group, group["lr"]))
                group["lr"] = group["lr"] * spec.severity
            self._record(spec, step, factor=spec.severity)
        elif spec.kind == "batch":
            self._batch_factor = spec.severity
            self._record(spec, step, factor=spec.severity)
        elif spec.kind == "simulated_gpu":
            self._simulated_gpu_fault(spec, step)

    def _find(self, named: Iterable[tuple[str, Any]], spec: Fault) -> tuple[str, Any]:
        for name, item in named:
            bare = name.removeprefix("module.")  # DDP and similar wrappers
            if fnmatch.fnmatchcase(bare, spec.params["tensor"]) or fnmatch.fnmatchcase(name, spec.params["tensor"]):
                if spec.params["target"] != "activation" and not getattr(item, "is_floating_point", lambda: False)():
                    continue
                return bare, item
        raise ScheduleError(f"no {spec.params['target']} matches tensor {spec.params['tensor']!r}")

    def _corrupt(self, spec: Fault, name: str, tensor: Any, step: int) -> list[tuple[int, float, float]]:
        count = min(spec.params["count"], tensor.numel())
        indices = self._random.sample(range(tensor.numel()), count)
        if spec.kind == "bitflip":
            bit = resolve_bit(spec.params["bit"], float_layout(tensor.dtype), self._random.choice)
            changed = flip_bits(tensor, indices, bit)
            self._record(spec, step, tensor=name, bit=bit, changes=changed)
        else:
            changed = set_values(tensor, indices, float("nan") if spec.kind == "nan" else float("inf"))
            self._record(spec, step, tensor=name, changes=changed)
        return changed

    def _gradient_hook(self, spec: Fault, name: str, step: int) -> Any:
        done: list[bool] = []

        def corrupt(gradient: Any) -> Any:
            if done:
                return gradient
            done.append(True)
            gradient = gradient.clone()
            self._corrupt(spec, name, gradient, step)
            return gradient

        return corrupt

    def _activation_hook(self, spec: Fault, name: str, step: int) -> Any:
        done: list[bool] = []

        def corrupt(module: Any, inputs: Any, output: Any) -> Any:
            if done:
                return output
            tensor = output[0] if isinstance(output, (tuple, list)) else output
            if not getattr(tensor, "is_floating_point", lambda: False)():
                return output
            done.append(True)
            if tensor.is_contiguous():
                self._corrupt(spec, name, tensor, step)
                return output
            corrupted = tensor.contiguous()  # a copy (attention outputs are transposed views): return it instead
            self._corrupt(spec, name, corrupted, step)
            if isinstance(output, (tuple, list)):
                return type(output)([corrupted, *output[1:]])
            return corrupted

        return corrupt

    def _restore_learning_rates(self) -> None:
        for group, lr in reversed(self._scaled_lr):
            group["lr"] = lr
        self._scaled_lr = []

    def _install_collective_delay(self) -> None:
        """Sleep inside this rank's collectives while a ``collective_delay`` is active, as a slow link would.

        From outside the logger: every recorded torch.distributed function is recorded again around a version
        of its original that sleeps first, so the sleep falls inside the recorded duration (DDP's bucket hook
        looks its all-reduce up under the recording wrapper, and finds the sleeping one too). ``close`` puts
        the logger's wrappers back.
        """
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        from trainhealth._internal.exporters.collectives.install import installed

        logger = installed()
        if logger is None:
            raise ScheduleError(
                "collective_delay faults need trainhealth.comm installed first "
                "(trainhealth.comm.install() or Monitor(comm=True))"
            )
        from trainhealth._internal.exporters.collectives.wrappers import COMMUNICATION_FUNCTIONS

        recorder = logger

        replaced: dict[str, tuple[Any, Any]] = {}  # name -> (the logger's wrapper, ours)
        for name in COMMUNICATION_FUNCTIONS:
            wrapper = getattr(c10d, name, None)
            if getattr(wrapper, "recorded_by", None) is not recorder:  # not recorded (an alias that runs one, absent)
                continue
            ours = recorder.wrap(name, self._sleeping_first(cast(Any, wrapper).__wrapped__))
            replaced[name] = (wrapper, ours)
            setattr(c10d, name, ours)
            if getattr(dist, name, None) is wrapper:
                setattr(dist, name, ours)

        def uninstall() -> None:
            for name, (wrapper, ours) in replaced.items():
                if getattr(c10d, name, None) is ours:  # not already restored by trainhealth.comm.uninstall
                    setattr(c10d, name, wrapper)
                if getattr(dist, name, None) is ours:
                    setattr(dist, name, wrapper)

        self._delay_installed = uninstall

    def _sleeping_first(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)  # the same signature: the logger reads its arguments by position
        def sleeping(*args: Any, **kwargs: Any) -> Any:
            if self._collective_delay > 0:
                time.sleep(self._collective_delay)
            return original(*args, **kwargs)

        return sleeping

    def _simulated_gpu_fault(self, spec: Fault, step: int) -> None:
        from trainhealth._internal.exporters.gpu.simulated import SimulatedFault, SimulatedFaultKind

        if self.simulated_gpu is None:
            raise ScheduleError("simulated_gpu faults need the simulated GPU backend (gpu_backend=simulated)")
        try:
            kind = SimulatedFaultKind(spec.params["fault"])
        except ValueError:
            raise ScheduleError(
                f"unknown gpu fault {spec.params['fault']!r}; one of {', '.join(k.value for k in SimulatedFaultKind)}"
            ) from None
        self.simulated_gpu.inject(SimulatedFault(kind, gpu=spec.params["gpu"], xid=spec.params["xid"]))
        self._record(spec, step, fault=spec.params["fault"], gpu=spec.params["gpu"], xid=spec.params["xid"])

    # --- ground truth ---------------------------------------------------------------
    def _record(self, spec: Fault, step: int, **details: Any) -> None:
        entry = {
            "time": time.time(),
            "step": step,
            "rank": self.rank,
            "kind": spec.kind,
            **({"target": spec.params["target"]} if spec.kind in ("bitflip", "nan", "inf") else {}),
            **details,
        }
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
            self.events.emit(
                Event(
                    "fault_injected",
                    Severity.INFO,
                    f"injected {spec.kind} on rank {self.rank} at step {step}" + (f" ({what})" if what else ""),
                    {"kind": spec.kind, "rank": str(self.rank)},
                )
            )


def _rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except ImportError:
        pass
    return int(os.environ.get("RANK", "0"))
