"""Loss and tokens taken from the model's own forward calls, for trainers that do not hand them to callbacks."""

from __future__ import annotations

from typing import Any

__all__ = ["ForwardCapture"]


class ForwardCapture:
    """Hooks on ``model``: each training forward's ``loss`` (a device tensor, never read here) and token count.

    ``take`` returns the step's loss over the micro-batches since the last call (gradient accumulation) and
    the tokens they held, then resets. The loss is their mean, or their sum when the trainer passed
    ``num_items_in_batch`` (transformers then divides each micro-batch's loss by the whole step's token count,
    over every rank when it averages tokens across devices: ``normalised_scale``, the number of ranks, then
    gives the rank's own loss as the trainer computes it).
    """

    def __init__(self, model: Any) -> None:
        self._losses: list[Any] = []
        self._tokens = 0
        self._normalised_per_step = False
        self._handles = [
            model.register_forward_pre_hook(self._count, with_kwargs=True),
            model.register_forward_hook(self._keep),
        ]

    def _count(self, module: Any, args: tuple, kwargs: dict) -> None:
        if not module.training:
            return
        self._normalised_per_step = kwargs.get("num_items_in_batch") is not None
        ids = kwargs.get("input_ids", args[0] if args else None)
        numel = getattr(ids, "numel", None)
        if numel is not None:
            self._tokens += int(numel())

    def _keep(self, module: Any, args: tuple, output: Any) -> None:
        if not module.training:
            return
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if loss is not None:
            self._losses.append(loss.detach())

    def take(self, normalised_scale: float = 1) -> tuple[Any, int | None]:
        losses, tokens = self._losses, self._tokens
        self._losses, self._tokens = [], 0
        if not losses:
            return None, tokens or None
        import torch

        stacked = torch.stack([loss.float() for loss in losses])
        loss = stacked.sum() * normalised_scale if self._normalised_per_step else stacked.mean()
        return loss, tokens or None

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
