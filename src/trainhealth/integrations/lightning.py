"""A PyTorch Lightning callback: ``Trainer(callbacks=[TrainhealthCallback()])``.

The Monitor is created when training starts, with the LightningModule and its
first optimizer; every optimizer step (after ``accumulate_grad_batches``
micro-batches) records the loss ``training_step`` returned (mean over the
micro-batches, as device tensors), the step time and the gradient norm;
checkpoints are reported. ``tokens_per_batch(batch)`` may count a batch's
tokens for throughput and MFU. Other keyword arguments are Monitor settings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainhealth.integrations._versions import require

require("lightning")

from lightning.pytorch.callbacks import Callback

from trainhealth.exporters.monitor import Monitor

__all__ = ["TrainhealthCallback"]


class TrainhealthCallback(Callback):
    def __init__(self, tokens_per_batch: Callable[[Any], int] | None = None, **monitor_settings: Any) -> None:
        self.tokens_per_batch = tokens_per_batch
        self.monitor_settings = monitor_settings
        self.monitor: Monitor | None = None
        self._losses: list[Any] = []
        self._tokens = 0

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is None:
            optimizer = trainer.optimizers[0] if trainer.optimizers else None
            self.monitor = Monitor(pl_module, optimizer, **self.monitor_settings)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.monitor is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self._losses.append(loss.detach().float())
        if self.tokens_per_batch is not None:
            self._tokens += int(self.tokens_per_batch(batch))
        if (batch_idx + 1) % max(1, trainer.accumulate_grad_batches) != 0:
            return
        import torch

        mean = torch.stack(self._losses).mean() if self._losses else None
        tokens = self._tokens if self.tokens_per_batch is not None else None
        self._losses, self._tokens = [], 0
        self.monitor.step(loss=mean, tokens=tokens, step=trainer.global_step)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        if self.monitor is not None:
            self.monitor.checkpoint_saved(trainer.global_step)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is not None:
            self.monitor.close()
