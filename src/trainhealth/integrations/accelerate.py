"""An Accelerate tracker: ``Accelerator(log_with=[TrainhealthTracker()])`` (docs/integrations.md)."""

from trainhealth._internal.integrations.accelerate import TrainhealthTracker

__all__ = ["TrainhealthTracker"]
