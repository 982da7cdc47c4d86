"""An Accelerate tracker: ``Accelerator(log_with=[TrainhealthTracker(model, optimizer)])``, then ``init_trackers``.

Create the tracker on every rank, before ``Accelerator(...)``, with the model and
optimizer you will ``prepare``: each rank's Monitor hooks that optimizer (Accelerate's
wrapper steps it only at the end of a gradient-accumulation cycle, on every rank at once),
reading the learning rate each step applies and running the cross-replica checks there.

``accelerator.init_trackers(...)`` is required (without it ``accelerator.log`` has no
tracker to call) and, like ``accelerator.log``, runs on the main process only. So
``accelerator.log({...}, step=...)`` becomes one Monitor step on rank 0, exporting the
values logged: ``loss``, ``grad_norm`` (log what ``accelerator.clip_grad_norm_`` returns,
the norm before clipping; without it the Monitor computes the norm of the gradients the
optimizer receives) and ``tokens``; the learning rate per parameter group is the one the
optimizer applied. ``accelerator.end_training()`` closes it (the last export).

On the other ranks the Monitor still hooks the optimizer, serves /metrics and samples the
GPU, but records no step unless the loop calls ``tracker.log(values, step=step)`` itself
(it runs on any rank): that rank then exports its own loss, tokens and gradient norm.
Their Monitor closes at ``tracker.finish()`` or at interpreter exit.
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
    """One Monitor per rank, stepped by ``log``; ``tracker`` (and ``monitor``) is the Monitor."""

    name = "trainhealth"
    requires_logging_directory = False
    # Accelerator.init_trackers, .log and .get_tracker run on the main process whatever this says;
    # it only keeps Accelerate from gating this tracker's own methods, so ``tracker.log`` works on any rank.
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
        """One Monitor step from ``values``' ``loss``, ``grad_norm`` and ``tokens`` (each optional)."""
        self.monitor.step(loss=values.get("loss"), tokens=values.get("tokens"), grad_norm=values.get("grad_norm"),
                          step=step)

    def finish(self) -> None:
        self.monitor.close()
