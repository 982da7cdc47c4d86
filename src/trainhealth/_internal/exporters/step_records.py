"""What one Monitor step holds: the published :class:`StepStats`, and the records the step path keeps on the way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainhealth._internal.exporters.training.param_stats import UpdateStats
from trainhealth._internal.exporters.training.readout import StepValues

__all__ = ["HookResults", "LayerGroupStats", "PendingStep", "StepStats"]


@dataclass(frozen=True)
class LayerGroupStats:
    """Statistics of one layer group on a heavy-statistics step."""

    name: str
    grad_norm: float | None
    param_norm: float | None
    update_ratio: float | None


@dataclass(frozen=True)
class StepStats:
    """What the Monitor recorded for one step, once its device values were read."""

    step: int
    loss: float | None
    grad_norm: float | None
    duration_s: float | None
    tokens: int | None
    tokens_per_second: float | None
    mfu: float | None
    #: By parameter group; ``None`` for a group whose learning rate could not be read.
    learning_rates: tuple[float | None, ...]
    param_norm: float | None = None
    update_ratio: float | None = None
    update_cosine: float | None = None
    layers: tuple[LayerGroupStats, ...] = ()
    #: ``time.time()`` when the step was recorded.
    wall_time: float | None = None
    #: Signals the detectors do not judge at this step (its time includes a checkpoint save).
    unjudged: tuple[str, ...] = ()


@dataclass
class PendingStep:
    """Host-side facts of a step, waiting for its device values; ``fields`` lays out the read vector."""

    step: int
    index: int
    wall_time: float
    duration_s: float | None
    tokens: int | None
    values: dict[str, float]
    learning_rates: list[float | object | None]
    fields: list[tuple[str, int]]
    unjudged: tuple[str, ...] = ()


@dataclass
class HookResults:
    """Device tensors produced by the optimizer hooks for the step in progress."""

    grad_norm: Any = None
    group_grad_norms: Any = None
    update: UpdateStats | None = None
    #: The learning rates this optimizer step applied, read in its pre-hook (before a scheduler moves them).
    learning_rates: list[float | object | None] | None = None
    lr_values: StepValues | None = None
