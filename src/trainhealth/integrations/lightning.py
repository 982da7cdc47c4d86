"""A Lightning callback: ``Trainer(..., callbacks=[TrainhealthCallback()])`` (docs/integrations.md)."""

from trainhealth._internal.integrations.lightning import TrainhealthCallback

__all__ = ["TrainhealthCallback"]
