"""An Accelerate tracker: ``Accelerator(log_with=[TrainhealthTracker(model, optimizer)])``, then ``init_trackers``.

Create the tracker on every rank, before ``Accelerator(...)``, with the model and
optimizer you will ``prepare``: each rank's Monitor hooks that optimizer (Accelerate's
wrapper steps it only at the end of a gradient-accumulation cycle, on every rank at once),
reading the learning rate each step applies and running the cross-replica checks there.

Every rank records its own steps: each optimizer step is one Monitor step. ``accelerator.init_trackers(...)``
is required (without it ``accelerator.log`` has no tracker to call) and, like ``accelerator.log``, runs on
the main process only. So ``accelerator.log({...}, step=...)`` after an optimizer step gives that step,
on rank 0, the values logged: ``loss``, ``grad_norm`` (log what ``accelerator.clip_grad_norm_``
returns, the norm before clipping; without it the Monitor computes the norm of the gradients the
optimizer receives) and ``tokens``, and its number; the learning rate per parameter group is the one
the optimizer applied (a ``log`` before the optimizer step records that step as it did before). An
optimizer step nobody logs (every step on the other ranks) is recorded
without those values when the model's next forward pass begins (without a model: the next optimizer
step), numbered like the logged ones (0, 1, ... unless ``log`` numbered them otherwise). A loop can still
call ``tracker.log(values, step=step)`` itself on any rank to export that rank's own loss, tokens and
gradient norm. ``accelerator.end_training()`` closes rank 0's tracker (the last export), ``tracker.finish()``
the others' (else their Monitor closes at interpreter exit, without the last step).

When ``accelerator.prepare`` wraps the model in DistributedDataParallel, the tracker registers the
collective logger's communication hook on the wrapper at the model's first forward pass (with the logger
on: ``comm=True`` or ``TRAINHEALTH_COMM=1``), so DDP's bucket all-reduces are in the trace.
Keyword arguments are Monitor settings.

Checkpoint saves are announced as pauses (``Monitor.pause("checkpoint")``) on the main process: the
Accelerator hands itself to its trackers only there, calling ``start()`` from ``init_trackers``, and
has no hook after a save (``register_save_state_pre_hook`` runs midway, after FSDP and DeepSpeed have
written the model), so ``start()`` wraps that Accelerator's ``save_state`` and ``save_model`` on the
instance: each call passes through unchanged, inside the pause, and a ``save_state`` is reported as a
checkpoint of the last optimizer step, numbered like the recorded steps. ``finish()`` puts them back.
Accelerate has no evaluation signal (the loop evaluates as it likes): wrap an evaluation, and a save on
the other ranks, in ``tracker.monitor.pause("evaluation")`` / ``pause("checkpoint")``.
"""

from __future__ import annotations

from typing import Any

from trainhealth._internal.integrations._versions import require

require("accelerate")

from accelerate import Accelerator
from accelerate.tracking import GeneralTracker

from trainhealth._internal.exporters.monitor import Monitor
from trainhealth._internal.exporters.wiring import base_optimizer
from trainhealth._internal.integrations._callers import calling_instance
from trainhealth._internal.integrations._ddp import ddp_running, instrument
from trainhealth._internal.integrations._pauses import CHECKPOINT, Pauses

__all__ = ["TrainhealthTracker"]

#: Training forward passes in which the tracker looks for the DDP wrapper before it stops looking.
_DDP_SEARCH_FORWARDS = 8


class TrainhealthTracker(GeneralTracker):
    """One Monitor per rank, stepped at each optimizer step; ``tracker`` (and ``monitor``) is the Monitor."""

    name = "trainhealth"
    requires_logging_directory = False
    # Accelerator.init_trackers, .log and .get_tracker run on the main process whatever this says;
    # it only keeps Accelerate from gating this tracker's own methods, so ``tracker.log`` works on any rank.
    main_process_only = False

    def __init__(self, model: Any = None, optimizer: Any = None, **monitor_settings: Any) -> None:
        super().__init__()
        self.monitor = Monitor(model, optimizer, **monitor_settings)
        self._model = model
        self._optimizer_steps = 0
        self._offset = 0  # log's step number minus the optimizer step count, from the last logged step
        self._pending: int | None = None  # the optimizer step that ended and is not recorded yet
        self._logged_early = False  # log() recorded a step before this step's optimizer step ended
        self._ddp_searches = _DDP_SEARCH_FORWARDS if self.monitor.comm is not None else 0
        self._handles: list[Any] = []
        self._pauses = Pauses(self.monitor)
        self._accelerator: Any = None  # the Accelerator whose saves are announced (main process)
        hooked = base_optimizer(optimizer)
        if hooked is not None and hasattr(hooked, "register_step_post_hook"):
            self._handles.append(hooked.register_step_post_hook(self._optimizer_stepped))
            if model is None or not hasattr(model, "register_forward_pre_hook"):
                self._handles.append(hooked.register_step_pre_hook(self._optimizer_steps_next))
        if model is not None and hasattr(model, "register_forward_pre_hook"):
            self._handles.append(model.register_forward_pre_hook(self._forward_begins))

    @property
    def tracker(self) -> Monitor:
        return self.monitor

    def start(self) -> None:
        """Called by ``Accelerator.init_trackers`` (main process): announce that Accelerator's saves as pauses."""
        accelerator = _calling_accelerator()
        if accelerator is None or accelerator is self._accelerator:
            return
        self._pauses.end()  # a tracker started again by another Accelerator
        self._accelerator = accelerator
        self._pauses.around(accelerator, "save_state", CHECKPOINT, after=self._state_saved)
        self._pauses.around(accelerator, "save_model", CHECKPOINT)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        return  # hyperparameters are not metrics

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """One Monitor step from ``values``' ``loss``, ``grad_norm`` and ``tokens`` (each optional).

        After an optimizer step it is that step, numbered ``step``.
        """
        pending, self._pending = self._pending, None
        if pending is None:  # logged before the optimizer step (or again): that step is this one
            self._logged_early = True
        elif step is not None:
            try:
                self._offset = int(step) - pending
            except (TypeError, ValueError):
                pass
        self.monitor.step(
            loss=values.get("loss"), tokens=values.get("tokens"), grad_norm=values.get("grad_norm"), step=step
        )

    def finish(self) -> None:
        self._pauses.end()
        self._accelerator = None
        self._record_pending()
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.monitor.close()

    # --- hooks: never raise into the training loop ------------------------------------
    def _optimizer_stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            self._record_pending()  # a step that never met a forward pass (a loop without a model)
            if not self._logged_early:
                self._pending = self._optimizer_steps
            self._logged_early = False
            self._optimizer_steps += 1
        except Exception as exc:  # noqa: BLE001
            self.monitor.store.record_error("monitor", exc)

    def _state_saved(self) -> None:
        """After ``save_state``: a checkpoint of the last optimizer step, numbered as :meth:`log` numbers it."""
        self.monitor.checkpoint_saved(max(self._optimizer_steps - 1, 0) + self._offset)

    def _optimizer_steps_next(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._record_pending()

    def _forward_begins(self, module: Any, args: Any) -> None:
        try:
            if not module.training:
                return
            self._record_pending()
            if self._ddp_searches:
                self._ddp_searches -= 1
                wrapper = ddp_running(module)
                if wrapper is not None:
                    self._ddp_searches = 0
                    instrument(self.monitor, wrapper)
        except Exception as exc:  # noqa: BLE001
            self.monitor.store.record_error("monitor", exc)

    def _record_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            self.monitor.step(step=pending + self._offset)


def _calling_accelerator() -> Any:
    """The ``accelerate.Accelerator`` among the callers (the one whose ``init_trackers`` runs), else ``None``."""
    return calling_instance(Accelerator, 8)
