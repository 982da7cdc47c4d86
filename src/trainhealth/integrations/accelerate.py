"""An Accelerate tracker: ``Accelerator(log_with=[TrainhealthTracker(model, optimizer)])``.

Every ``accelerator.log({...}, step=...)`` becomes one Monitor step on every
rank (``main_process_only`` is off: each rank exports its own series): the
values ``loss``, ``grad_norm`` and ``tokens`` are used when present; with the
model and optimizer the Monitor also measures gradient and update norms.
Keyword arguments are Monitor settings.
"""

from __future__ import annotations

from typing import Any

from trainhealth.integrations._versions import require

require("accelerate")

from accelerate.tracking import GeneralTracker

from trainhealth.exporters.monitor import Monitor

__all__ = ["TrainhealthTracker"]


class TrainhealthTracker(GeneralTracker):
    name = "trainhealth"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, model: Any = None, optimizer: Any = None, **monitor_settings: Any) -> None:
        super().__init__()
        self.monitor = Monitor(model, optimizer, **monitor_settings)

    @property
    def tracker(self) -> Monitor:
        return self.monitor

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        return  # hyperparameters are not metrics

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.monitor.step(loss=values.get("loss"), tokens=values.get("tokens"), grad_norm=values.get("grad_norm"),
                          step=step)

    def finish(self) -> None:
        self.monitor.close()
