"""A Hugging Face ``transformers`` callback: ``Trainer(..., callbacks=[TrainhealthCallback()])``.

The values are taken where the Trainer computes them, so they equal what it logs:

* the **gradient norm** is the value of ``Trainer._get_grad_norm`` (the total norm *before*
  clipping, which the Trainer logs as ``grad_norm``; with ``max_grad_norm=0`` the unclipped norm);
* the **loss** is the sum of ``Trainer.training_step``'s returns over the optimizer step's
  micro-batches, which is what the Trainer adds to the loss it logs (gradient accumulation
  and ``num_items_in_batch`` scaling included). It is this rank's loss: on several ranks the
  Trainer logs the mean over ranks, which is the mean of the ranks' exported losses;
* the **tokens** are the elements of the model's main input (``input_ids``) in those micro-batches;
* the **learning rate** is the one the optimizer step applied (the Monitor reads it in its
  optimizer pre-step hook, before the scheduler moves it: the Trainer's ``learning_rate``);
* the **step** is ``state.global_step``; saved checkpoints are reported
  (``trainhealth_checkpoint_last_step``). With the collective logger on (``comm=True``), the
  collective, ``forward`` and ``optimizer`` rows of an optimizer step carry the step number of
  its ``step`` marker, from the first step on;
* **pauses**: the Trainer's checkpoint saves and evaluations are announced as pauses
  (``Monitor.pause("checkpoint")``, ``Monitor.pause("evaluation")``), so neither this rank nor its peers
  waiting for it count as hung meanwhile. ``DefaultFlowCallback`` (the Trainer's first callback) sets
  ``control.should_evaluate`` / ``should_save`` in ``on_step_end`` and ``on_epoch_end``, and the Trainer
  evaluates, then saves, right after those events (``_maybe_log_save_evaluate``): this callback opens the
  evaluation's pause there (the save's when there is no evaluation), closes it at ``on_evaluate`` and
  opens the save's, which ``on_save`` closes. With ``save_strategy="best"`` the Trainer decides to save
  only after ``on_evaluate``: the save's pause opens there anyway and, when no save follows, closes at the
  next ``on_step_begin``. ``eval_on_start``'s evaluation is paused from ``on_train_begin``. Whatever is
  still open closes at the next ``on_step_begin``, ``on_epoch_end`` or ``on_train_end``;
* **DDP's bucket all-reduces**: the Trainer wraps the model in DistributedDataParallel after
  ``on_train_begin``; at the first ``on_step_begin`` the callback registers the collective logger's
  communication hook on the Trainer's ``model_wrapped`` (with the logger on), so a straggler's
  peers' wait in the buckets is recorded as waiting, not computing.

The callback finds the Trainer that runs it at ``on_train_begin`` (the caller of the event) and
wraps those two methods on that instance, passing every call through unchanged (and calls
``Monitor.gradients_ready()`` as ``_clip_grad_norm`` begins, so the per-layer gradient norms are
taken before clipping too); it unwraps them at ``on_train_end``. ``TrainhealthCallback.attach(trainer, ...)`` (or ``trainer=``) names the Trainer
explicitly. Driven without a Trainer, it falls back to the model's outputs for loss and tokens and
to the ``grad_norm`` in the logs of the steps that log (see :class:`TrainhealthCallback`).

Each ``train()`` gets its own Monitor (the previous one is closed first, freeing its port), so a
callback reused for a second ``train()`` exports again. Keyword arguments are Monitor settings
(``flops_per_token=...``, ``prometheus_port=...``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainhealth._internal.integrations._versions import require

require("transformers")

from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import SaveStrategy

from trainhealth._internal.exporters.monitor import Monitor
from trainhealth._internal.integrations._callers import calling_instance
from trainhealth._internal.integrations._capture import ForwardCapture
from trainhealth._internal.integrations._ddp import instrument
from trainhealth._internal.integrations._pauses import CHECKPOINT, EVALUATION, Pauses, patch_method

__all__ = ["TrainhealthCallback"]


class TrainhealthCallback(TrainerCallback):
    """Export the Trainer's loss, pre-clip gradient norm, learning rate, tokens and checkpoints.

    ``monitor`` is the Monitor of the current (or last) ``train()``. Without a Trainer to read from
    (events sent by something else), the loss and tokens come from the model's forward outputs and
    the gradient norm from ``logs["grad_norm"]`` of the steps that log; the other steps carry no
    Trainer gradient norm.
    """

    def __init__(self, trainer: Any = None, **monitor_settings: Any) -> None:
        self.monitor_settings = monitor_settings
        self.monitor: Monitor | None = None
        self._trainer = trainer
        self._taps: _TrainerTaps | None = None
        self._capture: ForwardCapture | None = None
        self._deferred: tuple[Any, int | None, int] | None = None
        self._running: Any = None  # the Trainer of the current train()
        self._ddp_pending = False  # whether the first on_step_begin is still to look for the DDP wrapper
        self._pauses: Pauses | None = None  # the checkpoint saves and evaluations announced (Monitor.pause)
        self._save_may_follow = False  # the open evaluation is the training loop's: a "best" save may follow

    @classmethod
    def attach(cls, trainer: Any, **monitor_settings: Any) -> TrainhealthCallback:
        """Create a callback reading from ``trainer`` and add it to ``trainer``'s callbacks."""
        callback = cls(trainer=trainer, **monitor_settings)
        trainer.add_callback(callback)
        return callback

    def on_train_begin(
        self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None, **kwargs: Any
    ) -> None:
        self._finish()  # a train() that raised never reached on_train_end
        trainer = _running_trainer() or self._trainer
        self.monitor = Monitor(model, optimizer, **self.monitor_settings)
        self._running = trainer
        comm = self.monitor.comm
        if comm is not None:  # the rows before the first marker (global_step + 1) carry its number
            comm.step = int(state.global_step) + 1
            self._ddp_pending = trainer is not None
        if trainer is not None:
            self._taps = _TrainerTaps(trainer, self.monitor)
        else:
            self._capture = ForwardCapture(model)
        self._pauses = Pauses(self.monitor)
        if getattr(args, "eval_on_start", False):  # the Trainer evaluates right after this event
            self._pauses.open(EVALUATION)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._pauses is not None:  # a save that never reported, a "best" save that did not happen
            self._pauses.close()
        if self._ddp_pending and self.monitor is not None:  # the Trainer has wrapped the model by now
            self._ddp_pending = False
            instrument(self.monitor, getattr(self._running, "model_wrapped", None))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        monitor = self.monitor
        if monitor is None:
            return
        if self._taps is not None:
            loss, tokens, grad_norm = self._taps.take()
            monitor.step(loss=loss, tokens=tokens, grad_norm=grad_norm, step=state.global_step)
        elif self._capture is not None:
            self._step_deferred(None)
            scale = args.world_size if getattr(args, "average_tokens_across_devices", False) else 1
            loss, tokens = self._capture.take(normalised_scale=scale)
            if control.should_log:  # the Trainer logs this step next: its grad_norm comes with on_log
                self._deferred = (loss, tokens, state.global_step)
            else:
                monitor.step(loss=loss, tokens=tokens, step=state.global_step)
        self._announce(control)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._announce(control)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The evaluation ended; the save the Trainer makes next (if any) begins."""
        pauses = self._pauses
        if pauses is None or self.monitor is None:
            return
        pauses.close(EVALUATION)
        # the handler cleared should_evaluate, not should_save; "best" decides after this event
        if control.should_save or (self._save_may_follow and args.save_strategy == SaveStrategy.BEST):
            pauses.open(CHECKPOINT)
        self._save_may_follow = False

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self._step_deferred((logs or {}).get("grad_norm"))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._pauses is not None:
            self._pauses.close()
        if self.monitor is not None:
            self.monitor.checkpoint_saved(state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._finish()

    def _announce(self, control: Any) -> None:
        """After ``DefaultFlowCallback`` set the flags (``on_step_end``, ``on_epoch_end``): the pause of what the
        Trainer does next, the evaluation (the save follows it, from ``on_evaluate``), else the save."""
        pauses = self._pauses
        if pauses is None or self.monitor is None:
            return
        pauses.close()
        self._save_may_follow = bool(control.should_evaluate)
        if control.should_evaluate:
            pauses.open(EVALUATION)
        elif control.should_save:
            pauses.open(CHECKPOINT)

    def _step_deferred(self, grad_norm: Any) -> None:
        deferred, self._deferred = self._deferred, None
        if deferred is not None and self.monitor is not None:
            loss, tokens, step = deferred
            self.monitor.step(loss=loss, tokens=tokens, grad_norm=grad_norm, step=step)

    def _finish(self) -> None:
        """Close the pauses, export a step still waiting for its logs, unwrap the Trainer, close the Monitor."""
        if self._pauses is not None:
            self._pauses.end()
            self._pauses = None
        self._save_may_follow = False
        self._step_deferred(None)
        if self._taps is not None:
            self._taps.close()
            self._taps = None
        if self._capture is not None:
            self._capture.close()
            self._capture = None
        if self.monitor is not None:
            self.monitor.close()
        self._running = None
        self._ddp_pending = False


def _running_trainer() -> Any:
    """The nearest ``transformers.Trainer`` among the callers (the one sending the event), else ``None``."""
    return calling_instance(Trainer, 16)


class _TrainerTaps:
    """Wraps two methods of one Trainer instance to keep what they return, each call passed through unchanged.

    ``training_step`` returns the micro-batch loss the Trainer adds to the loss it logs, and sees the
    inputs (tokens); ``_get_grad_norm`` returns the gradient norm it logs (before clipping). Without
    ``_get_grad_norm``, ``accelerator.clip_grad_norm_`` (which returns the pre-clip norm) is wrapped.
    """

    def __init__(self, trainer: Any, monitor: Monitor) -> None:
        self._store = monitor.store
        self._input_name = getattr(trainer.model, "main_input_name", "input_ids") or "input_ids"
        self._loss: Any = None
        self._tokens = 0
        self._grad_norm: Any = None
        self._restores: list[Callable[[], None]] = []
        self._wrap(trainer, "training_step", self._micro_batch)
        if callable(getattr(trainer, "_get_grad_norm", None)):
            self._wrap(trainer, "_get_grad_norm", self._norm)
        elif callable(getattr(getattr(trainer, "accelerator", None), "clip_grad_norm_", None)):
            self._wrap(trainer.accelerator, "clip_grad_norm_", self._norm)
        if callable(getattr(trainer, "_clip_grad_norm", None)):  # per-layer statistics before clipping too
            self._wrap(trainer, "_clip_grad_norm", None, before=monitor.gradients_ready)

    def take(self) -> tuple[Any, int | None, Any]:
        """The optimizer step's loss, tokens and gradient norm; resets them."""
        taken = self._loss, self._tokens or None, self._grad_norm
        self._loss, self._tokens, self._grad_norm = None, 0, None
        return taken

    def close(self) -> None:
        for restore in reversed(self._restores):
            restore()
        self._restores = []

    def _micro_batch(self, result: Any, args: tuple, kwargs: dict) -> None:
        inputs: Any = args[1] if len(args) > 1 else kwargs.get("inputs")
        ids: Any = inputs.get(self._input_name) if hasattr(inputs, "get") else None
        if hasattr(ids, "numel"):
            self._tokens += int(ids.numel())
        if result is not None:
            loss = result.detach() if hasattr(result, "detach") else result
            self._loss = loss if self._loss is None else self._loss + loss

    def _norm(self, result: Any, args: tuple, kwargs: dict) -> None:
        self._grad_norm = result

    def _wrap(
        self,
        owner: Any,
        name: str,
        observe: Callable[[Any, tuple, dict], None] | None,
        before: Callable[[], None] | None = None,
    ) -> None:
        store = self._store

        def observed(original: Callable[..., Any]) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                if before is not None:
                    before()  # never raises
                result = original(*args, **kwargs)
                if observe is not None:
                    try:
                        observe(result, args, kwargs)
                    except Exception as exc:  # noqa: BLE001 - never into the training loop
                        store.record_error("monitor", exc)
                return result

            return call

        self._restores.append(patch_method(owner, name, observed))
