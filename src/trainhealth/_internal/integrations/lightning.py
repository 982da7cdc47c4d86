"""A PyTorch Lightning callback: ``Trainer(callbacks=[TrainhealthCallback()])``.

The Monitor is created when training starts, with the LightningModule and its first
optimizer, and records one step per optimizer step, labelled ``trainer.global_step``
after that step (Lightning's loggers label the same step ``global_step - 1``). Each value
is taken where the trainer computes it:

* the gradient norm is the total 2-norm of the gradients of the parameters the optimizer
  steps, taken in ``on_before_optimizer_step``, which Lightning calls after backward (and
  after unscaling, with mixed precision) but *before* it clips the gradients: the norm
  before ``gradient_clip_val``, as a device tensor;
* the learning rate is the one that optimizer step applied (the Monitor reads it in the
  optimizer's step pre-hook, before a per-step scheduler moves it);
* the loss is the mean of the losses ``training_step`` returned for the micro-batches of
  the step, as the module computed them: Lightning divides the loss it back-propagates
  (and hands to ``on_train_batch_end``) by ``accumulate_grad_batches``, and the callback
  multiplies that back. With ``accumulate_grad_batches=1`` it is the value
  ``self.log("train_loss", loss)`` sends to the loggers; with accumulation the loggers get
  the last micro-batch's loss, the Monitor the mean over the step's micro-batches;
* ``tokens_per_batch(batch)`` counts a batch's tokens: the step reports the sum over its
  micro-batches, for throughput and MFU.

An optimizer step is detected by ``trainer.global_step`` changing, so the step Lightning
takes on an epoch's last batch when the batch count is not a multiple of
``accumulate_grad_batches`` is recorded too, with that step's own micro-batches. Under
DDP every rank records its own values under its own rank label. Checkpoints are
reported (``on_save_checkpoint``). Other keyword arguments are Monitor settings.

Checkpoint saves and validation are announced as pauses (``Monitor.pause("checkpoint")``,
``Monitor.pause("evaluation")``), on every rank (each runs both), so that neither a rank nor its
peers waiting for it count as hung meanwhile:

* a save is ``Trainer.save_checkpoint`` (what ``ModelCheckpoint`` and the other checkpoint callbacks
  call, on every rank: it builds the checkpoint, has the strategy write it, then waits in a barrier).
  Lightning calls no callback hook when it ends, and ``on_save_checkpoint`` not at all for a
  weights-only save, so from ``on_train_start`` to the end of training the callback wraps that method
  of the running Trainer instance: each call passes through unchanged, inside the pause;
* an evaluation runs from ``on_validation_start`` to ``on_validation_end`` (sanity checking comes
  before ``on_train_start`` and is not announced). A validation that never reaches its end closes
  at the next ``on_train_batch_start``, at ``on_train_end`` or at ``on_exception``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainhealth._internal.integrations._versions import require

require("lightning")

from lightning.pytorch.callbacks import Callback

from trainhealth._internal.exporters.monitor import Monitor
from trainhealth._internal.integrations._pauses import CHECKPOINT, EVALUATION, Pauses

__all__ = ["TrainhealthCallback"]


class TrainhealthCallback(Callback):
    def __init__(self, tokens_per_batch: Callable[[Any], int] | None = None, **monitor_settings: Any) -> None:
        self.tokens_per_batch = tokens_per_batch
        self.monitor_settings = monitor_settings
        self.monitor: Monitor | None = None
        self._monitor_closed = False
        self._losses: list[Any] = []
        self._tokens = 0
        self._grad_norms: dict[int, Any] = {}  # by optimizer: the pre-clip norms of this step
        self._last_global_step: int | None = None
        self._pauses: Pauses | None = None  # the saves and validations announced (Monitor.pause)

    # --- lifecycle ------------------------------------------------------------------
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is None or self._monitor_closed:
            optimizer = trainer.optimizers[0] if trainer.optimizers else None
            self.monitor = Monitor(pl_module, optimizer, **self.monitor_settings)
            self._monitor_closed = False
        self._last_global_step = trainer.global_step
        self._start_window()
        if self._pauses is not None:
            self._pauses.end()
        self._pauses = Pauses(self.monitor)
        self._pauses.around(trainer, "save_checkpoint", CHECKPOINT)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        # Lightning zeroes the gradients on an epoch's first batch: micro-batches of an unfinished
        # accumulation window (training stopped mid-window) never reach an optimizer step
        self._start_window()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close()

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        if self.monitor is not None and not self._monitor_closed:
            self.monitor.checkpoint_saved(trainer.global_step)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self._pauses is not None:
            self._pauses.open(EVALUATION)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self._pauses is not None:
            self._pauses.close(EVALUATION)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self._pauses is not None:  # a validation that never reached on_validation_end
            self._pauses.close()

    # --- the step -------------------------------------------------------------------
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        """After backward, before Lightning clips: the total gradient norm the optimizer step starts from."""
        if self.monitor is None or self._monitor_closed:
            return
        if optimizer is (trainer.optimizers[0] if trainer.optimizers else None):
            self.monitor.gradients_ready()  # the per-layer statistics of this step, before clipping too
        try:
            import torch

            grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            if grads:
                self._grad_norms[id(optimizer)] = torch.nn.utils.get_total_norm(grads, 2.0).detach()
        except Exception as exc:  # never into the training loop: the Monitor's optimizer hook takes over
            self.monitor.store.record_error("grad_norm", exc)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        monitor = self.monitor
        if monitor is None or self._monitor_closed:
            return
        try:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if loss is not None and hasattr(loss, "detach"):
                # automatic optimization divides the loss by accumulate_grad_batches; undo it
                scale = trainer.accumulate_grad_batches if getattr(pl_module, "automatic_optimization", True) else 1
                loss = loss.detach().float()
                self._losses.append(loss * scale if scale != 1 else loss)
            if self.tokens_per_batch is not None:
                self._tokens += int(self.tokens_per_batch(batch))
        except Exception as exc:
            monitor.store.record_error("monitor", exc)
        step = trainer.global_step
        if step == self._last_global_step:  # still accumulating: no optimizer step on this batch
            return
        self._last_global_step = step
        grad_norm = None
        mean = None
        try:
            import torch

            mean = torch.stack(self._losses).mean() if self._losses else None
            norms = list(self._grad_norms.values())
            if len(norms) == 1:
                grad_norm = norms[0]
            elif norms:  # several optimizers stepped (manual optimization): the norm over all their parameters
                grad_norm = torch.stack([n.float() for n in norms]).square().sum().sqrt()
        except Exception as exc:
            monitor.store.record_error("monitor", exc)
        tokens = self._tokens if self.tokens_per_batch is not None else None
        self._start_window()
        monitor.step(loss=mean, tokens=tokens, grad_norm=grad_norm, step=step)

    # --- helpers --------------------------------------------------------------------
    def _start_window(self) -> None:
        self._losses, self._tokens, self._grad_norms = [], 0, {}

    def _close(self) -> None:
        if self._pauses is not None:
            self._pauses.end()
            self._pauses = None
        if self.monitor is not None and not self._monitor_closed:
            self._monitor_closed = True
            self.monitor.close()
