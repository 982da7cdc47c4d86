"""A Hugging Face ``transformers`` callback: ``Trainer(..., callbacks=[TrainhealthCallback()])``.

The loss, the pre-clip gradient norm, the learning rate and the tokens are taken where the Trainer
computes them, so they equal what it logs (docs/integrations.md).
"""

from trainhealth._internal.integrations.huggingface import TrainhealthCallback

__all__ = ["TrainhealthCallback"]
