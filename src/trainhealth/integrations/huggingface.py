"""A Hugging Face ``transformers`` callback: ``Trainer(..., callbacks=[TrainhealthCallback()])``.

The Monitor is created at ``on_train_begin`` with the Trainer's model and
optimizer; each optimizer step records the mean loss of its micro-batches (taken
from the model's outputs, as device tensors: no extra synchronisation), the
tokens in ``input_ids``, the gradient norm and the step time; saved checkpoints
are reported (``trainhealth_checkpoint_last_step``). Keyword arguments are
Monitor settings (``flops_per_token=...``, ``prometheus_port=...``).
"""

from __future__ import annotations

from typing import Any

from trainhealth.integrations._versions import require

require("transformers")

from transformers import TrainerCallback

from trainhealth.exporters.monitor import Monitor
from trainhealth.integrations._capture import ForwardCapture

__all__ = ["TrainhealthCallback"]


class TrainhealthCallback(TrainerCallback):
    def __init__(self, **monitor_settings: Any) -> None:
        self.monitor_settings = monitor_settings
        self.monitor: Monitor | None = None
        self._capture: ForwardCapture | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> None:
        if self.monitor is None:
            self.monitor = Monitor(model, optimizer, **self.monitor_settings)
            self._capture = ForwardCapture(model)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is None or self._capture is None:
            return
        loss, tokens = self._capture.take()
        self.monitor.step(loss=loss, tokens=tokens, step=state.global_step)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is not None:
            self.monitor.checkpoint_saved(state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._capture is not None:
            self._capture.close()
        if self.monitor is not None:
            self.monitor.close()
